//! A request head that a renderer wrote and described itself (an HTTP/2 stream's fields as HTTP/1.1): checked and completed without tokenising its bytes again, with [`RequestParser::parse`]'s result or none.
//!
//! The renderer knows where the method, the target and each field line are;
//! [`RequestParser::assemble`] checks that those spans tile the head in the
//! one layout below and that each piece holds only bytes httparse accepts
//! there, then runs the checks `parse` runs after tokenising — the same
//! function, `RequestParser::complete` (limits,
//! RFC 9112 §3.2 target forms, §3.2 Host, §6.3 framing, RFC 9110 §10.1.1
//! Expect, §9.3 persistence, the canonical path) in the same order. Where
//! `parse` might answer differently (a byte it would refuse, a value it
//! would trim, a limit) it answers `None`, and the caller parses the same
//! bytes: so the outcome is always `parse`'s.

use super::{HeaderKind, ParseError, RequestHead, RequestParser, Version};
use crate::message::Method;
use crate::syntax::is_tchar;

/// The request line's end after the target.
const LINE_END: &[u8] = b" HTTP/1.1\r\n";

/// httparse's request-target bytes (`URI_MAP`: VCHAR and obs-text).
fn is_uri_byte(b: u8) -> bool {
    (b'!'..=b'~').contains(&b) || b >= 0x80
}

/// httparse's field-value bytes (`HEADER_VALUE_MAP`: HTAB, SP, VCHAR, obs-text).
fn is_value_byte(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
}

/// Whether some byte of `w` is below `lo` (at most 0x80) or is DEL,
/// eight bytes at a time (exact: Hacker's Delight's "has less" and "has
/// zero" tests).
fn word_suspect(w: u64, lo: u8) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES * 0x80;
    let below = w.wrapping_sub(ONES * lo as u64) & !w & HIGH;
    let del = w ^ (ONES * 0x7f);
    let del = del.wrapping_sub(ONES) & !del & HIGH;
    below | del != 0
}

/// Whether every byte of `s` passes `ok`: words with no byte below `lo`
/// and no DEL pass at once (every such byte passes `ok`), the others and
/// the tail byte by byte.
#[inline]
fn all_bytes(s: &[u8], lo: u8, ok: impl Fn(u8) -> bool) -> bool {
    let mut words = s.chunks_exact(8);
    for c in &mut words {
        let w = u64::from_ne_bytes(c.try_into().unwrap_or_default());
        if word_suspect(w, lo) && !c.iter().all(|&b| ok(b)) {
            return false;
        }
    }
    words.remainder().iter().all(|&b| ok(b))
}

impl RequestParser {
    /// Completes a head rendered into `buf[..head.head_len]` as
    /// `method SP target " HTTP/1.1" CRLF *(name ": " value CRLF) CRLF`,
    /// where `head.method_span`, `head.target`, `head.head_len` and the
    /// name and value spans of `head.headers` (their kinds are recomputed)
    /// say where each piece is. Returns `Some` of exactly what
    /// [`RequestParser::parse`] returns for those bytes (with the same
    /// head), or `None` when the layout, a byte, a value's surrounding
    /// whitespace or a limit leaves that in doubt: then parse them.
    pub fn assemble(&self, buf: &[u8], head: &mut RequestHead) -> Option<Result<(), ParseError>> {
        let limits = &self.limits;
        let len = head.head_len;
        if len > buf.len() || len > limits.max_header_bytes {
            return None;
        }
        let buf = &buf[..len];
        // The request line: a token, one SP, URI bytes, " HTTP/1.1" CRLF.
        let m = head.method_span;
        let t = head.target;
        if m.start != 0
            || m.is_empty()
            || t.start as usize != m.end() + 1
            || t.is_empty()
            || buf.get(m.end()) != Some(&b' ')
            || buf.get(t.end()..t.end() + LINE_END.len()) != Some(LINE_END)
            || !m.get(buf).iter().all(|&b| is_tchar(b))
            || !all_bytes(t.get(buf), b'!', is_uri_byte)
        {
            return None;
        }
        let line_end = t.end() + LINE_END.len() - 2;
        if line_end > limits.max_request_line || head.headers.len() > limits.header_slots() {
            return None;
        }
        // Each field line: a token, ": ", a value without surrounding
        // whitespace (httparse would trim it) or an empty one, CRLF.
        let mut at = line_end + 2;
        for h in head.headers.iter_mut() {
            let (n, v) = (h.name, h.value);
            if n.start as usize != at
                || n.is_empty()
                || v.start as usize != n.end() + 2
                || v.is_empty()
                || buf.get(n.end()..n.end() + 2) != Some(b": ")
                || buf.get(v.end()..v.end() + 2) != Some(b"\r\n")
            {
                return None;
            }
            let value = v.get(buf);
            if matches!(value[0], b' ' | b'\t')
                || matches!(value[value.len() - 1], b' ' | b'\t')
                || !n.get(buf).iter().all(|&b| is_tchar(b))
                || !all_bytes(value, b' ', is_value_byte)
            {
                return None;
            }
            h.kind = HeaderKind::of(n.get(buf));
            at = v.end() + 2;
        }
        if at + 2 != len || &buf[at..] != b"\r\n" {
            return None;
        }
        head.method = Method::from_bytes(m.get(buf));
        head.version = Version::Http11;
        Some(self.complete(buf, head, line_end))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::limits;
    use super::super::Status;
    use super::*;
    use crate::span::Span;
    use crate::Header;

    /// A method, a target and field lines.
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

    /// Renders `method target` and `fields` in the assembler's layout,
    /// with the head describing it.
    fn render(method: &str, target: &str, fields: &[(&str, &str)]) -> (Vec<u8>, RequestHead) {
        let mut head = RequestHead::new(&limits());
        let mut b = Vec::new();
        b.extend_from_slice(method.as_bytes());
        head.method_span = Span::at(0, method.len());
        b.push(b' ');
        head.target = Span::at(b.len(), target.len());
        b.extend_from_slice(target.as_bytes());
        b.extend_from_slice(LINE_END);
        head.headers.clear();
        for (n, v) in fields {
            let name = Span::at(b.len(), n.len());
            b.extend_from_slice(n.as_bytes());
            b.extend_from_slice(b": ");
            let value = Span::at(b.len(), v.len());
            b.extend_from_slice(v.as_bytes());
            b.extend_from_slice(b"\r\n");
            head.headers.push(Header {
                name,
                value,
                kind: HeaderKind::Other,
            });
        }
        b.extend_from_slice(b"\r\n");
        head.head_len = b.len();
        (b, head)
    }

    /// `parse`'s result over the same bytes, with its head.
    fn parsed(buf: &[u8]) -> (Result<(), ParseError>, RequestHead) {
        let mut head = RequestHead::new(&limits());
        let r = RequestParser::new(limits()).parse(buf, &mut head);
        let r = match r {
            Ok(Status::Complete(())) => Ok(()),
            Ok(Status::Partial) => panic!("a whole head is partial"),
            Err(e) => Err(e),
        };
        (r, head)
    }

    /// Assembles, and checks the answer is `parse`'s (the head too when it
    /// succeeds); `true` when it answered.
    fn agrees(method: &str, target: &str, fields: &[(&str, &str)]) -> bool {
        let (buf, mut head) = render(method, target, fields);
        let Some(r) = RequestParser::new(limits()).assemble(&buf, &mut head) else {
            return false;
        };
        let (want, parsed_head) = parsed(&buf);
        assert_eq!(r, want, "{method} {target} {fields:?}");
        if r.is_ok() {
            assert_eq!(head, parsed_head, "{method} {target} {fields:?}");
        }
        true
    }

    #[test]
    fn a_rendered_head_is_what_parse_makes_of_its_bytes() {
        let h = ("host", "a.example");
        let cases: &[Case] = &[
            ("GET", "/", &[h]),
            ("GET", "/a/../b/./c?x=1&y", &[h, ("accept", "*/*")]),
            ("POST", "/up", &[h, ("content-length", "5")]),
            (
                "POST",
                "/up",
                &[h, ("content-length", "5"), ("content-length", "6")],
            ),
            ("POST", "/up", &[h, ("content-length", "5000")]),
            ("POST", "/up", &[h, ("content-length", "x")]),
            ("POST", "/up", &[h, ("transfer-encoding", "chunked")]),
            ("POST", "/up", &[h, ("transfer-encoding", "gzip")]),
            ("POST", "/up", &[h, ("transfer-encoding", "br, chunked")]),
            (
                "POST",
                "/up",
                &[h, ("transfer-encoding", "chunked"), ("content-length", "1")],
            ),
            ("GET", "/", &[h, ("expect", "100-continue")]),
            ("GET", "/", &[h, ("expect", "nope")]),
            ("GET", "/", &[h, ("connection", "close")]),
            ("GET", "/", &[h, ("connection", "x-a"), ("x-a", "1")]),
            ("GET", "/", &[h, ("connection", "a b")]),
            ("GET", "/", &[]),
            ("GET", "/", &[h, h]),
            ("GET", "/", &[("host", "a b")]),
            ("GET", "/%2e%2E/x%41", &[h]),
            ("GET", "/a%zz", &[h]),
            ("GET", "/a#f", &[h]),
            ("GET", "*", &[h]),
            ("OPTIONS", "*", &[h]),
            ("CONNECT", "a.example:443", &[h]),
            ("GET", "http://b.example/x?y", &[h]),
            ("GET", "http://b.example", &[h]),
            (
                "PURGE",
                "/x",
                &[h, ("x-forwarded-for", "1.2.3.4"), ("cookie", "a=1; b=2")],
            ),
            ("GET", "/caf\u{e9}", &[h]),
            ("GET", "/a?q=caf\u{e9}&r=\"x\"{}|^`", &[h]),
            ("GET", "/a?q=%e9%2", &[h]),
            ("GET", "/", &[h, ("x-v", "caf\u{e9} au\tlait")]),
        ];
        for (m, t, f) in cases {
            assert!(agrees(m, t, f), "{m} {t} {f:?}: not assembled");
        }
    }

    /// Every byte in every piece: the assembler answers as `parse` does or
    /// leaves the head to it.
    #[test]
    fn every_byte_anywhere_gets_parses_answer_or_none() {
        let mut answered = 0;
        for b in 0..=255u8 {
            let c = String::from_utf8_lossy(&[b]).into_owned();
            if c.len() != 1 {
                // Not one byte as a &str: rendered below as raw bytes.
                continue;
            }
            let pieces = [
                (format!("G{c}T"), "/a".to_string(), ("x-a", "1".to_string())),
                ("GET".into(), format!("/a{c}b"), ("x-a", "1".into())),
                ("GET".into(), format!("/a?q{c}"), ("x-a", "1".into())),
                ("GET".into(), "/a".into(), ("x-a", format!("1{c}2"))),
                ("GET".into(), "/a".into(), ("x-a", format!("{c}2"))),
            ];
            for (m, t, (n, v)) in &pieces {
                answered += usize::from(agrees(m, t, &[("host", "a"), (n, v)]));
            }
            let name = format!("x{c}a");
            answered += usize::from(agrees("GET", "/", &[("host", "a"), (&name, "1")]));
        }
        // Bytes outside ASCII, raw: in the target and in a value.
        for b in 0x80..=0xffu8 {
            for at in [0usize, 1] {
                let (mut buf, mut head) = render("GET", "/aa", &[("host", "a"), ("x-a", "vv")]);
                let i = if at == 0 {
                    head.target.start as usize + 1
                } else {
                    head.headers[1].value.start as usize
                };
                buf[i] = b;
                if let Some(r) = RequestParser::new(limits()).assemble(&buf, &mut head) {
                    let (want, parsed_head) = parsed(&buf);
                    assert_eq!(r, want, "{b:#x}");
                    if r.is_ok() {
                        assert_eq!(head, parsed_head, "{b:#x}");
                    }
                    answered += 1;
                }
            }
        }
        assert!(answered > 300, "most heads are assembled ({answered})");
    }

    #[test]
    fn what_parse_might_answer_otherwise_is_left_to_it() {
        let h = ("host", "a.example");
        let long = format!("/{}", "a".repeat(80));
        let many: Vec<(&str, &str)> = std::iter::repeat_n(("x-a", "1"), 9).chain([h]).collect();
        let big = "v".repeat(300);
        let cases: &[Case] = &[
            ("GET", &long, &[h]),
            ("GET", "/", &many),
            ("GET", "/", &[h, ("x-big", &big)]),
            ("GET", "/", &[h, ("x-a", " lead")]),
            ("GET", "/", &[h, ("x-a", "trail\t")]),
            ("GET", "/", &[h, ("x-a", "")]),
            ("GET", "/", &[h, ("x-a", "nul\0")]),
            ("GET", "/", &[h, ("x-a", "del\x7f")]),
            ("GET", "/", &[h, ("x a", "1")]),
            ("GET", "/", &[h, ("x:a", "1")]),
            ("G(T", "/", &[h]),
            ("GET", "/a b", &[h]),
            ("GET", "/a\x7f", &[h]),
        ];
        for (m, t, f) in cases {
            let (buf, _) = render(m, t, f);
            let (buf2, mut head) = render(m, t, f);
            assert_eq!(buf, buf2);
            assert!(
                RequestParser::new(limits())
                    .assemble(&buf, &mut head)
                    .is_none(),
                "{m} {t:?} {f:?} was assembled"
            );
        }
    }

    #[test]
    fn the_word_check_is_the_byte_check() {
        for lo in [b' ', b'!'] {
            for b in 0..=255u8 {
                for at in 0..8 {
                    let mut w = *b"abcdefgh";
                    w[at] = b;
                    let ok = if lo == b' ' {
                        is_value_byte
                    } else {
                        is_uri_byte
                    };
                    assert_eq!(all_bytes(&w, lo, ok), ok(b), "{b:#x} at {at}");
                    let mut long = b"0123456789abcdef_".to_vec();
                    long[at + 8] = b;
                    assert_eq!(all_bytes(&long, lo, ok), ok(b), "{b:#x} at {}", at + 8);
                }
            }
        }
    }

    #[test]
    fn spans_that_do_not_tile_the_head_are_left_to_parse() {
        let (buf, head) = render("GET", "/x", &[("host", "a"), ("x-b", "c")]);
        let p = RequestParser::new(limits());
        let mut h = head.clone();
        h.headers[1].value.len -= 1;
        assert!(p.assemble(&buf, &mut h).is_none(), "a short value");
        let mut h = head.clone();
        h.headers.pop();
        assert!(p.assemble(&buf, &mut h).is_none(), "a field left out");
        let mut h = head.clone();
        h.target.start += 1;
        assert!(p.assemble(&buf, &mut h).is_none(), "a moved target");
        let mut h = head.clone();
        h.head_len = buf.len() + 1;
        assert!(p.assemble(&buf, &mut h).is_none(), "past the buffer");
        let mut h = head;
        assert!(p.assemble(&buf, &mut h).is_some(), "the right spans");
    }
}
