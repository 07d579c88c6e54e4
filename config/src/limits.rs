//! Global size and time limits: `DEFAULT_*` values, accepted bounds, and the `Limits` struct.
//!
//! This is the one definition of every limit and its default: the request parser
//! (`zgix-parser`) has none of its own and gets its limits from
//! [`Limits::request_limits`]. Where the parser has a structural cap (its stack
//! array of header slots) the accepted bound here is that cap, so a file that
//! asks for more is refused rather than clamped.

use serde::{Deserialize, Serialize};

/// One KiB.
const KIB: usize = 1024;
/// One MiB.
const MIB: usize = 1024 * 1024;

/// 8 KiB request line: the figure RFC 9112 §3 recommends supporting at
/// minimum, and what nginx (`large_client_header_buffers`) and Apache accept.
pub const DEFAULT_MAX_REQUEST_LINE: usize = 8 * KIB;
/// Shortest accepted `max_request_line`: below 64 bytes ordinary API paths fail.
pub const MIN_MAX_REQUEST_LINE: usize = 64;
/// Longest accepted `max_request_line`: longer URLs are abuse, not traffic.
pub const MAX_MAX_REQUEST_LINE: usize = 64 * KIB;

/// 32 KiB head: room for large cookies and tracing headers while a slowloris
/// client still pins only 32 KiB per connection.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 32 * KIB;
/// Largest accepted `max_header_bytes`.
pub const MAX_MAX_HEADER_BYTES: usize = MIB;

/// 100 header fields, hyper's default: real browsers send 10-30, and each
/// field costs a 20-byte slot reserved in every connection's request head.
pub const DEFAULT_MAX_HEADERS: usize = 100;
/// Most accepted `max_headers`: the parser's cap, [`zgix_parser::MAX_HEADERS_CAP`]
/// (256). It parses into a stack array of that many slots, so a larger value
/// could not take effect.
pub const MAX_MAX_HEADERS: usize = zgix_parser::MAX_HEADERS_CAP;
const _: () = assert!(DEFAULT_MAX_HEADERS <= MAX_MAX_HEADERS);

/// 1 GiB body: large uploads pass, while a runaway or hostile stream stops.
/// Bodies are streamed, so this costs no memory.
pub const DEFAULT_MAX_REQUEST_BODY: u64 = 1024 * 1024 * 1024;

/// 64 KiB response head: origins set more cookies than clients send; past this
/// the origin is misbehaving and the client gets 502.
pub const DEFAULT_MAX_RESPONSE_HEADER_BYTES: usize = 64 * KIB;
/// Smallest accepted `max_response_header_bytes`: a status line plus a few headers.
pub const MIN_MAX_RESPONSE_HEADER_BYTES: usize = KIB;
/// Largest accepted `max_response_header_bytes`.
pub const MAX_MAX_RESPONSE_HEADER_BYTES: usize = MIB;

/// 16 KiB per direction: four pages, so one `recv`/`send` moves about eleven
/// 1460-byte segments (syscall cost amortised), while 10 000 connections hold
/// only about 320 MiB of buffers.
pub const DEFAULT_BUFFER_BYTES: usize = 16 * KIB;
/// Smallest accepted `buffer_bytes`: below 1 KiB syscall overhead dominates.
pub const MIN_BUFFER_BYTES: usize = KIB;
/// Largest accepted `buffer_bytes`.
pub const MAX_BUFFER_BYTES: usize = MIB;

/// 10 s for the whole request head: generous for a mobile client, short enough
/// that a slowloris client trickling bytes is cut off.
pub const DEFAULT_CLIENT_HEADER_TIMEOUT_MS: u64 = 10_000;
/// 60 s keep-alive idle: matches common load balancer idle timeouts, so zgix
/// is not the side that closes a connection a client is about to reuse.
pub const DEFAULT_CLIENT_IDLE_TIMEOUT_MS: u64 = 60_000;
/// 30 s between body reads: a stalled upload is abandoned, a slow one is not.
pub const DEFAULT_CLIENT_BODY_TIMEOUT_MS: u64 = 30_000;
/// 3 s to connect: a healthy origin on the same network answers a SYN in
/// milliseconds; three seconds also covers one lost SYN (1 s initial RTO).
pub const DEFAULT_UPSTREAM_CONNECT_TIMEOUT_MS: u64 = 3_000;
/// 30 s to the first response head: the origin may think that long.
pub const DEFAULT_UPSTREAM_HEADER_TIMEOUT_MS: u64 = 30_000;
/// 60 s gap while streaming a response, and lifetime of an idle pooled
/// connection: shorter than nginx's 75 s `keepalive_timeout`, so zgix usually
/// retires a pooled connection before the origin closes it under a request.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT_MS: u64 = 60_000;
/// At most 1024 idle upstream connections per endpoint per shard. The pool
/// follows the demand below this bound: it keeps what the last second's peak
/// concurrency needed and closes the surplus, so the bound only caps a burst.
/// A fixed 64 churned tens of thousands of connects per 10 s under 200
/// concurrent clients (issue 13); 1024 holds that load with room to spare.
pub const DEFAULT_UPSTREAM_POOL_IDLE_PER_ENDPOINT: usize = 1024;
/// Largest accepted `upstream_pool_idle_per_endpoint`.
pub const MAX_UPSTREAM_POOL_IDLE_PER_ENDPOINT: usize = 65_536;
/// 60 s for an idle pooled connection: shorter than nginx's 75 s
/// `keepalive_timeout`, so zgix usually retires a pooled connection before the
/// origin closes it under a request.
pub const DEFAULT_UPSTREAM_POOL_IDLE_TIMEOUT_MS: u64 = 60_000;
/// 10 s drain on SIGTERM: fits inside the common 30 s orchestrator grace
/// period with room for the process to exit.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 10_000;
/// 3 s for the PROXY header: the load balancer in front sends it at once.
pub const DEFAULT_PROXY_PROTOCOL_TIMEOUT_MS: u64 = 3_000;
/// 500 µs of busy polling after the last socket event: bridges the gap
/// between requests of a loaded shard (so it never pays a sleep and a
/// cross-core wake-up per request) and lets an idle shard sleep quickly.
pub const DEFAULT_BUSY_POLL_US: u64 = 500;
/// Longest accepted `busy_poll_us`: 100 ms.
pub const MAX_BUSY_POLL_US: u64 = 100_000;
/// Shortest accepted timeout.
pub const MIN_TIMEOUT_MS: u64 = 1;
/// Longest accepted timeout: one hour.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// 4096 rate-limit slots: tens of KiB of atomics, enough distinct clients for
/// one window on a typical edge box; a full table fails open and is counted
/// (`zgix_l7_rate_limit_full`), so undersizing is visible, never an outage.
pub const DEFAULT_RATE_LIMIT_ENTRIES: usize = 4096;
/// 4096 connection-limit slots, sized like the rate-limit table.
pub const DEFAULT_CONN_LIMIT_ENTRIES: usize = 4096;
/// Most admission table entries: 2^24 (16 Mi) slots is hundreds of MiB.
pub const MAX_TABLE_ENTRIES: usize = 1 << 24;

/// Descriptors kept back from the connection cap for listeners, rings,
/// eventfds, the admin endpoint and logs.
pub const RESERVED_FDS: usize = 64;
/// Largest accepted `max_connections`.
pub const MAX_CONNECTIONS: usize = 1 << 24;
/// Default idle timeout of an upgraded tunnel: 10 minutes, like a WebSocket
/// that only pings every few minutes.
pub const DEFAULT_TUNNEL_IDLE_TIMEOUT_MS: u64 = 600_000;

/// Global size and time limits. Every field is optional in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Longest request line (method, target, version); past it: 414.
    #[serde(default = "d_max_request_line")]
    pub max_request_line: usize,
    /// Longest request head, request line included; past it: 431.
    #[serde(default = "d_max_header_bytes")]
    pub max_header_bytes: usize,
    /// Most request header fields; past it: 431.
    #[serde(default = "d_max_headers")]
    pub max_headers: usize,
    /// Largest request body; past it: 413.
    #[serde(default = "d_max_request_body")]
    pub max_request_body: u64,
    /// Longest response head from an origin; past it: 502.
    #[serde(default = "d_max_response_header_bytes")]
    pub max_response_header_bytes: usize,
    /// Streaming buffer per direction per connection. The client read buffer
    /// is `max(max_header_bytes, buffer_bytes)`: see [`Limits::client_read_buffer_bytes`].
    #[serde(default = "d_buffer_bytes")]
    pub buffer_bytes: usize,
    /// Deadline for the whole request head, from its first byte.
    #[serde(default = "d_client_header_timeout_ms")]
    pub client_header_timeout_ms: u64,
    /// Keep-alive idle time between requests.
    #[serde(default = "d_client_idle_timeout_ms")]
    pub client_idle_timeout_ms: u64,
    /// Longest gap between body reads from the client.
    #[serde(default = "d_client_body_timeout_ms")]
    pub client_body_timeout_ms: u64,
    /// Upstream connect deadline; past it: 504.
    #[serde(default = "d_upstream_connect_timeout_ms")]
    pub upstream_connect_timeout_ms: u64,
    /// Deadline for the first response head; past it: 504.
    #[serde(default = "d_upstream_header_timeout_ms")]
    pub upstream_header_timeout_ms: u64,
    /// Longest gap while streaming a response body, and how long an idle
    /// pooled upstream connection is kept.
    #[serde(default = "d_upstream_idle_timeout_ms")]
    pub upstream_idle_timeout_ms: u64,
    /// Most idle pooled connections per endpoint per shard (the pool keeps
    /// what recent demand needed, up to this); 0 disables pooling.
    #[serde(default = "d_upstream_pool_idle_per_endpoint")]
    pub upstream_pool_idle_per_endpoint: usize,
    /// How long an idle pooled upstream connection is kept.
    #[serde(default = "d_upstream_pool_idle_timeout_ms")]
    pub upstream_pool_idle_timeout_ms: u64,
    /// On SIGTERM, how long in-flight requests get before connections close.
    #[serde(default = "d_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
    /// Deadline for the PROXY protocol header after accept.
    #[serde(default = "d_proxy_protocol_timeout_ms")]
    pub proxy_protocol_timeout_ms: u64,
    /// Microseconds a shard keeps polling its sockets after the last event
    /// before it sleeps; 0 sleeps at once.
    #[serde(default = "d_busy_poll_us")]
    pub busy_poll_us: u64,
    /// Slots in the shared rate-limit table.
    #[serde(default = "d_rate_limit_entries")]
    pub rate_limit_entries: usize,
    /// Slots in the shared connection-limit table.
    #[serde(default = "d_conn_limit_entries")]
    pub conn_limit_entries: usize,
    /// Most client connections the whole process holds open, split evenly
    /// over the shards; `None` sizes it from the descriptor limit (see
    /// [`Limits::max_connections_for`]).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Idle time after which an upgraded (`101`) tunnel is closed.
    #[serde(default = "d_tunnel_idle_timeout_ms")]
    pub tunnel_idle_timeout_ms: u64,
    /// What an identity that finds no rate-table slot gets: `"fail_open"` or `"shared"`.
    #[serde(default)]
    pub rate_limit_overflow: crate::admission::RateLimitOverflow,
}

impl Limits {
    /// The process-wide connection cap: the configured one, else what the
    /// descriptor limit `nofile` leaves once [`RESERVED_FDS`] are set aside,
    /// halved because a proxied connection also holds an upstream socket.
    pub fn max_connections_for(&self, nofile: u64) -> usize {
        self.max_connections.unwrap_or_else(|| {
            (nofile.saturating_sub(RESERVED_FDS as u64) / 2).clamp(1, MAX_CONNECTIONS as u64)
                as usize
        })
    }

    /// The request parser's limits: line, head, field count and body.
    pub fn request_limits(&self) -> zgix_parser::Limits {
        zgix_parser::Limits {
            max_request_line: self.max_request_line,
            max_header_bytes: self.max_header_bytes,
            max_headers: self.max_headers,
            max_body: self.max_request_body,
        }
    }

    /// Size of the client read buffer: it must hold a whole request head and
    /// also serves as the request-body streaming buffer, so it is the larger of
    /// `max_header_bytes` and `buffer_bytes`.
    pub fn client_read_buffer_bytes(&self) -> usize {
        self.max_header_bytes.max(self.buffer_bytes)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_line: DEFAULT_MAX_REQUEST_LINE,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            max_response_header_bytes: DEFAULT_MAX_RESPONSE_HEADER_BYTES,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            client_header_timeout_ms: DEFAULT_CLIENT_HEADER_TIMEOUT_MS,
            client_idle_timeout_ms: DEFAULT_CLIENT_IDLE_TIMEOUT_MS,
            client_body_timeout_ms: DEFAULT_CLIENT_BODY_TIMEOUT_MS,
            upstream_connect_timeout_ms: DEFAULT_UPSTREAM_CONNECT_TIMEOUT_MS,
            upstream_header_timeout_ms: DEFAULT_UPSTREAM_HEADER_TIMEOUT_MS,
            upstream_idle_timeout_ms: DEFAULT_UPSTREAM_IDLE_TIMEOUT_MS,
            upstream_pool_idle_per_endpoint: DEFAULT_UPSTREAM_POOL_IDLE_PER_ENDPOINT,
            upstream_pool_idle_timeout_ms: DEFAULT_UPSTREAM_POOL_IDLE_TIMEOUT_MS,
            drain_timeout_ms: DEFAULT_DRAIN_TIMEOUT_MS,
            proxy_protocol_timeout_ms: DEFAULT_PROXY_PROTOCOL_TIMEOUT_MS,
            busy_poll_us: DEFAULT_BUSY_POLL_US,
            rate_limit_entries: DEFAULT_RATE_LIMIT_ENTRIES,
            conn_limit_entries: DEFAULT_CONN_LIMIT_ENTRIES,
            max_connections: None,
            tunnel_idle_timeout_ms: DEFAULT_TUNNEL_IDLE_TIMEOUT_MS,
            rate_limit_overflow: Default::default(),
        }
    }
}

// serde's `default = "..."` takes a function path, not a constant.
fn d_max_request_line() -> usize {
    DEFAULT_MAX_REQUEST_LINE
}
fn d_max_header_bytes() -> usize {
    DEFAULT_MAX_HEADER_BYTES
}
fn d_max_headers() -> usize {
    DEFAULT_MAX_HEADERS
}
fn d_max_request_body() -> u64 {
    DEFAULT_MAX_REQUEST_BODY
}
fn d_max_response_header_bytes() -> usize {
    DEFAULT_MAX_RESPONSE_HEADER_BYTES
}
fn d_buffer_bytes() -> usize {
    DEFAULT_BUFFER_BYTES
}
fn d_client_header_timeout_ms() -> u64 {
    DEFAULT_CLIENT_HEADER_TIMEOUT_MS
}
fn d_client_idle_timeout_ms() -> u64 {
    DEFAULT_CLIENT_IDLE_TIMEOUT_MS
}
fn d_client_body_timeout_ms() -> u64 {
    DEFAULT_CLIENT_BODY_TIMEOUT_MS
}
fn d_upstream_connect_timeout_ms() -> u64 {
    DEFAULT_UPSTREAM_CONNECT_TIMEOUT_MS
}
fn d_upstream_header_timeout_ms() -> u64 {
    DEFAULT_UPSTREAM_HEADER_TIMEOUT_MS
}
fn d_upstream_idle_timeout_ms() -> u64 {
    DEFAULT_UPSTREAM_IDLE_TIMEOUT_MS
}
fn d_upstream_pool_idle_per_endpoint() -> usize {
    DEFAULT_UPSTREAM_POOL_IDLE_PER_ENDPOINT
}
fn d_upstream_pool_idle_timeout_ms() -> u64 {
    DEFAULT_UPSTREAM_POOL_IDLE_TIMEOUT_MS
}
fn d_drain_timeout_ms() -> u64 {
    DEFAULT_DRAIN_TIMEOUT_MS
}
fn d_proxy_protocol_timeout_ms() -> u64 {
    DEFAULT_PROXY_PROTOCOL_TIMEOUT_MS
}
fn d_busy_poll_us() -> u64 {
    DEFAULT_BUSY_POLL_US
}
fn d_rate_limit_entries() -> usize {
    DEFAULT_RATE_LIMIT_ENTRIES
}
fn d_conn_limit_entries() -> usize {
    DEFAULT_CONN_LIMIT_ENTRIES
}

fn d_tunnel_idle_timeout_ms() -> u64 {
    DEFAULT_TUNNEL_IDLE_TIMEOUT_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_object_equals_default() {
        let l: Limits = serde_json::from_str("{}").unwrap();
        assert_eq!(l, Limits::default());
        assert_eq!(l.max_request_body, 1 << 30);
    }

    /// Parses `head` as a request against `limits`.
    fn parse(limits: zgix_parser::Limits, head: &str) -> Result<(), zgix_parser::ParseError> {
        let mut h = zgix_parser::RequestHead::new(&limits);
        let r = zgix_parser::RequestParser::new(limits).parse(head.as_bytes(), &mut h)?;
        assert_eq!(r, zgix_parser::Status::Complete(()), "{head:?}");
        Ok(())
    }

    /// A request head of `fields` header fields in all (Host first) and this Content-Length.
    fn request(fields: usize, content_length: u64) -> String {
        let mut r = format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {content_length}\r\n");
        for i in 2..fields {
            r.push_str(&format!("X-{i}: v\r\n"));
        }
        r + "\r\n"
    }

    #[test]
    fn parser_defaults_are_config_defaults() {
        let l = Limits::default().request_limits();
        assert_eq!(l.max_request_line, DEFAULT_MAX_REQUEST_LINE);
        assert_eq!(l.max_header_bytes, DEFAULT_MAX_HEADER_BYTES);
        assert_eq!(l.max_headers, DEFAULT_MAX_HEADERS);
        assert_eq!(l.max_body, DEFAULT_MAX_REQUEST_BODY);
        // In effect, not only as numbers: the parser takes exactly the
        // default field count and body size, and refuses one more.
        assert_eq!(l.header_slots(), DEFAULT_MAX_HEADERS);
        let max_body = DEFAULT_MAX_REQUEST_BODY;
        assert_eq!(parse(l, &request(DEFAULT_MAX_HEADERS, max_body)), Ok(()));
        assert_eq!(
            parse(l, &request(DEFAULT_MAX_HEADERS + 1, 0)),
            Err(zgix_parser::ParseError::HeadersTooLarge)
        );
        assert_eq!(
            parse(l, &request(2, max_body + 1)),
            Err(zgix_parser::ParseError::BodyTooLarge)
        );
    }

    #[test]
    fn most_accepted_max_headers_take_effect() {
        let l = Limits {
            max_headers: MAX_MAX_HEADERS,
            ..Limits::default()
        }
        .request_limits();
        assert_eq!(l.header_slots(), MAX_MAX_HEADERS);
        assert_eq!(parse(l, &request(MAX_MAX_HEADERS, 0)), Ok(()));
        assert_eq!(
            parse(l, &request(MAX_MAX_HEADERS + 1, 0)),
            Err(zgix_parser::ParseError::HeadersTooLarge)
        );
    }

    #[test]
    fn client_read_buffer_is_the_larger() {
        let mut l = Limits::default();
        assert_eq!(l.client_read_buffer_bytes(), 32 * 1024);
        l.buffer_bytes = 64 * 1024;
        assert_eq!(l.client_read_buffer_bytes(), 64 * 1024);
    }
}
