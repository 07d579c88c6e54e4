//! zgix: a thread-per-core io_uring HTTP/1.1 edge proxy.
//!
//! # The shard model
//!
//! zgix runs one glommio executor per configured CPU, pinned to it: a *shard*.
//! Each shard binds every listener itself with `SO_REUSEPORT`, so the kernel
//! spreads new connections over the shards and no connection ever moves between
//! cores. A shard owns, with no locks and no sharing:
//!
//! - its listening sockets and every connection accepted on them;
//! - each connection's parser state and buffers, made once per connection and
//!   reused for every request on it (the request path allocates nothing);
//! - its upstream keep-alive pool, bounded per endpoint;
//! - its counters, which only it writes (the admin endpoint sums them on read).
//!
//! The only mutable state shared between shards is the admission tables
//! ([`zgix_admission::RateTable`], [`zgix_admission::ConnTable`]): fixed-size
//! arrays of atomic slots, sized once at load, so a client's rate bucket and
//! connection count are global while the hot path never allocates and never
//! locks. Everything else shared ([`runtime::Runtime`]) is read-only after load.
//!
//! # Locked memory
//!
//! io_uring rings and glommio's registered buffers live in locked memory. Each
//! shard asks for [`shard::IO_MEMORY`] bytes; with the common 8 MiB
//! `RLIMIT_MEMLOCK` that fits a handful of shards. Raise `ulimit -l` (systemd:
//! `LimitMEMLOCK=`) for more.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod access_log;
pub mod admin;
pub mod alloc;
pub mod cli;
pub mod clock;
pub mod conn;
pub mod decision;
pub mod engine_metrics;
pub mod filters;
pub mod generation;
pub mod health;
pub mod instance;
pub mod io;
pub mod lb;
pub mod lifecycle;
pub mod log;
pub mod metrics;
pub mod pool;
pub mod resolve;
pub mod respond;
pub mod runtime;
pub mod server;
pub mod shard;
pub mod signals;
pub mod upstream_metrics;
pub mod wire;
