//! The HTTP/1.1 response head zgix's own request loop wrote for a stream, read in one pass straight into the stream's HTTP/2 response: its status, its fields without the hop-by-hop ones (RFC 9113 §8.2.2) as slices of the head's bytes, and how the body that follows is framed (RFC 9112 §6.3). The loop wrote the head from a response its parser already checked, so this reads only the shape the loop writes (`HTTP/1.x SSS reason`, `name: value` lines) and refuses anything else.

use bytes::Bytes;
use zgix_parser::Method;

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

/// A whole head, read.
pub(super) struct Answer {
    pub status: u16,
    pub framing: Framing,
    pub response: http::Response<()>,
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

/// Reads the head `head[..len]` (`len` from [`head_end`]); field values
/// are slices of `head`.
pub(super) fn read(head: &Bytes, len: usize, method: Method) -> Result<Answer, Malformed> {
    let b = &head[..len];
    // `HTTP/1.x SSS` and the rest of the status line.
    if b.len() < 12 || &b[..7] != b"HTTP/1." || b[8] != b' ' {
        return Err(Malformed);
    }
    let digits = &b[9..12];
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(Malformed);
    }
    let status = digits
        .iter()
        .fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    let mut at = memchr::memchr(b'\n', b).ok_or(Malformed)? + 1;
    let mut r = http::Response::new(());
    *r.status_mut() = http::StatusCode::from_u16(status).map_err(|_| Malformed)?;
    let (mut length, mut te, mut chunked) = (None, false, false);
    let map = r.headers_mut();
    while at < len - 2 {
        let end = at + memchr::memchr(b'\n', &b[at..]).ok_or(Malformed)?;
        let line = b[at..end].strip_suffix(b"\r").ok_or(Malformed)?;
        let colon = memchr::memchr(b':', line).ok_or(Malformed)?;
        let value = trim(&line[colon + 1..]);
        at = end + 1;
        // A field `http` cannot carry is dropped, not the answer (as the
        // codec's types would have it either way).
        let Ok(name) = http::HeaderName::from_bytes(&line[..colon]) else {
            continue;
        };
        if name == http::header::TRANSFER_ENCODING {
            // The final coding is the last one listed (RFC 9112 §6.3 rule 4).
            te = true;
            let last = value.rsplit(|&c| c == b',').next().map(trim);
            chunked = last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
            continue;
        }
        if HOP_BY_HOP.contains(&name.as_str()) {
            continue;
        }
        if name == http::header::CONTENT_LENGTH {
            length = Some(number(value)?);
        }
        let Ok(value) = http::HeaderValue::from_maybe_shared(head.slice_ref(value)) else {
            continue;
        };
        map.append(name, value);
    }
    let framing = if method == Method::Head || status < 200 || status == 204 || status == 304 {
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
    Ok(Answer {
        status,
        framing,
        response: r,
    })
}

fn trim(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
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

    fn answer(text: &str, method: Method) -> Result<Answer, Malformed> {
        let b = Bytes::copy_from_slice(text.as_bytes());
        let len = head_end(&b)?.ok_or(Malformed)?;
        assert_eq!(&b[len - 4..len], b"\r\n\r\n");
        read(&b, len, method)
    }

    #[test]
    fn a_head_becomes_status_fields_without_hop_by_hop_and_its_framing() {
        let a = answer(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\
             X-A:  v w \r\nx-a: 2\r\nKeep-Alive: t=1\r\n\r\nhello",
            Method::Get,
        )
        .unwrap();
        assert_eq!((a.status, a.framing), (200, Framing::Length(5)));
        let h = a.response.headers();
        assert_eq!(h.len(), 3);
        assert_eq!(h["content-length"], "5");
        let xa: Vec<_> = h.get_all("x-a").iter().collect();
        assert_eq!(xa, ["v w", "2"]);
    }

    #[test]
    fn framing_follows_rfc_9112_section_6_3() {
        let f = |t: &str, m| answer(t, m).unwrap().framing;
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
        let a = answer(te, Method::Get).unwrap();
        assert!(a.response.headers().is_empty());
    }

    #[test]
    fn a_field_http_cannot_carry_is_dropped_alone() {
        let a = answer(
            "HTTP/1.1 200 OK\r\nbad name: v\r\nx-ok: 1\r\nx-bad: a\x7fb\r\n\r\n",
            Method::Get,
        )
        .unwrap();
        let names: Vec<_> = a.response.headers().keys().map(|n| n.as_str()).collect();
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
