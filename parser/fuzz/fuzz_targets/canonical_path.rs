//! Canonical paths: idempotent, no `.`/`..` segment, never above `/`, and equal to a naive reference (decode unreserved triplets, then RFC 3986 §5.2.4 on a segment stack).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zgix_parser::{canonicalize_path, ParseError};

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Decodes pct-encoded unreserved characters; `None` for an encoded `/` or `\`.
fn decode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                let c = h * 16 + l;
                if c == b'/' || c == b'\\' {
                    return None;
                }
                if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                    out.push(c);
                } else {
                    out.extend_from_slice(&raw[i..i + 3]);
                }
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    Some(out)
}

/// The reference: a stack of segments, empty ones dropped, trailing slash kept when the
/// path ends in `/`, `.` or `..`.
fn reference(decoded: &[u8]) -> Vec<u8> {
    let mut stack: Vec<&[u8]> = Vec::new();
    let segments: Vec<&[u8]> = decoded.split(|&b| b == b'/').collect();
    let mut trailing = false;
    for (i, s) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *s {
            b"" | b"." => trailing = last && i > 0,
            b".." => {
                stack.pop();
                trailing = last;
            }
            _ => {
                stack.push(s);
                trailing = false;
            }
        }
    }
    let mut out = vec![b'/'];
    out.extend(stack.join(&b'/'));
    if trailing && !stack.is_empty() {
        out.push(b'/');
    }
    out
}

fuzz_target!(|raw: &[u8]| {
    let mut out = Vec::with_capacity(raw.len() + 1);
    let cap = out.capacity();
    let r = canonicalize_path(raw, &mut out);
    assert_eq!(out.capacity(), cap, "allocated");
    let Some(decoded) = decode(raw) else {
        assert_eq!(r, Err(ParseError::EncodedSlash));
        return;
    };
    assert_eq!(r, Ok(()));
    assert_eq!(out, reference(&decoded), "differs from the reference");
    assert!(out.starts_with(b"/"));
    for seg in out.split(|&b| b == b'/') {
        assert!(seg != b"." && seg != b"..", "dot-segment left");
    }
    // Idempotent where every "%" starts a triplet (as the request parser ensures).
    let complete = raw.iter().enumerate().all(|(i, &b)| {
        b != b'%' || (i + 2 < raw.len() && hex(raw[i + 1]).is_some() && hex(raw[i + 2]).is_some())
    });
    if complete {
        let mut again = Vec::new();
        assert_eq!(canonicalize_path(&out, &mut again), Ok(()));
        assert_eq!(again, out, "not idempotent");
    }
});
