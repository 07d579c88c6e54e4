//! The RateLimit-Policy and RateLimit response fields of draft-ietf-httpapi-ratelimit-headers-11, written without allocating and spliced into a head already written.

use std::io::Write as _;

use zgix_admission::RateParams;

/// Room a request's two fields need at most: a 64-byte listener name escaped to at
/// most 128 bytes, twice, plus two 20-digit integers per field and the punctuation.
pub const FIELDS_CAPACITY: usize = 512;

/// The policy's name as an sf-string (RFC 8941 §3.3.3): printable ASCII, `"` and `\`
/// escaped; any other byte (a listener name is not limited to ASCII) becomes `?`.
fn sf_string(out: &mut Vec<u8>, name: &str) {
    out.push(b'"');
    for b in name.bytes() {
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            0x20..=0x7e => out.push(b),
            _ => out.push(b'?'),
        }
    }
    out.push(b'"');
}

/// What a listener's fields start with, built once at load:
/// `RateLimit-Policy: "<name>";q=<burst>;w=<window s>` and the start of
/// `RateLimit: "<name>";r=`. The window is in whole seconds, rounded up (the draft's
/// `w` is an integer); `pk` (a partition key) is omitted, as the issue says.
pub fn prefix(name: &str, p: RateParams) -> Box<[u8]> {
    let mut out = Vec::with_capacity(FIELDS_CAPACITY);
    out.extend_from_slice(b"RateLimit-Policy: ");
    sf_string(&mut out, name);
    let w = p.window_ms.div_ceil(1000).max(1);
    let _ = write!(out, ";q={};w={w}\r\nRateLimit: ", p.burst);
    sf_string(&mut out, name);
    out.extend_from_slice(b";r=");
    out.into_boxed_slice()
}

/// Writes a request's two fields into `out` (cleared first; its capacity is
/// [`FIELDS_CAPACITY`], so nothing is allocated): `r` tokens remaining, `t` seconds
/// until the next token.
pub fn write(out: &mut Vec<u8>, prefix: &[u8], remaining: u64, next_token_secs: u64) {
    out.clear();
    out.extend_from_slice(prefix);
    let _ = write!(out, "{remaining};t={next_token_secs}\r\n");
}

/// Inserts `fields` (whole field lines) at the end of the head that starts `out`:
/// before the blank line ending the first `\r\n\r\n`. Bytes after the head (a body
/// already appended) move along. No-op when `fields` is empty or `out` holds no
/// complete head. Allocates only if `out` lacks the capacity.
pub fn insert(out: &mut Vec<u8>, fields: &[u8]) {
    if fields.is_empty() {
        return;
    }
    let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") else {
        return;
    };
    let at = end + 2;
    let old = out.len();
    out.resize(old + fields.len(), 0);
    out.copy_within(at..old, at + fields.len());
    out[at..at + fields.len()].copy_from_slice(fields);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_as_the_draft_writes_them() {
        let p = RateParams {
            requests: 100,
            window_ms: 1000,
            burst: 200,
        };
        let pre = prefix("pub\"lic", p);
        let mut f = Vec::with_capacity(FIELDS_CAPACITY);
        write(&mut f, &pre, 57, 1);
        assert_eq!(
            String::from_utf8(f.clone()).unwrap(),
            "RateLimit-Policy: \"pub\\\"lic\";q=200;w=1\r\nRateLimit: \"pub\\\"lic\";r=57;t=1\r\n"
        );
        let mut out = b"HTTP/1.1 200 OK\r\na: b\r\n\r\nbody".to_vec();
        insert(&mut out, &f);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!(
                "HTTP/1.1 200 OK\r\na: b\r\n{}\r\nbody",
                String::from_utf8(f).unwrap()
            )
        );
        let p = RateParams {
            window_ms: 1500,
            ..p
        };
        assert!(String::from_utf8(prefix("x\u{e9}", p).to_vec())
            .unwrap()
            .starts_with("RateLimit-Policy: \"x??\";q=200;w=2\r\n"));
    }

    #[test]
    fn insert_needs_a_whole_head() {
        let mut out = b"HTTP/1.1 200 OK\r\n".to_vec();
        insert(&mut out, b"x: y\r\n");
        assert_eq!(out, b"HTTP/1.1 200 OK\r\n");
    }
}
