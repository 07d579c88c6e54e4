//! Canonical request paths: unreserved characters percent-decoded, dot-segments removed, slashes merged.

use crate::error::ParseError;
use crate::syntax::hex_value;

/// Writes the canonical form of the raw path `raw` (no query) into `out`, which is cleared.
///
/// The canonical path is what routing, request filters and the WAF denylist match, and what
/// zgix forwards, so it must be one fixed spelling per resource an origin would serve:
/// - a pct-encoded unreserved character (ALPHA / DIGIT / `-` `.` `_` `~`) is decoded first:
///   RFC 3986 §6.2.2.2 makes `%61` and `a` equivalent, so `/%61dmin` is `/admin` and
///   `/.%2e/x` is `/../x` before the next step. Every other triplet is kept as sent
///   (hex case included): decoding reserved characters changes what a path means;
/// - an encoded `/` or `\` (`%2F`, `%5C`, either case) is refused with
///   [`ParseError::EncodedSlash`]: an origin that decodes it (or, for `\`, treats it as a
///   separator, as Windows servers do) sees a segment boundary that no prefix rule saw.
///   nginx refuses encoded traversal the same way;
/// - dot-segments are removed as in RFC 3986 §5.2.4, so `/a/./b/../c` is `/a/c` and `..` never
///   climbs above the root (`/..` is `/`); a path ending in `.` or `..` keeps its trailing
///   slash (`/a/b/..` is `/a/`), as §5.2.4 step 2C/2D leaves the output buffer;
/// - runs of `/` are merged (`//a///b` is `/a/b`): most origins map empty segments to nothing,
///   so `//admin` must not dodge a rule written for `/admin`;
/// - case is kept: paths are case-sensitive (RFC 3986 §6.2.2.1 only folds the scheme and host);
/// - the result always starts with `/` (one is prepended when `raw` has none, so an empty
///   path becomes `/`).
///
/// The result is a fixed point: canonicalizing it again changes nothing. Bytes that are not
/// a complete triplet after a `%` are copied as they are (the request parser has refused
/// them already). On error `out` holds a prefix of the result.
///
/// Allocates nothing when `out.capacity() >= raw.len() + 1`: the output is never longer.
pub fn canonicalize_path(raw: &[u8], out: &mut Vec<u8>) -> Result<(), ParseError> {
    out.clear();
    out.reserve(raw.len() + 1);
    out.push(b'/');
    // Invariant: before each segment, `out` ends with '/'.
    let mut segments = raw.split(|&b| b == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        let start = out.len();
        decode_unreserved(segment, out)?;
        match &out[start..] {
            // Empty segment: a repeated slash, or the trailing slash itself.
            b"" | b"." => out.truncate(start),
            b".." => {
                // Drop the last output segment and its slash; the root stays.
                out.truncate(start - 1);
                let keep = out.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
                out.truncate(keep);
                if out.is_empty() {
                    out.push(b'/');
                }
            }
            _ => {
                if !last {
                    out.push(b'/');
                }
            }
        }
    }
    Ok(())
}

/// Appends `segment` to `out` with pct-encoded unreserved characters decoded (RFC 3986
/// §2.3: "should be decoded by URI normalizers").
fn decode_unreserved(segment: &[u8], out: &mut Vec<u8>) -> Result<(), ParseError> {
    let mut i = 0;
    while i < segment.len() {
        let b = segment[i];
        if b == b'%' && i + 2 < segment.len() {
            if let (Some(hi), Some(lo)) = (hex_value(segment[i + 1]), hex_value(segment[i + 2])) {
                let c = hi << 4 | lo;
                if c == b'/' || c == b'\\' {
                    return Err(ParseError::EncodedSlash);
                }
                if is_unreserved(c) {
                    out.push(c);
                } else {
                    out.extend_from_slice(&segment[i..i + 3]);
                }
                i += 3;
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    Ok(())
}

/// RFC 3986 §2.3 `unreserved = ALPHA / DIGIT / "-" / "." / "_" / "~"`.
fn is_unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn try_canon(raw: &str) -> Result<String, ParseError> {
        let mut out = Vec::with_capacity(raw.len() + 1);
        let cap = out.capacity();
        let r = canonicalize_path(raw.as_bytes(), &mut out);
        assert_eq!(out.capacity(), cap, "grew for {raw:?}");
        r.map(|()| String::from_utf8(out).unwrap())
    }

    fn canon(raw: &str) -> String {
        try_canon(raw).unwrap()
    }

    #[test]
    fn brief_examples() {
        assert_eq!(canon("/a/./b/../c"), "/a/c");
        assert_eq!(canon("//a///b"), "/a/b");
        assert_eq!(canon("/.."), "/");
        assert_eq!(canon("/a/b/.."), "/a/");
    }

    #[test]
    fn rfc3986_5_2_4_examples() {
        // The §5.2.4 worked examples, as absolute paths.
        assert_eq!(canon("/a/b/c/./../../g"), "/a/g");
        assert_eq!(canon("/mid/content=5/../6"), "/mid/6");
    }

    #[test]
    fn edges() {
        assert_eq!(canon(""), "/");
        assert_eq!(canon("/"), "/");
        assert_eq!(canon("//"), "/");
        assert_eq!(canon("/a/"), "/a/");
        assert_eq!(canon("/a//"), "/a/");
        assert_eq!(canon("/a/."), "/a/");
        assert_eq!(canon("/a/./"), "/a/");
        assert_eq!(canon("/../../a"), "/a");
        assert_eq!(canon("/a/../../b/"), "/b/");
        assert_eq!(canon("/a/b/../../.."), "/");
        assert_eq!(canon("/..a/b.."), "/..a/b..");
        assert_eq!(canon("/.a/..."), "/.a/...");
        assert_eq!(canon("a/b"), "/a/b");
        assert_eq!(canon("/A/B"), "/A/B");
    }

    #[test]
    fn encoded_dot_segments_are_removed() {
        // The bypasses of a `/admin` prefix rule: every one is `/admin` now.
        for raw in [
            "/public/%2e%2e/admin",
            "/public/%2E%2E/admin",
            "/.%2e/admin",
            "/x/.%2e/admin",
            "/x/%2e./admin",
            "/%2e/admin",
            "/%61dmin",
            "/%41dmin/../admin",
        ] {
            assert_eq!(canon(raw), "/admin", "{raw}");
        }
        assert_eq!(canon("/a/%2e"), "/a/");
        assert_eq!(canon("/a/b/%2e%2e"), "/a/");
    }

    #[test]
    fn only_unreserved_characters_are_decoded() {
        assert_eq!(canon("/%7euser/%2D%5f%30"), "/~user/-_0");
        // Reserved and other characters stay encoded, hex case as sent.
        assert_eq!(
            canon("/a%3Fb/%3b/%25/%20/%c3%a9"),
            "/a%3Fb/%3b/%25/%20/%c3%a9"
        );
        // No double decoding: %252e is "%2e" spelled with an encoded "%".
        assert_eq!(canon("/%252e%252e/x"), "/%252e%252e/x");
        // Incomplete triplets (refused by the request parser) are copied.
        assert_eq!(canon("/a%2"), "/a%2");
        assert_eq!(canon("/a%zz"), "/a%zz");
    }

    #[test]
    fn encoded_separators_are_refused() {
        for raw in [
            "/%2fadmin",
            "/%2Fadmin",
            "/a/%2F/b",
            "/a%5cb",
            "/%5C..%5Cadmin",
        ] {
            assert_eq!(try_canon(raw), Err(ParseError::EncodedSlash), "{raw}");
        }
    }

    #[test]
    fn idempotent() {
        for raw in [
            "/a/./b/../c",
            "//a///b/",
            "/x/../y/.",
            "/%2e/./q",
            "/.%2e/%7e",
            "/%25%2e",
        ] {
            let once = canon(raw);
            assert_eq!(canon(&once), once, "{raw}");
        }
    }
}
