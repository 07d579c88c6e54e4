//! Wall-clock time for logs and the `Date` field: RFC 3339 and IMF-fixdate written without a date library, and per-shard caches that reformat once a second.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (a vDSO call, no syscall).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Seconds since the epoch from the coarse clock: cheaper than `unix_ms`,
/// a few milliseconds behind at most, which a one-second cache does not see.
pub fn coarse_unix_secs() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    if rc == 0 && ts.tv_sec >= 0 {
        ts.tv_sec as u64
    } else {
        unix_ms() / 1000
    }
}

/// A UTC calendar time.
#[derive(Debug, PartialEq, Eq)]
struct Civil {
    year: u32,
    month: u32,
    day: u32,
    hour: u32,
    min: u32,
    sec: u32,
    /// 0 = Sunday.
    weekday: u32,
}

/// Unix seconds to the proleptic Gregorian calendar (Howard Hinnant's
/// `civil_from_days`, exact for every day after 1970).
fn civil(secs: u64) -> Civil {
    let days = secs / 86_400;
    let rem = (secs % 86_400) as u32;
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = (yoe + era * 400 + u64::from(month <= 2)) as u32;
    Civil {
        year,
        month,
        day,
        hour: rem / 3600,
        min: rem / 60 % 60,
        sec: rem % 60,
        // 1970-01-01 was a Thursday.
        weekday: ((days + 4) % 7) as u32,
    }
}

fn put2(out: &mut [u8], at: usize, v: u32) {
    out[at] = b'0' + (v / 10 % 10) as u8;
    out[at + 1] = b'0' + (v % 10) as u8;
}

fn put4(out: &mut [u8], at: usize, v: u32) {
    put2(out, at, v / 100);
    put2(out, at + 2, v % 100);
}

/// `YYYY-MM-DDTHH:MM:SS` (RFC 3339 §5.6 without fraction and offset).
pub fn rfc3339_secs(secs: u64) -> [u8; 19] {
    let c = civil(secs);
    let mut o = *b"0000-00-00T00:00:00";
    put4(&mut o, 0, c.year);
    put2(&mut o, 5, c.month);
    put2(&mut o, 8, c.day);
    put2(&mut o, 11, c.hour);
    put2(&mut o, 14, c.min);
    put2(&mut o, 17, c.sec);
    o
}

/// The IMF-fixdate of RFC 9110 §5.6.7, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn imf_fixdate(secs: u64) -> [u8; 29] {
    const DAYS: [&[u8; 3]; 7] = [b"Sun", b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat"];
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let c = civil(secs);
    let mut o = *b"Ddd, 00 Mmm 0000 00:00:00 GMT";
    o[..3].copy_from_slice(DAYS[c.weekday as usize]);
    put2(&mut o, 5, c.day);
    o[8..11].copy_from_slice(MONTHS[c.month as usize - 1]);
    put4(&mut o, 12, c.year);
    put2(&mut o, 17, c.hour);
    put2(&mut o, 20, c.min);
    put2(&mut o, 23, c.sec);
    o
}

/// Appends `YYYY-MM-DDTHH:MM:SS.mmmZ` for `unix_ms`, reusing the formatted
/// second from `cache` when it is the same second.
pub fn write_rfc3339_ms(out: &mut Vec<u8>, unix_ms: u64, cache: &SecondCache) {
    out.extend_from_slice(&cache.get(unix_ms / 1000));
    let ms = (unix_ms % 1000) as u32;
    let mut frac = *b".000Z";
    frac[1] = b'0' + (ms / 100) as u8;
    put2(&mut frac, 2, ms % 100);
    out.extend_from_slice(&frac);
}

/// The formatted RFC 3339 second of the last timestamp written: log lines
/// from one shard mostly fall in the same second.
pub struct SecondCache {
    secs: Cell<u64>,
    text: Cell<[u8; 19]>,
}

impl Default for SecondCache {
    fn default() -> Self {
        SecondCache::new()
    }
}

impl SecondCache {
    pub const fn new() -> SecondCache {
        SecondCache {
            secs: Cell::new(0),
            text: Cell::new(*b"1970-01-01T00:00:00"),
        }
    }

    fn get(&self, secs: u64) -> [u8; 19] {
        if self.secs.get() != secs {
            self.secs.set(secs);
            self.text.set(rfc3339_secs(secs));
        }
        self.text.get()
    }
}

/// A shard's `Date` field value, reformatted at most once a second. The
/// shard's tick calls [`DateCache::refresh`]; [`DateCache::value`] also
/// notices a new second itself, so a cache nobody ticks is never stale.
pub struct DateCache {
    secs: Cell<u64>,
    value: Cell<[u8; 29]>,
}

impl Default for DateCache {
    fn default() -> Self {
        DateCache::new()
    }
}

impl DateCache {
    pub const fn new() -> DateCache {
        DateCache {
            secs: Cell::new(0),
            value: Cell::new(*b"Thu, 01 Jan 1970 00:00:00 GMT"),
        }
    }

    /// Reformats if `secs` is a new second.
    pub fn refresh(&self, secs: u64) {
        if self.secs.get() != secs {
            self.secs.set(secs);
            self.value.set(imf_fixdate(secs));
        }
    }

    /// The value for now.
    pub fn value(&self) -> [u8; 29] {
        self.refresh(coarse_unix_secs());
        self.value.get()
    }
}

thread_local! {
    /// The `Date` cache of the shard running on this thread.
    static SHARD_DATE: DateCache = const { DateCache::new() };
}

/// The current `Date` value from this thread's (this shard's) cache.
pub fn shard_date() -> [u8; 29] {
    SHARD_DATE.with(DateCache::value)
}

/// Refreshes this thread's `Date` cache; the shard tick may call it so the
/// request path finds the second already formatted.
pub fn tick_shard_date() {
    SHARD_DATE.with(|d| d.refresh(coarse_unix_secs()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_matches_known_instants() {
        // RFC 9110 §5.6.7's example.
        assert_eq!(&imf_fixdate(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&rfc3339_secs(0), b"1970-01-01T00:00:00");
        // A leap day and the last second of a century leap year.
        assert_eq!(&rfc3339_secs(951_782_400), b"2000-02-29T00:00:00");
        assert_eq!(&rfc3339_secs(978_307_199), b"2000-12-31T23:59:59");
        assert_eq!(
            &imf_fixdate(1_798_761_600),
            b"Fri, 01 Jan 2027 00:00:00 GMT"
        );
        let mut out = Vec::new();
        let cache = SecondCache::new();
        write_rfc3339_ms(&mut out, 1_798_761_600_007, &cache);
        write_rfc3339_ms(&mut out, 1_798_761_600_999, &cache);
        assert_eq!(out, b"2027-01-01T00:00:00.007Z2027-01-01T00:00:00.999Z");
    }

    #[test]
    fn every_day_round_trips_through_the_calendar() {
        // Walk 1970..2100 day by day against a naive day counter.
        let (mut y, mut m, mut d) = (1970u32, 1u32, 1u32);
        let leap =
            |y: u32| (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
        for day in 0..47_482u64 {
            let c = civil(day * 86_400 + 3_723);
            assert_eq!((c.year, c.month, c.day), (y, m, d), "day {day}");
            assert_eq!((c.hour, c.min, c.sec), (1, 2, 3));
            let len = match m {
                2 if leap(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            d += 1;
            if d > len {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }

    #[test]
    fn date_cache_follows_the_second() {
        let d = DateCache::new();
        d.refresh(784_111_777);
        assert_eq!(&d.value.get(), b"Sun, 06 Nov 1994 08:49:37 GMT");
        // value() notices that the cached second is not now.
        let before = coarse_unix_secs();
        let now = d.value();
        let after = coarse_unix_secs();
        assert!(now == imf_fixdate(before) || now == imf_fixdate(after));
    }
}
