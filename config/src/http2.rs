//! HTTP/2 from clients on a listener (`listeners[].http2`): stream concurrency, the initial flow-control window, the header-list bound and whether a plain listener accepts the HTTP/2 preface (h2c with prior knowledge, RFC 9113 §3.3).

use serde::{Deserialize, Serialize};

/// Default `max_concurrent_streams`: RFC 9113 §6.5.2 recommends no less than 100; 128 is
/// what nginx's `http2_max_concurrent_streams` and Envoy default to.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 128;
/// Bounds of `max_concurrent_streams`.
pub const MAX_CONCURRENT_STREAMS_LIMIT: u32 = 1024;
/// Default `initial_window_bytes`: the protocol's own initial window (RFC 9113 §6.9.2).
pub const DEFAULT_INITIAL_WINDOW_BYTES: u32 = 65_535;
/// Bounds of `initial_window_bytes`: below a frame's worth a stream crawls; above
/// 16 MiB one stream could make the shard buffer that much.
pub const MIN_INITIAL_WINDOW_BYTES: u32 = 1024;
/// See [`MIN_INITIAL_WINDOW_BYTES`].
pub const MAX_INITIAL_WINDOW_BYTES: u32 = 16 << 20;
/// Default `max_header_list_bytes` (SETTINGS_MAX_HEADER_LIST_SIZE, RFC 9113 §6.5.2).
pub const DEFAULT_MAX_HEADER_LIST_BYTES: u32 = 65_536;
/// Bounds of `max_header_list_bytes`.
pub const MIN_MAX_HEADER_LIST_BYTES: u32 = 1024;
/// See [`MIN_MAX_HEADER_LIST_BYTES`].
pub const MAX_MAX_HEADER_LIST_BYTES: u32 = 1 << 20;

/// `listeners[].http2`; every field has a default, and so has the whole object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Http2 {
    /// Streams a client may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS);
    /// one more is refused with `REFUSED_STREAM`.
    #[serde(default = "default_streams")]
    pub max_concurrent_streams: u32,
    /// The flow-control window zgix gives each stream and the connection.
    #[serde(default = "default_window")]
    pub initial_window_bytes: u32,
    /// The largest decoded header list a request may carry.
    #[serde(default = "default_header_list")]
    pub max_header_list_bytes: u32,
    /// A plain (non-TLS) listener accepts the HTTP/2 connection preface.
    #[serde(default)]
    pub prior_knowledge: bool,
}

impl Default for Http2 {
    fn default() -> Self {
        Http2 {
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            initial_window_bytes: DEFAULT_INITIAL_WINDOW_BYTES,
            max_header_list_bytes: DEFAULT_MAX_HEADER_LIST_BYTES,
            prior_knowledge: false,
        }
    }
}

fn default_streams() -> u32 {
    DEFAULT_MAX_CONCURRENT_STREAMS
}

fn default_window() -> u32 {
    DEFAULT_INITIAL_WINDOW_BYTES
}

fn default_header_list() -> u32 {
    DEFAULT_MAX_HEADER_LIST_BYTES
}
