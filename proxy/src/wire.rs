//! Rewriting heads on the way through: the request head sent upstream and the response head sent to the client.

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};

use zgix_parser::{HeaderKind, RequestHead, ResponseHead};

use crate::filters::{FiltersRt, Walk};

/// A client address as text, formatted once per connection: X-Forwarded-For
/// is written on every request.
#[derive(Clone, Copy)]
pub struct IpText {
    /// Long enough for any IPv6 text form (45 bytes, with an embedded IPv4).
    buf: [u8; 45],
    len: u8,
}

impl IpText {
    pub fn new(ip: IpAddr) -> IpText {
        let mut buf = [0u8; 45];
        let mut cur = std::io::Cursor::new(&mut buf[..]);
        let _ = write!(cur, "{ip}");
        let len = cur.position() as u8;
        IpText { buf, len }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }
}

/// Writes the head zgix sends upstream into `out` (cleared first).
///
/// - The request line carries the canonical path and the raw query, always as
///   HTTP/1.1 origin-form (RFC 9112 §3.2.1); an absolute-form target's authority
///   replaces Host (RFC 9112 §3.2.2).
/// - Hop-by-hop fields are dropped: Connection and every field it names,
///   Keep-Alive, TE, Trailer, Upgrade, Proxy-Connection (RFC 9110 §7.6.1).
///   Expect is dropped too: zgix answers 100-continue itself.
/// - X-Forwarded-For fields are folded into one, with the client appended last.
/// - An HTTP/1.0 request without Host gets the endpoint's address as Host.
/// - `edits`, when request_filters matched: the rewritten path, and header
///   removals/sets/adds, applied after zgix's own stripping.
///
/// `base` is the client buffer the head's spans point into.
pub fn write_request_head(
    out: &mut Vec<u8>,
    base: &[u8],
    req: &RequestHead,
    client: &IpText,
    endpoint: SocketAddr,
    edits: Option<(&FiltersRt, &Walk)>,
) {
    out.clear();
    out.extend_from_slice(req.method_span.get(base));
    out.push(b' ');
    match edits {
        Some((_, w)) if w.rewritten => out.extend_from_slice(&w.path),
        _ => out.extend_from_slice(&req.canonical_path),
    }
    if let Some(q) = req.query {
        out.push(b'?');
        out.extend_from_slice(q.get(base));
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for h in req.headers.iter() {
        match h.kind {
            HeaderKind::Connection
            | HeaderKind::HopByHop
            | HeaderKind::Expect
            | HeaderKind::XForwardedFor => continue,
            HeaderKind::Host if req.authority.is_some() => continue,
            _ => {}
        }
        if let Some((f, w)) = edits {
            if f.request_drops(w, h.name.get(base)) {
                continue;
            }
        }
        out.extend_from_slice(h.name.get(base));
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value.get(base));
        out.extend_from_slice(b"\r\n");
    }
    if let Some(a) = req.authority {
        out.extend_from_slice(b"Host: ");
        out.extend_from_slice(a.get(base));
        out.extend_from_slice(b"\r\n");
    } else if req.host.is_none() {
        let _ = write!(out, "Host: {endpoint}\r\n");
    }
    if let Some((f, w)) = edits {
        f.write_request_additions(w, out);
    }
    out.extend_from_slice(b"X-Forwarded-For: ");
    // A filter that removes X-Forwarded-For drops the client-supplied values.
    let keep_previous = match edits {
        Some((f, w)) => !f.request_drops(w, b"x-forwarded-for"),
        None => true,
    };
    for h in req.headers.iter() {
        if keep_previous && h.kind == HeaderKind::XForwardedFor {
            let v = h.value.get(base);
            if !v.is_empty() {
                out.extend_from_slice(v);
                out.extend_from_slice(b", ");
            }
        }
    }
    out.extend_from_slice(client.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
}

/// Writes the head zgix sends the client into `out` (cleared first): the
/// upstream's status and reason, its fields minus hop-by-hop ones, and zgix's
/// own Connection field: `close` when zgix closes after this response,
/// `keep-alive` for an HTTP/1.0 client that keeps its connection (RFC 9112
/// §9.3). When de-chunking for an HTTP/1.0 client, Transfer-Encoding goes too.
pub fn write_response_head(
    out: &mut Vec<u8>,
    base: &[u8],
    resp: &ResponseHead,
    client_keep: bool,
    client_http10: bool,
    dechunk: bool,
    edits: Option<(&FiltersRt, &Walk)>,
) {
    out.clear();
    let _ = write!(out, "HTTP/1.1 {} ", resp.status);
    out.extend_from_slice(resp.reason.get(base));
    out.extend_from_slice(b"\r\n");
    for h in resp.headers.iter() {
        match h.kind {
            HeaderKind::Connection | HeaderKind::HopByHop => continue,
            HeaderKind::TransferEncoding if dechunk => continue,
            _ => {}
        }
        if let Some((f, w)) = edits {
            if f.response_drops(w, h.name.get(base)) {
                continue;
            }
        }
        out.extend_from_slice(h.name.get(base));
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value.get(base));
        out.extend_from_slice(b"\r\n");
    }
    if let Some((f, w)) = edits {
        f.write_response_additions(w, out);
    }
    if !client_keep {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if client_http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_text_matches_display_for_every_form() {
        for ip in [
            "203.0.113.7",
            "255.255.255.255",
            "2001:db8::1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:255.255.255.255",
            "::",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(IpText::new(ip).as_bytes(), ip.to_string().as_bytes());
        }
    }
}
