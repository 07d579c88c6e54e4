//! The `io` section: which socket driver a shard runs on and how its receive buffers are sized.

use serde::{Deserialize, Serialize};

/// Receive buffers per shard in the io_uring provided-buffer ring: 256 of
/// [`DEFAULT_RECV_BUFFER_BYTES`] is 4 MiB of address space per shard, touched
/// only as data arrives. A buffer is held from the moment the kernel fills it
/// until the connection copies it out (at once when its task runs), so the
/// count bounds bytes received but not yet handled, not connections.
pub const DEFAULT_RECV_BUFFERS: u32 = 256;
/// 16 KiB per receive buffer: one TCP read of a typical request or response
/// chunk on loopback or a 10G link fits in one.
pub const DEFAULT_RECV_BUFFER_BYTES: u32 = 16 << 10;
/// Fewest and most receive buffers (the kernel wants a power of two, at most 32768).
pub const MIN_RECV_BUFFERS: u32 = 16;
/// See [`MIN_RECV_BUFFERS`].
pub const MAX_RECV_BUFFERS: u32 = 32768;
/// Smallest and largest receive buffer.
pub const MIN_RECV_BUFFER_BYTES: u32 = 1024;
/// See [`MIN_RECV_BUFFER_BYTES`].
pub const MAX_RECV_BUFFER_BYTES: u32 = 1 << 20;
/// Most request states (buffers and parsed heads) a shard keeps for reuse
/// once a request completes; more are freed. Within this bound the pool
/// follows demand: once a second it keeps what the last second's peak of
/// requests in flight needs and frees the rest. 1024 is about 16 MiB
/// resident at most per shard (a state touches a few pages).
pub const DEFAULT_IDLE_EXCHANGES: usize = 1024;
/// Most request states kept for reuse per shard.
pub const MAX_IDLE_EXCHANGES: usize = 65536;

/// Which mechanism moves a shard's socket bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IoDriver {
    /// zgix's own io_uring ring per shard (multishot accept and receive into a
    /// provided-buffer ring, batched sends). Falls back to `epoll` with one log
    /// line when the kernel or a seccomp policy refuses the ring.
    #[default]
    Uring,
    /// Non-blocking syscalls on readiness from an edge-triggered epoll set.
    Epoll,
}

/// The `io` section. Every field is optional in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Io {
    /// The socket driver.
    #[serde(default)]
    pub driver: IoDriver,
    /// Buffers in each shard's provided-buffer ring (`uring` only); a power of two.
    #[serde(default = "d_recv_buffers")]
    pub recv_buffers: u32,
    /// Bytes per receive buffer (`uring` only).
    #[serde(default = "d_recv_buffer_bytes")]
    pub recv_buffer_bytes: u32,
    /// Request states each shard keeps for reuse (both drivers).
    #[serde(default = "d_idle_exchanges")]
    pub idle_exchanges: usize,
}

impl Default for Io {
    fn default() -> Self {
        Io {
            driver: IoDriver::default(),
            recv_buffers: DEFAULT_RECV_BUFFERS,
            recv_buffer_bytes: DEFAULT_RECV_BUFFER_BYTES,
            idle_exchanges: DEFAULT_IDLE_EXCHANGES,
        }
    }
}

fn d_recv_buffers() -> u32 {
    DEFAULT_RECV_BUFFERS
}
fn d_recv_buffer_bytes() -> u32 {
    DEFAULT_RECV_BUFFER_BYTES
}
fn d_idle_exchanges() -> usize {
    DEFAULT_IDLE_EXCHANGES
}
