//! Rewriting heads on the way through: the request head sent upstream and the response head sent to the client.

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};

use zgix_parser::{Header, HeaderKind, RequestHead, ResponseHead, Version};

use crate::http::filters::{FiltersRt, Walk};
use crate::observe::decimal::decimal;

/// A client address as text, formatted once per connection: X-Forwarded-For
/// is written on every request.
#[derive(Clone, Copy)]
pub struct IpText {
    /// Long enough for any IPv6 text form (45 bytes, with an embedded IPv4).
    buf: [u8; 45],
    len: u8,
}

impl IpText {
    /// An IPv4 address is written octet by octet (formatting it through
    /// `core::fmt` cost ~1,000 instructions per request); IPv6 by `Display`.
    pub fn new(ip: IpAddr) -> IpText {
        let mut buf = [0u8; 45];
        let len = match ip {
            IpAddr::V4(v4) => {
                let mut at = 0;
                for (i, o) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        buf[at] = b'.';
                        at += 1;
                    }
                    if o >= 100 {
                        buf[at] = b'0' + o / 100;
                        at += 1;
                    }
                    if o >= 10 {
                        buf[at] = b'0' + o / 10 % 10;
                        at += 1;
                    }
                    buf[at] = b'0' + o % 10;
                    at += 1;
                }
                at
            }
            IpAddr::V6(_) => {
                let mut cur = std::io::Cursor::new(&mut buf[..]);
                let _ = write!(cur, "{ip}");
                cur.position() as usize
            }
        };
        IpText {
            buf,
            len: len as u8,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }
}

/// Writes the head zgix sends upstream into `out` (cleared first).
///
/// - The request line carries the canonical path (unreserved characters
///   decoded, dot-segments removed: what every matcher saw) and the raw query,
///   always as HTTP/1.1 origin-form (RFC 9112 §3.2.1); an absolute-form target's
///   authority replaces Host (RFC 9112 §3.2.2).
/// - Hop-by-hop fields are dropped: Connection and every field it names,
///   Keep-Alive, TE, Trailer, Upgrade, Proxy-Connection (RFC 9110 §7.6.1).
///   Expect is dropped too: zgix answers 100-continue itself.
/// - Content-Length is sent once, with the one value the parser agreed on: RFC
///   9112 §6.3 rule 5 accepts `Content-Length: 5, 5` (or two equal fields) only
///   from a recipient that replaces them with a single value.
/// - X-Forwarded-For fields are folded into one, with the client appended last.
/// - X-Forwarded-Proto says how the client reached zgix (`stamp.proto`:
///   `https` on a TLS listener, `http` otherwise); the client's own goes.
/// - An HTTP/1.0 request without Host gets the endpoint's address as Host.
/// - `edits`, when request_filters matched: the rewritten path, and header
///   removals/sets/adds, applied after zgix's own stripping.
/// - `stamp.via`: `Via: 1.x <via>` closes the head, after any Via fields the client
///   sent (RFC 9110 §7.6.3: a proxy appends its entry; a second field line is
///   the same list, §5.3). `1.x` is the version the client spoke.
///
/// `base` is the client buffer the head's spans point into.
pub fn write_request_head_via(
    out: &mut Vec<u8>,
    base: &[u8],
    req: &RequestHead,
    client: &IpText,
    endpoint: SocketAddr,
    edits: Option<(&FiltersRt, &Walk)>,
    stamp: &Stamp<'_>,
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
    let mut length = req.content_length;
    for h in req.headers.iter() {
        match h.kind {
            HeaderKind::Connection
            | HeaderKind::HopByHop
            | HeaderKind::Expect
            | HeaderKind::XForwardedFor => continue,
            HeaderKind::Host if req.authority.is_some() => continue,
            _ => {}
        }
        // zgix says how the client reached it; a client's own claim goes.
        if h.name.get(base).eq_ignore_ascii_case(b"x-forwarded-proto") {
            continue;
        }
        // zgix names the request (a client's acceptable ID is `request_id` already).
        if stamp.request_id.is_some() && h.name.get(base).eq_ignore_ascii_case(b"x-request-id") {
            continue;
        }
        if let Some((f, w)) = edits {
            if f.request_drops(w, h.name.get(base)) {
                continue;
            }
        }
        field(out, base, h, &mut length);
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
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b"X-Forwarded-Proto: ");
    out.extend_from_slice(stamp.proto.as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(id) = stamp.request_id {
        out.extend_from_slice(b"X-Request-ID: ");
        out.extend_from_slice(id);
        out.extend_from_slice(b"\r\n");
    }
    if stamp.forwarded {
        let host = req.authority.or(req.host).map(|h| h.get(base));
        forwarded_field(out, client, stamp.proto, host);
    }
    via_field(out, req.version, stamp.via);
    out.extend_from_slice(b"\r\n");
}

/// `Forwarded: for=<client>;proto=<proto>;host=<host>` (RFC 7239 §4, §5): an
/// IPv6 client is `"[addr]"` (§6, a quoted-string since `:` is not a token
/// character), and so is a host with a port; the host is the request's
/// authority or Host value, left out when there is none. A second field line
/// after the client's is the same list (RFC 9110 §5.3), so zgix's element comes
/// last, as in X-Forwarded-For.
fn forwarded_field(out: &mut Vec<u8>, client: &IpText, proto: &str, host: Option<&[u8]>) {
    out.extend_from_slice(b"Forwarded: for=");
    let ip = client.as_bytes();
    if ip.contains(&b':') {
        out.extend_from_slice(b"\"[");
        out.extend_from_slice(ip);
        out.extend_from_slice(b"]\"");
    } else {
        out.extend_from_slice(ip);
    }
    out.extend_from_slice(b";proto=");
    out.extend_from_slice(proto.as_bytes());
    if let Some(h) = host.filter(|h| !h.is_empty()) {
        out.extend_from_slice(b";host=");
        let token = h
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b));
        if token {
            out.extend_from_slice(h);
        } else {
            // A Host value the parser accepted holds no '"', '\\' or control byte;
            // escape anyway, so the quoted-string cannot be broken (§4).
            out.push(b'"');
            for &b in h {
                if b == b'"' || b == b'\\' {
                    out.push(b'\\');
                }
                out.push(b);
            }
            out.push(b'"');
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// What zgix adds to every forwarded request besides X-Forwarded-For.
pub struct Stamp<'a> {
    /// zgix's Via entry (`"via"` in the config), if any.
    pub via: Option<&'a [u8]>,
    /// `https` on a TLS listener, `http` otherwise: X-Forwarded-Proto.
    pub proto: &'static str,
    /// The request's ID (`listeners[].http.request_id`): sent as the one
    /// `X-Request-ID` field, the client's own fields dropped. `None` when the
    /// listener's `request_id` is `false`: the client's fields pass as sent.
    pub request_id: Option<&'a [u8]>,
    /// `listeners[].http.forwarded`: add an RFC 7239 `Forwarded` element for
    /// this hop (`for`, `proto`, `host`) after any the client sent.
    pub forwarded: bool,
}

/// How the response head must frame the exchange with the client.
#[derive(Clone, Copy, Debug)]
pub struct ClientFraming {
    /// zgix keeps the client connection after this response.
    pub keep: bool,
    /// The client spoke HTTP/1.0.
    pub http10: bool,
    /// The chunked body is being de-chunked (for an HTTP/1.0 client).
    pub dechunk: bool,
}

/// Writes the head zgix sends the client into `out` (cleared first): the
/// upstream's status and reason, its fields minus hop-by-hop ones, a single
/// Content-Length (see [`write_request_head_via`]), zgix's Via entry after the
/// origin's (the version the origin spoke), and zgix's own Connection field:
/// `close` when zgix closes after this response, `keep-alive` for an HTTP/1.0
/// client that keeps its connection (RFC 9112 §9.3). When de-chunking for an
/// HTTP/1.0 client, Transfer-Encoding goes too.
pub fn write_response_head_via(
    out: &mut Vec<u8>,
    base: &[u8],
    resp: &ResponseHead,
    framing: ClientFraming,
    edits: Option<(&FiltersRt, &Walk)>,
    via: Option<&[u8]>,
) {
    status_line(out, base, resp);
    let mut length = resp.content_length;
    for h in resp.headers.iter() {
        if response_forwards(base, h, framing.dechunk, edits) {
            field(out, base, h, &mut length);
        }
    }
    write_added_fields(out, resp.version, edits, via);
    if !framing.keep {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if framing.http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether the origin's final-head field `h` goes on to the client: not a
/// hop-by-hop one (RFC 9110 §7.6.1), not Transfer-Encoding when the body is
/// re-framed (`reframed`), not one a matched `response_headers` edit
/// removes or sets.
pub fn response_forwards(
    base: &[u8],
    h: &Header,
    reframed: bool,
    edits: Option<(&FiltersRt, &Walk)>,
) -> bool {
    match h.kind {
        HeaderKind::Connection | HeaderKind::HopByHop => return false,
        HeaderKind::TransferEncoding if reframed => return false,
        _ => {}
    }
    edits.is_none_or(|(f, w)| !f.response_drops(w, h.name.get(base)))
}

/// Appends the field lines zgix adds to a final head: the values matched
/// `response_headers` edits set, then zgix's Via entry.
pub fn write_added_fields(
    out: &mut Vec<u8>,
    received: Version,
    edits: Option<(&FiltersRt, &Walk)>,
    via: Option<&[u8]>,
) {
    if let Some((f, w)) = edits {
        f.write_response_additions(w, out);
    }
    via_field(out, received, via);
}

/// Writes an interim (1xx) head zgix relays to the client into `out` (cleared
/// first), from `resp` as the response parser read it (with the same
/// strictness as a final head: obs-fold, bare CR, NUL, a bad field are 502).
///
/// RFC 9110 §15.2: a proxy forwards 1xx responses, and it must not forward
/// hop-by-hop fields in any message (§7.6.1), so Connection and the fields it
/// names, Keep-Alive, Upgrade and the rest are dropped. So are Content-Length
/// and Transfer-Encoding, which a 1xx must not carry (RFC 9110 §8.6, RFC 9112
/// §6.1) and which mean nothing in a head without a body. Every line ends in
/// CRLF whatever the origin used. Via as for final heads.
pub fn write_interim_head(out: &mut Vec<u8>, base: &[u8], resp: &ResponseHead, via: Option<&[u8]>) {
    status_line(out, base, resp);
    for h in resp.headers.iter() {
        match h.kind {
            HeaderKind::Connection
            | HeaderKind::HopByHop
            | HeaderKind::ContentLength
            | HeaderKind::TransferEncoding => continue,
            _ => {}
        }
        let mut none = None;
        field(out, base, h, &mut none);
    }
    via_field(out, resp.version, via);
    out.extend_from_slice(b"\r\n");
}

/// Clears `out` and writes `HTTP/1.1 <status> <reason>`: zgix speaks 1.1 to
/// every client (RFC 9110 §6.2), whatever the origin's version.
fn status_line(out: &mut Vec<u8>, base: &[u8], resp: &ResponseHead) {
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    decimal(out, u64::from(resp.status));
    out.push(b' ');
    out.extend_from_slice(resp.reason.get(base));
    out.extend_from_slice(b"\r\n");
}

/// One forwarded field line. Content-Length fields become one line carrying
/// `length`, written at the first of them (`length` is then taken).
fn field(out: &mut Vec<u8>, base: &[u8], h: &Header, length: &mut Option<u64>) {
    if h.kind == HeaderKind::ContentLength {
        let Some(n) = length.take() else { return };
        out.extend_from_slice(h.name.get(base));
        out.extend_from_slice(b": ");
        decimal(out, n);
        out.extend_from_slice(b"\r\n");
        return;
    }
    out.extend_from_slice(h.name.get(base));
    out.extend_from_slice(b": ");
    out.extend_from_slice(h.value.get(base));
    out.extend_from_slice(b"\r\n");
}

/// `Via: 1.0 <name>` or `Via: 1.1 <name>`: RFC 9110 §7.6.3 received-protocol is
/// the version of the message as zgix received it (the protocol name is
/// omitted for HTTP).
fn via_field(out: &mut Vec<u8>, received: Version, via: Option<&[u8]>) {
    let Some(name) = via else { return };
    out.extend_from_slice(match received {
        Version::Http10 => b"Via: 1.0 ",
        Version::Http11 => b"Via: 1.1 ",
    });
    out.extend_from_slice(name);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use zgix_parser::{Limits, Method, RequestParser, ResponseParser, Status};

    const EP: &str = "127.0.0.1:9000";

    #[test]
    fn ip_text_is_what_display_writes() {
        for ip in [
            "0.0.0.0",
            "1.2.3.4",
            "9.10.99.100",
            "203.0.113.7",
            "255.255.255.255",
            "10.0.200.5",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:192.0.2.128",
            "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(IpText::new(ip).as_bytes(), ip.to_string().as_bytes());
        }
    }

    /// The head zgix sends upstream for the raw request `raw`.
    fn upstream(raw: &str, via: Option<&[u8]>) -> String {
        let limits: Limits = zgix_config::Limits::default().request_limits();
        let mut head = RequestHead::new(&limits);
        let r = RequestParser::new(limits).parse(raw.as_bytes(), &mut head);
        assert_eq!(r, Ok(Status::Complete(())), "{raw:?}");
        let client = IpText::new("203.0.113.7".parse().unwrap());
        let mut out = Vec::new();
        let ep = EP.parse().unwrap();
        let stamp = Stamp {
            via,
            proto: "http",
            request_id: None,
            forwarded: false,
        };
        write_request_head_via(&mut out, raw.as_bytes(), &head, &client, ep, None, &stamp);
        String::from_utf8(out).unwrap()
    }

    /// The upstream head with a request ID and `Forwarded` on, from `client`.
    fn upstream_with(raw: &str, id: Option<&[u8]>, client: &str) -> String {
        let limits: Limits = zgix_config::Limits::default().request_limits();
        let mut head = RequestHead::new(&limits);
        let r = RequestParser::new(limits).parse(raw.as_bytes(), &mut head);
        assert_eq!(r, Ok(Status::Complete(())), "{raw:?}");
        let client = IpText::new(client.parse().unwrap());
        let mut out = Vec::new();
        let stamp = Stamp {
            via: None,
            proto: "https",
            request_id: id,
            forwarded: true,
        };
        write_request_head_via(
            &mut out,
            raw.as_bytes(),
            &head,
            &client,
            EP.parse().unwrap(),
            None,
            &stamp,
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_request_id_replaces_the_clients_fields_and_forwarded_names_this_hop() {
        let raw = "GET / HTTP/1.1\r\nHost: a.example:8443\r\nX-Request-ID: spoof\r\nx-request-id: two\r\nForwarded: for=192.0.2.1\r\n\r\n";
        let up = upstream_with(raw, Some(b"0123abcd"), "2001:db8::7");
        assert_eq!(
            up.matches("X-Request-ID").count() + up.matches("x-request-id").count(),
            1,
            "{up}"
        );
        assert!(up.contains("\r\nX-Request-ID: 0123abcd\r\n"), "{up}");
        assert!(
            up.contains("\r\nForwarded: for=192.0.2.1\r\n"),
            "the client's element stays: {up}"
        );
        assert!(
            up.contains(
                "\r\nForwarded: for=\"[2001:db8::7]\";proto=https;host=\"a.example:8443\"\r\n"
            ),
            "{up}"
        );
        // Off: the client's field passes as sent, none added.
        let mut off = upstream_with(raw, None, "203.0.113.7");
        assert!(
            off.contains("X-Request-ID: spoof\r\n") && off.contains("x-request-id: two\r\n"),
            "{off}"
        );
        assert!(
            off.contains("\r\nForwarded: for=203.0.113.7;proto=https;host=\"a.example:8443\"\r\n"),
            "{off}"
        );
        // A token host is written bare; no Host, no host parameter.
        off = upstream_with(
            "GET / HTTP/1.1\r\nHost: a.example\r\n\r\n",
            None,
            "203.0.113.7",
        );
        assert!(
            off.contains("Forwarded: for=203.0.113.7;proto=https;host=a.example\r\n"),
            "{off}"
        );
        off = upstream_with("GET / HTTP/1.0\r\n\r\n", None, "203.0.113.7");
        assert!(
            off.contains("Forwarded: for=203.0.113.7;proto=https\r\n"),
            "{off}"
        );
    }

    fn parse_response(raw: &str) -> ResponseHead {
        let mut head = ResponseHead::new(100);
        let r = ResponseParser::new(65536, 100).parse(raw.as_bytes(), Method::Get, &mut head);
        assert_eq!(r, Ok(Status::Complete(())), "{raw:?}");
        head
    }

    /// The head zgix sends the client for the raw (final) response `raw`.
    fn downstream(raw: &str, via: Option<&[u8]>) -> String {
        let head = parse_response(raw);
        let mut out = Vec::new();
        let framing = ClientFraming {
            keep: true,
            http10: false,
            dechunk: false,
        };
        write_response_head_via(&mut out, raw.as_bytes(), &head, framing, None, via);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_clients_own_forwarded_proto_is_replaced() {
        let raw = "GET / HTTP/1.1\r\nHost: a\r\nx-forwarded-proto: https\r\nX-Forwarded-Proto: ftp\r\n\r\n";
        assert_eq!(
            upstream(raw, None),
            "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: http\r\n\r\n"
        );
    }

    #[test]
    fn content_length_lists_are_forwarded_as_one_value() {
        let want = "POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX: y\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: http\r\n\r\n";
        for cl in [
            "Content-Length: 5, 5",
            "Content-Length: 5 ,5,5",
            "Content-Length: 5\r\nContent-Length: 5",
            "Content-Length: 5\r\nContent-Length: 5, 5",
            "Content-Length: 005",
        ] {
            let raw = format!("POST /up HTTP/1.1\r\nHost: a\r\n{cl}\r\nX: y\r\n\r\n");
            assert_eq!(upstream(&raw, None), want, "{cl:?}");
        }
        // The field keeps its place and its name's spelling.
        let raw = "POST / HTTP/1.1\r\ncontent-length: 0\r\nHost: a\r\n\r\n";
        assert!(
            upstream(raw, None).starts_with("POST / HTTP/1.1\r\ncontent-length: 0\r\nHost: a\r\n")
        );
        // Responses too.
        let raw = "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(
            downstream(raw, None),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
        );
    }

    #[test]
    fn forwarded_path_is_the_canonical_one() {
        let raw = "GET /public/%2e%2E/%61dmin/./x?a=%2e%2e/ HTTP/1.1\r\nHost: a\r\n\r\n";
        assert!(upstream(raw, None).starts_with("GET /admin/x?a=%2e%2e/ HTTP/1.1\r\n"));
    }

    #[test]
    fn via_is_appended_with_the_received_version() {
        let raw = "GET / HTTP/1.1\r\nHost: a\r\nVia: 1.1 cdn\r\n\r\n";
        assert_eq!(
            upstream(raw, Some(b"zgix")),
            "GET / HTTP/1.1\r\nHost: a\r\nVia: 1.1 cdn\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: http\r\nVia: 1.1 zgix\r\n\r\n"
        );
        let raw = "GET / HTTP/1.0\r\n\r\n";
        assert_eq!(
            upstream(raw, Some(b"edge")),
            format!("GET / HTTP/1.1\r\nHost: {EP}\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: http\r\nVia: 1.0 edge\r\n\r\n")
        );
        assert!(!upstream(raw, None).contains("Via"));
        let raw = "HTTP/1.0 200 OK\r\nVia: 1.1 origin-cache\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            downstream(raw, Some(b"zgix")),
            "HTTP/1.1 200 OK\r\nVia: 1.1 origin-cache\r\nContent-Length: 0\r\nVia: 1.0 zgix\r\n\r\n"
        );
    }

    #[test]
    fn interim_heads_lose_hop_by_hop_and_framing_fields() {
        let mut out = Vec::new();
        for framing in ["Content-Length: 0", "Transfer-Encoding: chunked"] {
            let raw = format!("HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\nConnection: x-hop, close\r\nX-Hop: 1\r\nKeep-Alive: 5\r\nUpgrade: h2c\r\n{framing}\r\n\r\n");
            let head = parse_response(&raw);
            write_interim_head(&mut out, raw.as_bytes(), &head, Some(b"zgix"));
            assert_eq!(
                out,
                b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\nVia: 1.1 zgix\r\n\r\n"
            );
        }
        // An origin's bare LF line ends become CRLF.
        let raw = "HTTP/1.1 102 Processing\nX-A: 1\n\n";
        let head = parse_response(raw);
        write_interim_head(&mut out, raw.as_bytes(), &head, None);
        assert_eq!(out, b"HTTP/1.1 102 Processing\r\nX-A: 1\r\n\r\n");
    }

    #[test]
    fn interim_heads_are_parsed_as_strictly_as_final_ones() {
        let parser = ResponseParser::new(65536, 100);
        let mut head = ResponseHead::new(100);
        for status in ["103 Early Hints", "200 OK"] {
            for bad in ["X: a\r\n b", "X : a", "X: a\rb", "X: a\0b", "X\r\n"] {
                let raw = format!("HTTP/1.1 {status}\r\n{bad}\r\n\r\n");
                assert!(
                    parser
                        .parse(raw.as_bytes(), Method::Get, &mut head)
                        .is_err(),
                    "{raw:?}"
                );
            }
        }
    }

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
