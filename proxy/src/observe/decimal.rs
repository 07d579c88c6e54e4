//! Integers as decimal text on the per-request paths (forwarded heads, the access log), written with `itoa` instead of `core::fmt` (BENCHMARKS.md: ~650–970 fewer instructions per request).

/// `n` in decimal, appended to `out`.
pub fn decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::decimal;

    #[test]
    fn writes_what_display_writes() {
        for n in [0, 7, 10, 99, 100, 65_535, 1 << 40, u64::MAX] {
            let mut out = b"x".to_vec();
            decimal(&mut out, n);
            assert_eq!(out, format!("x{n}").into_bytes());
        }
    }
}
