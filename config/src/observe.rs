//! Observability settings in the config: the admin endpoint, the access log and the `Server` header (the accessors that read them, `Config::server_header` and `Config::listener_names`, are in model.rs).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Default `admin.max_connections`: a few scrapers, a status page, an operator.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
/// Largest `admin.max_connections`.
pub const MAX_ADMIN_MAX_CONNECTIONS: usize = 4096;
/// Default `admin.header_timeout_ms`: the whole request head, from the accept.
pub const DEFAULT_ADMIN_HEADER_TIMEOUT_MS: u64 = 5_000;
/// Default `admin.idle_timeout_ms`: the longest one read or write may wait.
pub const DEFAULT_ADMIN_IDLE_TIMEOUT_MS: u64 = 5_000;
/// Bounds of both admin timeouts.
pub const MIN_ADMIN_TIMEOUT_MS: u64 = 100;
/// Upper bound of both admin timeouts: a minute.
pub const MAX_ADMIN_TIMEOUT_MS: u64 = 60_000;
/// Shortest `admin.token`: 16 bytes, so a token cannot be guessed online.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;
/// Longest `admin.token`.
pub const MAX_ADMIN_TOKEN_BYTES: usize = 256;

/// `admin`: the admin endpoint (metrics, readiness, status page, endpoint control).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// Address the admin endpoint listens on.
    pub bind: SocketAddr,
    /// When set, every `POST` needs `Authorization: Bearer <token>`; when
    /// absent, `POST` is refused unless `bind` is a loopback address.
    #[serde(default)]
    pub token: Option<String>,
    /// Admin connections open at once; more wait in the backlog.
    #[serde(default = "default_admin_max_connections")]
    pub max_connections: usize,
    /// The whole request head must arrive within this, from the accept.
    #[serde(default = "default_admin_header_timeout_ms")]
    pub header_timeout_ms: u64,
    /// The longest any one read or write of an admin connection may wait.
    #[serde(default = "default_admin_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
}

fn default_admin_max_connections() -> usize {
    DEFAULT_ADMIN_MAX_CONNECTIONS
}

fn default_admin_header_timeout_ms() -> u64 {
    DEFAULT_ADMIN_HEADER_TIMEOUT_MS
}

fn default_admin_idle_timeout_ms() -> u64 {
    DEFAULT_ADMIN_IDLE_TIMEOUT_MS
}

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
    /// The fields of a line, in order (see [`AccessLogField::parse`]);
    /// absent: the default line, unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
}

/// Most entries of `access_log.fields`.
pub const MAX_ACCESS_LOG_FIELDS: usize = 64;
/// Most fields of `access_log.fields` that capture a request header
/// (`host`, `user_agent`, `referer` and every `header:NAME`).
pub const MAX_ACCESS_LOG_HEADER_FIELDS: usize = 16;
/// Longest header name in `header:NAME`.
pub const MAX_ACCESS_LOG_HEADER_NAME_BYTES: usize = 64;
/// Bytes of a header value kept for the log; the rest is cut.
pub const ACCESS_LOG_HEADER_VALUE_CAP: usize = 512;

/// One field of `access_log.fields`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogField {
    /// A field of the fixed set, by its name (`"status"`).
    Named(&'static str),
    /// A request header's value; `host`, `user_agent` and `referer` are
    /// `Header("host")`, `Header("user-agent")`, `Header("referer")` under
    /// their own names. The name is lowercase.
    Header {
        /// What the field is called in the line (`"host"`, `"header:x-a"`).
        key: String,
        /// The header name, lowercase.
        name: String,
    },
}

/// The fixed field names of `access_log.fields`, in the order docs/config.md lists them.
pub const ACCESS_LOG_FIELD_NAMES: &[&str] = &[
    "time",
    "client",
    "peer",
    "listener",
    "request",
    "method",
    "path",
    "query",
    "protocol",
    "status",
    "bytes_in",
    "bytes_out",
    "duration_ms",
    "upstream_addr",
    "upstream_status",
    "upstream_ms",
    "retries",
    "decision",
    "tls_version",
    "tls_cipher",
    "sni",
    "tls_resumed",
    "request_id",
];

/// The fields that name a request header by a plain name.
const HEADER_ALIASES: &[(&str, &str)] = &[
    ("host", "host"),
    ("user_agent", "user-agent"),
    ("referer", "referer"),
];

impl AccessLogField {
    /// Parses one entry of `access_log.fields`, or says why it is not one.
    pub fn parse(s: &str) -> Result<AccessLogField, String> {
        if let Some(&n) = ACCESS_LOG_FIELD_NAMES.iter().find(|&&n| n == s) {
            return Ok(AccessLogField::Named(n));
        }
        if let Some(&(key, name)) = HEADER_ALIASES.iter().find(|(k, _)| *k == s) {
            return Ok(AccessLogField::Header {
                key: key.into(),
                name: name.into(),
            });
        }
        if let Some(name) = s.strip_prefix("header:") {
            let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if name.is_empty()
                || name.len() > MAX_ACCESS_LOG_HEADER_NAME_BYTES
                || !name.bytes().all(tchar)
            {
                return Err(format!(
                    "\"{s}\": a header name is 1 to {MAX_ACCESS_LOG_HEADER_NAME_BYTES} token characters (RFC 9110 §5.6.2)"
                ));
            }
            let name = name.to_ascii_lowercase();
            // `header:host` is the `host` field under another name.
            let key = HEADER_ALIASES
                .iter()
                .find(|(_, n)| *n == name)
                .map_or_else(|| format!("header:{name}"), |(k, _)| (*k).into());
            return Ok(AccessLogField::Header { key, name });
        }
        Err(format!(
            "unknown field \"{s}\"; the fields are {}, host, user_agent, referer and header:NAME",
            ACCESS_LOG_FIELD_NAMES.join(", ")
        ))
    }

    /// What the field is called in a line; two entries with one key are duplicates.
    pub fn key(&self) -> &str {
        match self {
            AccessLogField::Named(n) => n,
            AccessLogField::Header { key, .. } => key,
        }
    }
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
