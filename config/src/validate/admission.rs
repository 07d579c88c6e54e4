//! Validation of the admission modes: rate-limit key and scope, and the `fleet` section.

use super::{is_token, Validator};
use crate::admission::{
    RateKey, RateScope, MAX_FLEET_PREFIX_BYTES, MAX_FLEET_SYNC_MS, MAX_RATE_KEY_HEADER_BYTES,
    MIN_FLEET_SYNC_MS,
};
use crate::model::RateLimit;

impl Validator<'_> {
    /// The fields of `rate_limit` beyond the bucket's three numbers.
    pub(super) fn rate_limit_modes(&mut self, path: &str, rl: &RateLimit) {
        if let RateKey::Header(name) = &rl.key {
            if !is_token(name) || name.len() > MAX_RATE_KEY_HEADER_BYTES {
                self.err(
                    format!("{path}.key.header"),
                    format!(
                        "must be a header field name (RFC 9110 §5.1 token) of 1..={MAX_RATE_KEY_HEADER_BYTES} bytes, got {name:?}"
                    ),
                );
            }
        }
        if rl.scope == RateScope::Fleet && self.config.fleet.is_none() {
            self.err(
                format!("{path}.scope"),
                "\"fleet\" needs the top-level \"fleet\" section (its Redis)",
            );
        }
    }

    pub(super) fn fleet(&mut self) {
        let Some(f) = &self.config.fleet else { return };
        match f.redis.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {}
            _ => self.err(
                "fleet.redis",
                format!("must be host:port with a port 1..=65535, got {:?}", f.redis),
            ),
        }
        self.range(
            "fleet.sync_ms",
            f.sync_ms,
            MIN_FLEET_SYNC_MS,
            MAX_FLEET_SYNC_MS,
        );
        if f.timeout_ms == 0 || f.timeout_ms > f.sync_ms {
            self.err(
                "fleet.timeout_ms",
                format!(
                    "must be between 1 and fleet.sync_ms ({}), got {}",
                    f.sync_ms, f.timeout_ms
                ),
            );
        }
        let p = &f.prefix;
        if p.is_empty()
            || p.len() > MAX_FLEET_PREFIX_BYTES
            || !p.bytes().all(|b| b.is_ascii_graphic())
        {
            self.err(
                "fleet.prefix",
                format!("must be 1..={MAX_FLEET_PREFIX_BYTES} visible ASCII characters, got {p:?}"),
            );
        }
    }
}
