//! Canonical request paths: dot-segments removed, slashes merged, never percent-decoded.

/// Writes the canonical form of the raw path `raw` (no query) into `out`, which is cleared.
///
/// The canonical path is what routing and the WAF denylist match, so it must be one fixed
/// spelling per resource an origin would serve:
/// - dot-segments are removed as in RFC 3986 §5.2.4, so `/a/./b/../c` is `/a/c` and `..` never
///   climbs above the root (`/..` is `/`); a path ending in `.` or `..` keeps its trailing
///   slash (`/a/b/..` is `/a/`), as §5.2.4 step 2C/2D leaves the output buffer;
/// - runs of `/` are merged (`//a///b` is `/a/b`): most origins map empty segments to nothing,
///   so `//admin` must not dodge a rule written for `/admin`;
/// - percent-encoding is left alone (`/%2e%2e/x` stays): decoding is where origins disagree,
///   and zgix forwards the raw target, so the canonical form must not claim a decoding;
/// - the result always starts with `/` (one is prepended when `raw` has none, so an empty
///   path becomes `/`).
///
/// Allocates nothing when `out.capacity() >= raw.len() + 1`: the output is never longer.
pub fn canonicalize_path(raw: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(raw.len() + 1);
    out.push(b'/');
    // Invariant: before each segment, `out` ends with '/'.
    let mut segments = raw.split(|&b| b == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            // Empty segment: a repeated slash, or the trailing slash itself.
            b"" | b"." => {}
            b".." => {
                // Drop the last output segment and its slash; the root stays.
                out.pop();
                let keep = out.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
                out.truncate(keep);
                if out.is_empty() {
                    out.push(b'/');
                }
            }
            _ => {
                out.extend_from_slice(segment);
                if !last {
                    out.push(b'/');
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(raw: &str) -> String {
        let mut out = Vec::with_capacity(raw.len() + 1);
        let cap = out.capacity();
        canonicalize_path(raw.as_bytes(), &mut out);
        assert_eq!(out.capacity(), cap, "grew for {raw:?}");
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn brief_examples() {
        assert_eq!(canon("/a/./b/../c"), "/a/c");
        assert_eq!(canon("//a///b"), "/a/b");
        assert_eq!(canon("/.."), "/");
        assert_eq!(canon("/a/b/.."), "/a/");
        assert_eq!(canon("/%2e%2e/x"), "/%2e%2e/x");
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
        assert_eq!(canon("/a/%2F/b"), "/a/%2F/b");
        assert_eq!(canon("/A/B"), "/A/B");
    }

    #[test]
    fn idempotent() {
        for raw in ["/a/./b/../c", "//a///b/", "/x/../y/.", "/%2e/./q"] {
            let once = canon(raw);
            assert_eq!(canon(&once), once);
        }
    }
}
