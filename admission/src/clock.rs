//! `monotonic_now_ns`: the nanosecond clock callers pass to the rate table.

use std::sync::OnceLock;
use std::time::Instant;

static BASE: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds of `CLOCK_MONOTONIC` (via [`Instant`]) since a process-wide base taken on
/// the first call. Every shard reads the same base, so values from different cores are
/// comparable; a `u64` of nanoseconds lasts 584 years of uptime.
#[inline]
pub fn monotonic_now_ns() -> u64 {
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
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
}
