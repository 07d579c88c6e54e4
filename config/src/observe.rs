//! Observability settings in the config: the access log and the `Server` header (the accessors that read them, `Config::server_header` and `Config::listener_names`, are in model.rs).

use serde::{Deserialize, Serialize};

/// The product name zgix puts in `Server` when `server_header` is absent.
pub const DEFAULT_SERVER_HEADER: &str = "zgix";
/// Longest `listeners[].name`: it is a metric label value and a log field.
pub const MAX_LISTENER_NAME_BYTES: usize = 64;
/// Default per-shard access-log buffer: 256 KiB holds about 1,500 lines of
/// ~170 bytes, i.e. 150 ms of a shard at 10k requests/s if the writer stalls.
pub const DEFAULT_ACCESS_LOG_BUFFER_BYTES: usize = 256 << 10;
/// Smallest buffer: room for a few lines, so a test can fill it on purpose.
pub const MIN_ACCESS_LOG_BUFFER_BYTES: usize = 512;
/// Largest buffer: 64 MiB per shard.
pub const MAX_ACCESS_LOG_BUFFER_BYTES: usize = 64 << 20;

/// `access_log`: where request lines go and in which format.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLog {
    /// A file path (opened for append, created if missing) or `-` for stdout.
    pub path: String,
    /// `text` (one space-separated line, combined-log style) or `json`.
    #[serde(default)]
    pub format: AccessLogFormat,
    /// Whether the raw query string is logged (`false` drops it).
    #[serde(default = "default_query")]
    pub query: bool,
    /// Bytes of lines each shard may hold before the writer thread drains
    /// them; a line that does not fit is dropped and counted.
    #[serde(default = "default_buffer_bytes")]
    pub buffer_bytes: usize,
}

fn default_query() -> bool {
    true
}

fn default_buffer_bytes() -> usize {
    DEFAULT_ACCESS_LOG_BUFFER_BYTES
}

/// Access-log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFormat {
    /// Space-separated fields, strings quoted and escaped.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `server_header`: a product string, or `false` for no `Server` field.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ServerHeader {
    /// The field value, e.g. `"zgix"`.
    Name(String),
    /// `false` sends no `Server` field; `true` sends the default.
    Enabled(bool),
}
