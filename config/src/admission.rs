//! The admission controls' modes (issue 22): rate-limit scope, key and headers, the overflow rule, and the fleet's Redis sync.

use serde::{Deserialize, Serialize};

/// What a rate-limit bucket is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RateKey {
    /// The client identity: IPv4 /32 or IPv6 /64, after a PROXY header.
    #[default]
    Address,
    /// The value of this request header field, hashed into the same table; a request
    /// without the field is keyed by its address. JSON: `{"header": "x-api-key"}`.
    Header(String),
}

/// Where a rate limit is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateScope {
    /// This process's shared table only (the default).
    #[default]
    Box,
    /// This process's table, debited with what the other processes of the fleet spent
    /// (read from the top-level `fleet` Redis every `fleet.sync_ms`).
    Fleet,
}

/// Which rate-limit response header fields a listener writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum RateHeaders {
    /// `RateLimit-Policy` and `RateLimit` as in draft-ietf-httpapi-ratelimit-headers-11.
    #[serde(rename = "draft-11")]
    Draft11,
}

/// `limits.rate_limit_overflow`: what happens to an identity that finds no slot in the
/// rate table within its probe window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitOverflow {
    /// Admit it and count `zgix_l7_rate_limit_full` (the default).
    #[default]
    FailOpen,
    /// Such identities share one bucket with the listener's rate.
    Shared,
}

/// Default `fleet.sync_ms`: ten exchanges a second keep the overshoot near a tenth of a
/// second of the fleet's rate while costing Redis one pipeline per box per 100 ms.
pub const DEFAULT_FLEET_SYNC_MS: u64 = 100;
/// Shortest accepted `fleet.sync_ms`.
pub const MIN_FLEET_SYNC_MS: u64 = 10;
/// Longest accepted `fleet.sync_ms`: past a minute the sync no longer limits a rate.
pub const MAX_FLEET_SYNC_MS: u64 = 60_000;
/// Default `fleet.timeout_ms`: half a sync period, so a slow Redis never delays the next.
pub const DEFAULT_FLEET_TIMEOUT_MS: u64 = 50;
/// Default `fleet.prefix`.
pub const DEFAULT_FLEET_PREFIX: &str = "zgix";
/// Longest `fleet.prefix`.
pub const MAX_FLEET_PREFIX_BYTES: usize = 64;
/// Longest `rate_limit.key.header` name.
pub const MAX_RATE_KEY_HEADER_BYTES: usize = 128;

/// The Redis every process of a fleet shares its rate-limit spending through.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    /// `host:port` of the Redis server.
    pub redis: String,
    /// How often the sync thread exchanges deltas with Redis.
    #[serde(default = "d_sync_ms")]
    pub sync_ms: u64,
    /// Deadline of one exchange (connect, write, read); past it the sync counts a
    /// timeout and the local limit alone applies until the next.
    #[serde(default = "d_timeout_ms")]
    pub timeout_ms: u64,
    /// First part of every Redis key: `prefix:listener:identity:window`.
    #[serde(default = "d_prefix")]
    pub prefix: String,
}

fn d_sync_ms() -> u64 {
    DEFAULT_FLEET_SYNC_MS
}
fn d_timeout_ms() -> u64 {
    DEFAULT_FLEET_TIMEOUT_MS
}
fn d_prefix() -> String {
    DEFAULT_FLEET_PREFIX.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_the_issue_gives_them() {
        let k: RateKey = serde_json::from_str("\"address\"").unwrap();
        assert_eq!(k, RateKey::Address);
        let k: RateKey = serde_json::from_str(r#"{"header": "x-api-key"}"#).unwrap();
        assert_eq!(k, RateKey::Header("x-api-key".into()));
        assert!(serde_json::from_str::<RateKey>("\"cookie\"").is_err());
        let s: RateScope = serde_json::from_str("\"fleet\"").unwrap();
        assert_eq!(s, RateScope::Fleet);
        let h: RateHeaders = serde_json::from_str("\"draft-11\"").unwrap();
        assert_eq!(h, RateHeaders::Draft11);
        let o: RateLimitOverflow = serde_json::from_str("\"shared\"").unwrap();
        assert_eq!(o, RateLimitOverflow::Shared);
        let f: Fleet = serde_json::from_str(r#"{"redis": "127.0.0.1:6379"}"#).unwrap();
        assert_eq!(
            (f.sync_ms, f.timeout_ms, f.prefix.as_str()),
            (100, 50, "zgix")
        );
    }
}
