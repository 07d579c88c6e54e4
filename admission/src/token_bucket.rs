//! Token-bucket arithmetic in fixed-point microtokens: continuous refill, burst cap, retry-after; shared by the atomic table and the plain `TokenBucket`.

/// Fixed-point scale: one token is a million microtokens.
///
/// The slot table packs the token count into 50 bits of a 64-bit control word next to a
/// 13-bit generation (see `rate_table.rs`), so a bucket holds at most 2^50 - 1
/// microtokens: [`MAX_BURST`] = 1_125_899_906 tokens, above the 10^9 the config allows.
/// Nanotokens would need 60 bits and leave 3 for the generation. Precision is not lost
/// to the coarser unit: time not yet converted to a whole microtoken stays on the
/// bucket's clock (the refill stamp advances only by the time actually paid out,
/// rounded up to the nanosecond), so the only rounding is under one nanosecond of
/// refill per check, and never in the client's favour.
pub const MICROTOKENS_PER_TOKEN: u64 = 1_000_000;

/// Largest token count a bucket can hold (bits available in the slot's control word).
pub(crate) const TOKEN_MAX: u64 = (1 << 50) - 1;

/// Largest usable `burst`; larger values are clamped to it.
pub const MAX_BURST: u64 = TOKEN_MAX / MICROTOKENS_PER_TOKEN;

const NS_PER_MS: u128 = 1_000_000;
const NS_PER_SEC: u128 = 1_000_000_000;

/// A listener's `rate_limit`: `requests` tokens every `window_ms`, at most `burst` saved.
///
/// The config validates all three as at least 1; the table clamps zeros to 1 (and
/// `burst` to [`MAX_BURST`]) rather than divide by zero.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RateParams {
    pub requests: u64,
    pub window_ms: u64,
    pub burst: u64,
}

/// The answer to one rate check.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RateDecision {
    /// A token was taken.
    Allowed,
    /// No whole token; `retry_after_secs` is the time until one accrues, rounded up to
    /// whole seconds, at least 1 (the `Retry-After` value).
    Limited { retry_after_secs: u64 },
    /// No slot within the probe window: the caller admits (fails open) and counts
    /// `zgix_l7_rate_limit_full`.
    TableFull,
}

/// `RateParams` converted to fixed point: capacity in microtokens and the refill rate as
/// the exact fraction `num / den` microtokens per nanosecond.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Rate {
    pub(crate) cap: u64,
    num: u128,
    den: u128,
}

/// `floor(a * b / c)`, saturating at `u128::MAX` when the product overflows. The common
/// case (product and divisor within 64 bits) takes a 64-bit division: a 128-bit
/// division is a libcall several times slower.
#[inline]
fn mul_div_floor(a: u128, b: u128, c: u128) -> u128 {
    match a.checked_mul(b) {
        Some(p) if p <= u128::from(u64::MAX) && c <= u128::from(u64::MAX) => {
            u128::from(p as u64 / c as u64)
        }
        Some(p) => p / c,
        None => u128::MAX,
    }
}

/// `ceil(a * b / c)`, saturating like [`mul_div_floor`].
#[inline]
fn mul_div_ceil(a: u128, b: u128, c: u128) -> u128 {
    match a.checked_mul(b) {
        Some(p) if p <= u128::from(u64::MAX) && c <= u128::from(u64::MAX) => {
            u128::from((p as u64).div_ceil(c as u64))
        }
        Some(p) => p.div_ceil(c),
        None => u128::MAX,
    }
}

/// `a * b >= c * d` without dividing (or overflowing: an overflowed product is larger
/// than any that fits).
#[inline]
fn product_at_least(a: u128, b: u128, c: u128, d: u128) -> bool {
    match (a.checked_mul(b), c.checked_mul(d)) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(x), Some(y)) => x >= y,
    }
}

#[inline]
fn sat_u64(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

impl Rate {
    #[inline]
    pub(crate) fn new(p: RateParams) -> Self {
        let burst = p.burst.clamp(1, MAX_BURST);
        Rate {
            cap: burst * MICROTOKENS_PER_TOKEN,
            num: u128::from(p.requests.max(1)) * u128::from(MICROTOKENS_PER_TOKEN),
            den: u128::from(p.window_ms.max(1)) * NS_PER_MS,
        }
    }

    /// Refill owed to a bucket holding `tokens` whose clock reads `stamp`, at `now`.
    ///
    /// Returns `(grant, new_stamp)`: at most `cap` microtokens, and the stamp advanced by
    /// exactly the time the grant pays for (rounded up, so never past `now`), keeping the
    /// fraction of a microtoken still owed on the bucket's clock. A bucket that reaches
    /// its cap moves its stamp to `now`, because time spent full earns nothing. A clock
    /// that has not moved or has gone backwards grants nothing and keeps the stamp.
    #[inline]
    pub(crate) fn refill(&self, tokens: u64, stamp: u64, now: u64) -> (u64, u64) {
        if now <= stamp {
            return (0, stamp);
        }
        if tokens >= self.cap {
            return (0, now);
        }
        let dt = u128::from(now - stamp);
        let room = u128::from(self.cap - tokens);
        // Long idle is the common case for a returning client: decide "refilled to the
        // cap" by multiplying, so only a partial refill pays for a division.
        if product_at_least(dt, self.num, room, self.den) {
            let owed = mul_div_floor(dt, self.num, self.den);
            return (sat_u64(owed).min(self.cap), now);
        }
        let owed = mul_div_floor(dt, self.num, self.den);
        if owed == 0 {
            return (0, stamp);
        }
        // owed * den <= dt * num, which did not overflow, so this cannot either, and the
        // time paid for is at most dt.
        let paid = sat_u64(mul_div_ceil(owed, self.den, self.num));
        (owed as u64, stamp + paid)
    }

    /// Has a bucket holding `tokens` at `stamp` refilled to the cap by `now`?
    #[inline]
    pub(crate) fn is_refilled(&self, tokens: u64, stamp: u64, now: u64) -> bool {
        let room = u128::from(self.cap.saturating_sub(tokens));
        let dt = u128::from(now.saturating_sub(stamp));
        product_at_least(dt, self.num, room, self.den)
    }

    /// Tokens a bucket would hold at `now` (capped).
    #[cfg(test)]
    pub(crate) fn projected(&self, tokens: u64, stamp: u64, now: u64) -> u64 {
        let dt = u128::from(now.saturating_sub(stamp));
        let owed = sat_u64(mul_div_floor(dt, self.num, self.den));
        tokens.saturating_add(owed).min(self.cap)
    }

    /// Deposit `grant` into a bucket holding `tokens`, then try to take one token.
    /// Returns the new token count and the decision.
    #[inline]
    pub(crate) fn settle(&self, tokens: u64, grant: u64) -> (u64, RateDecision) {
        let filled = tokens.saturating_add(grant).min(self.cap);
        if filled >= MICROTOKENS_PER_TOKEN {
            (filled - MICROTOKENS_PER_TOKEN, RateDecision::Allowed)
        } else {
            let retry_after_secs = self.retry_after_secs(filled);
            (filled, RateDecision::Limited { retry_after_secs })
        }
    }

    /// Whole seconds until a bucket holding `tokens` (< 1 token) has one token, at least 1.
    #[inline]
    pub(crate) fn retry_after_secs(&self, tokens: u64) -> u64 {
        let missing = u128::from(MICROTOKENS_PER_TOKEN.saturating_sub(tokens));
        let ns = mul_div_ceil(missing, self.den, self.num);
        sat_u64(ns.div_ceil(NS_PER_SEC)).max(1)
    }

    /// Nanoseconds the bucket takes to earn `micro` microtokens (rounded up).
    #[inline]
    pub(crate) fn ns_for(&self, micro: u64) -> u64 {
        sat_u64(mul_div_ceil(u128::from(micro), self.den, self.num))
    }

    /// When a bucket holding `tokens` at `now` will be full again, if nothing takes from it.
    #[inline]
    pub(crate) fn full_at(&self, tokens: u64, now: u64) -> u64 {
        let missing = u128::from(self.cap.saturating_sub(tokens));
        now.saturating_add(sat_u64(mul_div_ceil(missing, self.den, self.num)))
    }
}

/// A single-owner token bucket with the same arithmetic as [`crate::RateTable`]: for
/// shard-local use, tests, and the `Mutex<HashMap>` baseline in the benchmark.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    tokens: u64,
    stamp: u64,
}

impl TokenBucket {
    /// A full bucket (a client never seen before has its whole burst).
    pub fn full(p: RateParams, now_ns: u64) -> Self {
        TokenBucket {
            tokens: Rate::new(p).cap,
            stamp: now_ns,
        }
    }

    /// Refill to `now_ns` and take one token if there is a whole one.
    pub fn check(&mut self, p: RateParams, now_ns: u64) -> RateDecision {
        let rate = Rate::new(p);
        let (grant, stamp) = rate.refill(self.tokens, self.stamp, now_ns);
        let (tokens, decision) = rate.settle(self.tokens, grant);
        self.tokens = tokens;
        self.stamp = stamp;
        decision
    }

    /// Tokens held, in microtokens, as of the last check.
    pub fn microtokens(&self) -> u64 {
        self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RateDecision::*;

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000_000_000;

    fn p(requests: u64, window_ms: u64, burst: u64) -> RateParams {
        RateParams {
            requests,
            window_ms,
            burst,
        }
    }

    /// Checks at `now` until the first refusal; returns how many were allowed.
    fn drain(b: &mut TokenBucket, p: RateParams, now: u64) -> u64 {
        let mut n = 0;
        while b.check(p, now) == Allowed {
            n += 1;
            assert!(n <= 10_000_000, "bucket never ran dry");
        }
        n
    }

    #[test]
    fn burst_then_refill_at_the_configured_rate() {
        let p = p(100, 1000, 200); // 100/s, burst 200
        let mut b = TokenBucket::full(p, 0);
        assert_eq!(drain(&mut b, p, 0), 200);
        // 10 ms buys exactly one token at 100/s.
        assert!(matches!(b.check(p, 9_999_999), Limited { .. }));
        assert_eq!(b.check(p, 10 * MS), Allowed);
        assert!(matches!(b.check(p, 10 * MS), Limited { .. }));
        // One second buys 100.
        assert_eq!(drain(&mut b, p, SEC + 10 * MS), 100);
    }

    #[test]
    fn refill_is_capped_at_burst() {
        let p = p(100, 1000, 5);
        let mut b = TokenBucket::full(p, 0);
        assert_eq!(drain(&mut b, p, 0), 5);
        // An hour of refill is still only five tokens.
        assert_eq!(drain(&mut b, p, 3600 * SEC), 5);
    }

    #[test]
    fn many_small_steps_lose_no_refill() {
        // 1 per 10 ms is 0.1 microtokens per ns. A check every 7999 ns is owed 799.9
        // microtokens: 799 are paid and the 0.9 stays on the bucket's clock. Dropping
        // it each time would lose 0.11% and push the third token past 30.03 ms; keeping
        // it pays exactly one token per 10 ms. (Burst 5 keeps the bucket below its cap,
        // where overflow is rightly lost.)
        let p = p(1, 10, 5);
        let mut b = TokenBucket::full(p, 0);
        assert_eq!(drain(&mut b, p, 0), 5);
        let mut allowed = 0;
        let mut now = 7999;
        while now < 30 * MS + 7999 {
            if b.check(p, now) == Allowed {
                allowed += 1;
            }
            now += 7999;
        }
        assert_eq!(allowed, 3);
    }

    #[test]
    fn window_of_one_ms_and_a_billion_requests() {
        // 10^12 tokens per second, burst 10^9: nothing may overflow.
        let p = p(1_000_000_000, 1, 1_000_000_000);
        let rate = Rate::new(p);
        assert_eq!(rate.cap, 1_000_000_000 * MICROTOKENS_PER_TOKEN);
        let mut b = TokenBucket::full(p, 0);
        assert_eq!(b.check(p, 0), Allowed);
        // One nanosecond refills 1000 tokens.
        let before = b.microtokens();
        let (grant, stamp) = rate.refill(before - 5000 * MICROTOKENS_PER_TOKEN, 0, 1);
        assert_eq!(grant, 1000 * MICROTOKENS_PER_TOKEN);
        assert_eq!(stamp, 1);
        // An empty bucket refills completely within 1 ms, and time to one token is < 1 s.
        assert_eq!(rate.projected(0, 0, MS), rate.cap);
        assert_eq!(rate.retry_after_secs(0), 1);
        assert_eq!(rate.full_at(0, 5), 5 + MS);
    }

    #[test]
    fn huge_values_saturate_instead_of_overflowing() {
        let p = p(u64::MAX, u64::MAX, u64::MAX);
        let rate = Rate::new(p);
        assert_eq!(rate.cap, MAX_BURST * MICROTOKENS_PER_TOKEN);
        let mut b = TokenBucket::full(p, u64::MAX - 1);
        assert_eq!(b.check(p, u64::MAX), Allowed);
        assert_eq!(rate.refill(0, 0, u64::MAX).0, rate.cap);
        // One request per u64::MAX ms: retry-after saturates rather than wrapping.
        let slow = Rate::new(RateParams {
            requests: 1,
            window_ms: u64::MAX,
            burst: 1,
        });
        assert_eq!(slow.retry_after_secs(0), u64::MAX / 1000 + 1);
        assert_eq!(slow.full_at(0, 10), u64::MAX);
        // Zeros are clamped to 1 rather than dividing by zero.
        let zero = Rate::new(RateParams {
            requests: 0,
            window_ms: 0,
            burst: 0,
        });
        assert_eq!(zero.cap, MICROTOKENS_PER_TOKEN);
        assert_eq!(zero.retry_after_secs(0), 1);
    }

    #[test]
    fn clock_not_moving_refills_nothing() {
        let p = p(1000, 1, 3);
        let mut b = TokenBucket::full(p, 42);
        assert_eq!(drain(&mut b, p, 42), 3);
        for _ in 0..100 {
            assert!(matches!(b.check(p, 42), Limited { .. }));
        }
    }

    #[test]
    fn clock_going_backwards_refills_nothing_and_does_not_panic() {
        let p = p(1, 1000, 2);
        let mut b = TokenBucket::full(p, 10 * SEC);
        assert_eq!(drain(&mut b, p, 10 * SEC), 2);
        assert!(matches!(b.check(p, 0), Limited { .. }));
        assert!(matches!(b.check(p, 5 * SEC), Limited { .. }));
        // The bucket's clock did not move back: one second after the real stamp pays one.
        assert!(matches!(b.check(p, 10 * SEC + SEC - 1), Limited { .. }));
        assert_eq!(b.check(p, 11 * SEC), Allowed);
    }

    #[test]
    fn long_idle_makes_the_bucket_full_again() {
        let p = p(10, 1000, 20);
        let mut b = TokenBucket::full(p, 0);
        assert_eq!(drain(&mut b, p, 0), 20);
        assert_eq!(drain(&mut b, p, 86_400 * SEC), 20);
        let rate = Rate::new(p);
        assert_eq!(rate.full_at(0, 0), 2 * SEC);
        assert_eq!(rate.projected(0, 0, 2 * SEC - 1), rate.cap - 1);
        assert_eq!(rate.projected(0, 0, 2 * SEC), rate.cap);
        assert!(!rate.is_refilled(0, 0, 2 * SEC - 1));
        assert!(rate.is_refilled(0, 0, 2 * SEC));
        assert!(rate.is_refilled(rate.cap, 5, 0)); // full stays full, even backwards
        assert!(!rate.is_refilled(0, 5, 0));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        // One token every 2.5 s.
        let p = p(2, 5000, 1);
        let mut b = TokenBucket::full(p, 0);
        assert_eq!(b.check(p, 0), Allowed);
        assert_eq!(
            b.check(p, 0),
            Limited {
                retry_after_secs: 3
            }
        );
        assert_eq!(
            b.check(p, SEC / 2),
            Limited {
                retry_after_secs: 2
            }
        ); // 2.0 s left
        assert_eq!(
            b.check(p, SEC / 2 + 1),
            Limited {
                retry_after_secs: 2
            }
        ); // 1.99.. s
        assert_eq!(
            b.check(p, 2 * SEC),
            Limited {
                retry_after_secs: 1
            }
        ); // 0.5 s
        assert_eq!(
            b.check(p, 2 * SEC + SEC / 2 - 1),
            Limited {
                retry_after_secs: 1
            }
        );
        assert_eq!(b.check(p, 2 * SEC + SEC / 2), Allowed);
        // Fast rates still say 1, never 0.
        let fast = p_fast();
        let mut f = TokenBucket::full(fast, 0);
        assert_eq!(f.check(fast, 0), Allowed);
        assert_eq!(
            f.check(fast, 0),
            Limited {
                retry_after_secs: 1
            }
        );
    }

    fn p_fast() -> RateParams {
        p(1000, 1, 1)
    }
}
