//! An HTTP/1.1 response head zgix's own request loop wrote for a stream (an answer zgix makes itself, a relayed 1xx; a proxied final answer goes by `direct.rs`), read in one pass straight into the stream's HTTP/2 response: its status, the fields to send (without the hop-by-hop ones, RFC 9113 §8.2.2) as places in the head's bytes, and how the body that follows is framed (RFC 9112 §6.3). The loop wrote the head from a response its parser already checked, so this reads only the shape the loop writes (`HTTP/1.x SSS reason`, `name: value` lines) and refuses anything else.

use zgix_parser::{is_field_vchar, is_token, Method};

/// Fields that are about one HTTP/1.1 connection, never sent on a stream
/// (RFC 9113 §8.2.2); the codec refuses them in requests already.
pub(super) const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

/// Largest head taken (the loop's own limits are below it).
const MAX_HEAD: usize = 1 << 20;

/// How the body after the head is framed (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// Rules 1–2: HEAD, 1xx, 204, 304.
    None,
    /// Rule 6.
    Length(u64),
    /// Rule 4, chunked final.
    Chunked,
    /// Rules 4 (another final coding) and 8.
    Close,
}

/// Fields kept in place in an [`Answer`]; more go to its `more` list.
const KEPT: usize = 32;

/// A field of the head: where its name and its trimmed value are.
#[derive(Clone, Copy, Default)]
struct Span {
    name: (u32, u32),
    value: (u32, u32),
}

/// A whole head, read: its status, its framing, and the fields the stream
/// sends, found in the same pass ([`Answer::fields`]).
pub(super) struct Answer {
    pub status: u16,
    pub framing: Framing,
    kept: [Span; KEPT],
    n: usize,
    /// Past [`KEPT`] fields (rare: a head with many cookies).
    more: Vec<Span>,
}

impl Answer {
    fn new(status: u16) -> Answer {
        Answer {
            status,
            framing: Framing::Close,
            kept: [Span::default(); KEPT],
            n: 0,
            more: Vec::new(),
        }
    }

    /// The fields to send, as slices of `head` (the bytes [`read`] took):
    /// without the hop-by-hop ones (RFC 9113 §8.2.2), and without a field
    /// HTTP/2 cannot carry (dropped alone, not the answer).
    pub(super) fn fields<'h>(
        &'h self,
        head: &'h [u8],
    ) -> impl Iterator<Item = (&'h [u8], &'h [u8])> {
        let at = |(a, b): (u32, u32)| &head[a as usize..b as usize];
        self.kept[..self.n]
            .iter()
            .chain(self.more.iter())
            .map(move |s| (at(s.name), at(s.value)))
    }

    fn keep(&mut self, s: Span) {
        if self.n < KEPT {
            self.kept[self.n] = s;
            self.n += 1;
        } else {
            self.more.push(s);
        }
    }
}

/// The head is not one the loop writes.
#[derive(Debug)]
pub(super) struct Malformed;

/// Where the head in `buf` ends (after its blank line), if it is whole.
pub(super) fn head_end(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    match memchr::memmem::find(buf, b"\r\n\r\n") {
        Some(at) => Ok(Some(at + 4)),
        None if buf.len() > MAX_HEAD => Err(Malformed),
        None => Ok(None),
    }
}

/// Whether a (lowercase) field name is one of [`HOP_BY_HOP`].
fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP.iter().any(|h| h.as_bytes() == name)
}

/// Reads the head `head` (the bytes up to [`head_end`]), lowering its
/// field names in place (HTTP/2 names are lowercase, RFC 9113 §8.2.1) and
/// noting the fields the stream sends.
pub(super) fn read(head: &mut [u8], method: Method) -> Result<Answer, Malformed> {
    let len = head.len();
    // `HTTP/1.x SSS` and the rest of the status line.
    if len < 12 || &head[..7] != b"HTTP/1." || head[8] != b' ' {
        return Err(Malformed);
    }
    let digits = &head[9..12];
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(Malformed);
    }
    let status = digits
        .iter()
        .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    if !(100..=999).contains(&status) {
        return Err(Malformed);
    }
    if len > u32::MAX as usize {
        return Err(Malformed);
    }
    let mut at = memchr::memchr(b'\n', head).ok_or(Malformed)? + 1;
    let (mut length, mut te, mut chunked) = (None, false, false);
    let mut a = Answer::new(status);
    while at < len - 2 {
        let end = at + memchr::memchr(b'\n', &head[at..]).ok_or(Malformed)?;
        let line = &mut head[at..end];
        let Some((&mut b'\r', line)) = line.split_last_mut() else {
            return Err(Malformed);
        };
        let colon = memchr::memchr(b':', line).ok_or(Malformed)?;
        line[..colon].make_ascii_lowercase();
        let (vs, ve) = trimmed(line, colon + 1);
        let (name, value) = (&line[..colon], &line[vs..ve]);
        // A field HTTP/2 can carry: a token name (RFC 9110 §5.6.2) and a
        // value without NUL, CR, LF (RFC 9113 §8.2.1) or another control
        // but HTAB (RFC 9110 §5.5).
        if is_token(name) && value.iter().all(|&c| is_field_vchar(c)) && !is_hop_by_hop(name) {
            a.keep(Span {
                name: (at as u32, (at + colon) as u32),
                value: ((at + vs) as u32, (at + ve) as u32),
            });
        }
        at = end + 1;
        if name == b"transfer-encoding" {
            // The final coding is the last one listed (RFC 9112 §6.3 rule 4).
            te = true;
            let last = value.rsplit(|&c| c == b',').next().map(trim);
            chunked = last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
        } else if name == b"content-length" {
            length = Some(number(value)?);
        }
    }
    a.framing = if method == Method::Head || status < 200 || status == 204 || status == 304 {
        Framing::None
    } else if te {
        if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        }
    } else {
        length.map_or(Framing::Close, Framing::Length)
    };
    Ok(a)
}

/// Where `line[from..]` is without its leading and trailing SP and HTAB.
fn trimmed(line: &[u8], from: usize) -> (usize, usize) {
    let (mut a, mut b) = (from, line.len());
    while a < b && matches!(line[a], b' ' | b'\t') {
        a += 1;
    }
    while b > a && matches!(line[b - 1], b' ' | b'\t') {
        b -= 1;
    }
    (a, b)
}

fn trim(v: &[u8]) -> &[u8] {
    let (a, b) = trimmed(v, 0);
    &v[a..b]
}

fn number(v: &[u8]) -> Result<u64, Malformed> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return Err(Malformed);
    }
    Ok(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str, method: Method) -> Result<(Answer, Vec<(String, String)>), Malformed> {
        let mut b = text.as_bytes().to_vec();
        let len = head_end(&b)?.ok_or(Malformed)?;
        assert_eq!(&b[len - 4..len], b"\r\n\r\n");
        let a = read(&mut b[..len], method)?;
        let f = a
            .fields(&b[..len])
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect();
        Ok((a, f))
    }

    #[test]
    fn a_head_becomes_status_fields_without_hop_by_hop_and_its_framing() {
        let (a, h) = answer(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\
             X-A:  v w \r\nx-a: 2\r\nKeep-Alive: t=1\r\n\r\nhello",
            Method::Get,
        )
        .unwrap();
        assert_eq!((a.status, a.framing), (200, Framing::Length(5)));
        let want = [("content-length", "5"), ("x-a", "v w"), ("x-a", "2")];
        let want: Vec<_> = want
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(h, want);
    }

    #[test]
    fn a_head_with_more_fields_than_kept_in_place_sends_them_all_in_order() {
        let mut t = String::from("HTTP/1.1 200 OK\r\n");
        for i in 0..(KEPT + 9) {
            t.push_str(&format!("Set-Cookie:\t c{i}=v \r\n"));
            if i == KEPT - 1 {
                t.push_str("Connection: close\r\n");
            }
        }
        t.push_str("\r\n");
        let (_, h) = answer(&t, Method::Get).unwrap();
        assert_eq!(h.len(), KEPT + 9);
        for (i, (n, v)) in h.iter().enumerate() {
            assert_eq!(
                (n.as_str(), v.as_str()),
                ("set-cookie", format!("c{i}=v").as_str())
            );
        }
    }

    #[test]
    fn framing_follows_rfc_9112_section_6_3() {
        let f = |t: &str, m| answer(t, m).unwrap().0.framing;
        let te = "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n";
        assert_eq!(f(te, Method::Get), Framing::Chunked);
        let te = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n";
        assert_eq!(f(te, Method::Get), Framing::Close);
        assert_eq!(f("HTTP/1.1 200 OK\r\n\r\n", Method::Get), Framing::Close);
        let cl = "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n";
        assert_eq!(f(cl, Method::Head), Framing::None);
        for s in ["103 Early Hints", "204 No Content", "304 Not Modified"] {
            let t = format!("HTTP/1.1 {s}\r\ncontent-length: 9\r\n\r\n");
            assert_eq!(f(&t, Method::Get), Framing::None, "{s}");
        }
        // Transfer-Encoding is never forwarded on a stream.
        assert!(answer(te, Method::Get).unwrap().1.is_empty());
    }

    #[test]
    fn a_field_http2_cannot_carry_is_dropped_alone() {
        let (_, h) = answer(
            "HTTP/1.1 200 OK\r\nbad name: v\r\nx-ok: 1\r\nx-bad: a\x7fb\r\n\r\n",
            Method::Get,
        )
        .unwrap();
        let names: Vec<_> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x-ok"]);
    }

    #[test]
    fn a_partial_head_waits_and_a_malformed_one_is_refused() {
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n").unwrap(), None);
        for bad in [
            "HTTP/2.0 200 OK\r\n\r\n",
            "HTTP/1.1 2x0 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 1x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nA: b\nB: c\r\n\r\n",
        ] {
            assert!(answer(bad, Method::Get).is_err(), "{bad:?}");
        }
    }
}
