//! An HTTP/2 request rendered as an HTTP/1.1 head (RFC 9113 §8.3.1: `:authority` becomes Host, the cookie fields are joined, a body without Content-Length goes chunked; connection-specific fields refused, §8.2.2): as text the request loop parses, or straight into the exchange's client buffer with its pieces' spans, taken parsed ([`render_in_place`]).

use zgix_parser::{Header, HeaderKind, RequestHead, Span};

use super::answer::HOP_BY_HOP;
/// A request the stream cannot carry as HTTP/1.1.
#[derive(Debug)]
pub(super) struct Unfit;

/// Where a rendered head goes: a growing buffer (the text the request
/// loop reads back and parses), or the exchange's client buffer, where the
/// loop takes it as already parsed ([`InPlace`]).
pub(super) trait HeadOut {
    fn put(&mut self, b: &[u8]);
    /// Bytes written so far (where the next one goes).
    fn at(&self) -> usize;
    /// Records a field line's spans.
    fn field(&mut self, _name: Span, _value: Span) {}
}

impl HeadOut for Vec<u8> {
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
    fn at(&self) -> usize {
        self.len()
    }
}

/// A head written straight into the exchange's client buffer, with the
/// spans of its pieces in the exchange's `RequestHead`, for
/// [`zgix_parser::RequestParser::assemble`]. `over`: it did not fit (the
/// buffer, or the head's field slots), and goes as text instead.
pub(super) struct InPlace<'a> {
    buf: &'a mut [u8],
    n: usize,
    fields: &'a mut Vec<Header>,
    slots: usize,
    pub(super) over: bool,
}

impl<'a> InPlace<'a> {
    /// `slots`: field lines kept at most (the parser's, so that the
    /// vector, sized for them, never grows).
    pub(super) fn new(buf: &'a mut [u8], fields: &'a mut Vec<Header>, slots: usize) -> Self {
        fields.clear();
        InPlace {
            buf,
            n: 0,
            fields,
            slots,
            over: false,
        }
    }

    /// The head's length.
    pub(super) fn len(&self) -> usize {
        self.n
    }
}

impl HeadOut for InPlace<'_> {
    fn put(&mut self, b: &[u8]) {
        match self.buf.get_mut(self.n..self.n + b.len()) {
            Some(dst) if !self.over => {
                dst.copy_from_slice(b);
                self.n += b.len();
            }
            _ => self.over = true,
        }
    }
    fn at(&self) -> usize {
        self.n
    }
    fn field(&mut self, name: Span, value: Span) {
        if self.fields.len() == self.slots {
            self.over = true;
            return;
        }
        self.fields.push(Header {
            name,
            value,
            kind: HeaderKind::Other,
        });
    }
}

/// What rendering a head found out: whether its body goes chunked, and
/// where its method and target are.
pub(super) struct Rendered {
    pub(super) chunked: bool,
    pub(super) method: Span,
    pub(super) target: Span,
}

fn span(from: usize, to: usize) -> Span {
    Span {
        start: from as u32,
        len: (to - from) as u32,
    }
}

/// Writes one field line, recording its spans.
fn field_line<O: HeadOut>(out: &mut O, name: &[u8], value: &[u8]) {
    let n0 = out.at();
    out.put(name);
    let n1 = out.at();
    out.put(b": ");
    let v0 = out.at();
    out.put(value);
    let v1 = out.at();
    out.put(b"\r\n");
    out.field(span(n0, n1), span(v0, v1));
}

/// Renders the request head as HTTP/1.1 into `out` (RFC 9113 §8.3.1:
/// `:authority` becomes Host; §8.2.2: a connection-specific field is
/// refused; §8.2.3: cookie fields are joined).
pub(super) fn render_request<O: HeadOut>(
    parts: &http::request::Parts,
    has_body: bool,
    out: &mut O,
) -> Result<Rendered, Unfit> {
    let path = match parts.uri.path_and_query() {
        Some(p) => p.as_str(),
        None if parts.method == http::Method::OPTIONS => "*",
        None => return Err(Unfit),
    };
    let m = parts.method.as_str().as_bytes();
    out.put(m);
    out.put(b" ");
    let t0 = out.at();
    out.put(path.as_bytes());
    let t1 = out.at();
    out.put(b" HTTP/1.1\r\n");
    let authority = parts.uri.authority();
    if let Some(a) = authority {
        field_line(out, b"host", a.as_str().as_bytes());
    }
    let mut length = false;
    let mut cookies = 0;
    for (name, value) in parts.headers.iter() {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) && !(n == "te" && value.as_bytes() == b"trailers") {
            return Err(Unfit);
        }
        if n == "host" && authority.is_some() {
            // :authority wins (RFC 9113 §8.3.1); a differing Host is dropped.
            continue;
        }
        if n == "cookie" {
            // Split cookie fields are one line in HTTP/1.1 (RFC 9113 §8.2.3).
            cookies += 1;
            continue;
        }
        if n == "content-length" {
            length = true;
        }
        if n == "te" {
            continue;
        }
        field_line(out, n.as_bytes(), value.as_bytes());
    }
    if cookies > 0 {
        let n0 = out.at();
        out.put(b"cookie");
        let n1 = out.at();
        out.put(b": ");
        let v0 = out.at();
        for (i, v) in parts.headers.get_all("cookie").iter().enumerate() {
            if i > 0 {
                out.put(b"; ");
            }
            out.put(v.as_bytes());
        }
        let v1 = out.at();
        out.put(b"\r\n");
        out.field(span(n0, n1), span(v0, v1));
    }
    let chunked = has_body && !length;
    if chunked {
        field_line(out, b"transfer-encoding", b"chunked");
    }
    out.put(b"\r\n");
    Ok(Rendered {
        chunked,
        method: span(0, m.len()),
        target: span(t0, t1),
    })
}

/// Renders the head straight into `buf` (the exchange's client buffer)
/// with its pieces' spans in `head`, for
/// [`zgix_parser::RequestParser::assemble`]: whether the body goes
/// chunked, or `None` when it did not fit the buffer or `slots` field
/// lines (then it goes as text).
pub(super) fn render_in_place(
    parts: &http::request::Parts,
    has_body: bool,
    buf: &mut [u8],
    head: &mut RequestHead,
    slots: usize,
) -> Result<Option<bool>, Unfit> {
    let mut out = InPlace::new(buf, &mut head.headers, slots);
    let r = render_request(parts, has_body, &mut out)?;
    if out.over {
        return Ok(None);
    }
    head.head_len = out.len();
    head.method_span = r.method;
    head.target = r.target;
    Ok(Some(r.chunked))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(b: http::request::Builder) -> http::request::Parts {
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_request_becomes_an_http11_head_with_host_one_cookie_and_chunked_framing() {
        let p = parts(
            http::Request::builder()
                .method("POST")
                .uri("https://site.example:8443/a?b=c")
                .header("host", "other.example")
                .header("cookie", "a=1")
                .header("cookie", "b=2")
                .header("te", "trailers")
                .header("x-k", "v"),
        );
        let mut out = Vec::new();
        assert!(
            render_request(&p, true, &mut out).unwrap().chunked,
            "no length: chunked"
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /a?b=c HTTP/1.1\r\nhost: site.example:8443\r\nx-k: v\r\n\
             cookie: a=1; b=2\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let p = parts(
            http::Request::builder()
                .uri("http://h/")
                .header("content-length", "3"),
        );
        let mut out = Vec::new();
        assert!(
            !render_request(&p, true, &mut out).unwrap().chunked,
            "a length stays"
        );
        let p = parts(
            http::Request::builder()
                .uri("/")
                .header("connection", "close"),
        );
        assert!(render_request(&p, false, &mut Vec::<u8>::new()).is_err());
        let p = parts(http::Request::builder().uri("/").header("te", "gzip"));
        assert!(render_request(&p, false, &mut Vec::<u8>::new()).is_err());
    }

    fn limits() -> zgix_parser::Limits {
        zgix_parser::Limits {
            max_request_line: 8192,
            max_header_bytes: 16384,
            max_headers: 16,
            max_body: 1 << 20,
        }
    }

    /// What the request loop makes of a stream's head: assembled from
    /// the in-place rendering (`None`: it went as text, or the assembler
    /// left it to the parser), and parsed from the text rendering.
    #[allow(clippy::type_complexity)]
    fn both(
        p: &http::request::Parts,
        has_body: bool,
        room: usize,
    ) -> (
        Option<Result<RequestHead, zgix_parser::ParseError>>,
        Result<RequestHead, zgix_parser::ParseError>,
    ) {
        let parser = zgix_parser::RequestParser::new(limits());
        let mut text = Vec::new();
        let chunked = render_request(p, has_body, &mut text).unwrap().chunked;
        let mut parsed = RequestHead::new(&limits());
        let want = match parser.parse(&text, &mut parsed) {
            Ok(zgix_parser::Status::Complete(())) => Ok(parsed),
            Ok(zgix_parser::Status::Partial) => panic!("a whole head is partial"),
            Err(e) => Err(e),
        };
        let mut buf = vec![0u8; room];
        let mut head = RequestHead::new(&limits());
        let slots = limits().header_slots();
        let got = match render_in_place(p, has_body, &mut buf, &mut head, slots).unwrap() {
            None => None,
            Some(c) => {
                assert_eq!(c, chunked, "the same framing");
                assert_eq!(&buf[..head.head_len], &text[..], "the same bytes");
                parser
                    .assemble(&buf, &mut head)
                    .map(|r| r.map(|()| head.clone()))
            }
        };
        (got, want)
    }

    /// A stream's head goes to the request loop parsed already (not as
    /// text to parse again), and as what the parser makes of its text:
    /// the same spans, kinds, framing, Host, canonical path, or the same
    /// refusal.
    #[test]
    fn a_streams_head_is_assembled_in_place_as_the_parser_reads_its_text() {
        let get = |uri: &str| http::Request::builder().uri(uri);
        let cases = [
            (
                get("http://a.example/x/../y?q=1").header("user-agent", "h2load"),
                false,
            ),
            (
                http::Request::builder()
                    .method("POST")
                    .uri("https://a.example:8443/up")
                    .header("cookie", "a=1")
                    .header("cookie", "b=2")
                    .header("te", "trailers")
                    .header("x-forwarded-for", "10.0.0.1"),
                true,
            ),
            (
                http::Request::builder()
                    .method("PUT")
                    .uri("http://a.example/up")
                    .header("content-length", "5"),
                true,
            ),
            (
                http::Request::builder()
                    .method("POST")
                    .uri("http://a.example/up")
                    .header("content-length", "5000000"),
                true,
            ),
            (
                get("http://a.example/").header("expect", "100-continue"),
                false,
            ),
            (get("http://a.example/").header("expect", "fancy"), false),
            (get("http://a.example/%2E%2e/a%zz"), false),
            (get("http://a.example/%2e%2e/secret"), false),
            (get("http://a.example:99999/"), false),
            (
                http::Request::builder()
                    .method("OPTIONS")
                    .uri("http://a.example"),
                false,
            ),
            (get("http://a.example/").header("x-v", "caf\u{e9}"), false),
        ];
        for (b, has_body) in cases {
            let p = parts(b);
            let (got, want) = both(&p, has_body, 4096);
            let got = got.unwrap_or_else(|| panic!("{:?} went to the parser", p.uri));
            assert_eq!(got, want, "{:?}", p.uri);
        }
    }

    /// What does not fit the buffer or the field slots goes as text, and a
    /// value the parser would trim is left to it: either way the loop
    /// parses it, as before.
    #[test]
    fn what_the_assembler_cannot_vouch_for_is_parsed_as_text() {
        let p = parts(
            http::Request::builder()
                .uri("http://a.example/")
                .header("x-a", "1"),
        );
        assert!(both(&p, false, 32).0.is_none(), "the buffer is too small");
        let mut b = http::Request::builder().uri("http://a.example/");
        for i in 0..20 {
            b = b.header(format!("x-{i}"), "v");
        }
        assert!(
            both(&parts(b), false, 4096).0.is_none(),
            "more fields than slots"
        );
        let p = parts(
            http::Request::builder()
                .uri("http://a.example/")
                .header("x-a", " lead"),
        );
        assert!(both(&p, false, 4096).0.is_none(), "a value parse trims");
    }
}
