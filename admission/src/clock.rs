//! `monotonic_now_ns`: the nanosecond clock callers pass to the rate table.

use std::sync::OnceLock;
use std::time::Instant;

static BASE: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds of `CLOCK_MONOTONIC` (via [`Instant`]) since a process-wide base taken on
/// the first call. Every shard reads the same base, so values from different cores are
/// comparable; a `u64` of nanoseconds lasts 584 years of uptime.
#[inline]
pub fn monotonic_now_ns() -> u64 {
    monotonic_ns_at(Instant::now())
}

/// [`monotonic_now_ns`] for an instant the caller already read, so a request
/// path that times itself does not read the clock twice. Instants before the
/// base count as 0.
#[inline]
pub fn monotonic_ns_at(t: Instant) -> u64 {
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_goes_backwards() {
        let mut last = monotonic_now_ns();
        for _ in 0..1000 {
            let now = monotonic_now_ns();
            assert!(now >= last);
            last = now;
        }
    }

    #[test]
    fn an_instant_read_earlier_maps_to_the_same_scale() {
        let before = monotonic_now_ns();
        let t = Instant::now();
        let at = monotonic_ns_at(t);
        let after = monotonic_now_ns();
        assert!(before <= at && at <= after, "{before} {at} {after}");
        assert_eq!(monotonic_ns_at(t), at, "same instant, same value");
    }
}
