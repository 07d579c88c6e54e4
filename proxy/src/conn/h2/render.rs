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

/// A request's head as the codec decoded it (RFC 9113 §8.3.1), or as a
/// test writes it: `fields` iterated once for the lines, once for cookies.
#[derive(Copy, Clone)]
pub(super) struct Req<'a, F> {
    pub method: &'a [u8],
    pub authority: Option<&'a [u8]>,
    pub path: Option<&'a [u8]>,
    pub fields: F,
}

impl<'a> Req<'a, zgix_h2::server::Fields<'a>> {
    pub(super) fn of(h: &zgix_h2::server::RequestHead<'a>) -> Self {
        Req {
            method: h.method,
            authority: h.authority,
            path: h.path,
            fields: h.fields,
        }
    }
}

/// Bytes a request target or authority may hold on an HTTP/1.1 request
/// line: visible ASCII (RFC 9112 §3.2; anything else is malformed, §8.1.1).
fn visible(b: &[u8]) -> bool {
    b.iter().all(|&c| c > 0x20 && c < 0x7f)
}

fn token(b: &[u8]) -> bool {
    !b.is_empty()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c))
}

/// Renders the request head as HTTP/1.1 into `out` (RFC 9113 §8.3.1:
/// `:authority` becomes Host; §8.2.2: a connection-specific field is
/// refused; §8.2.3: cookie fields are joined).
pub(super) fn render_request<'a, F, O>(
    req: &Req<'a, F>,
    has_body: bool,
    out: &mut O,
) -> Result<Rendered, Unfit>
where
    F: Copy + IntoIterator<Item = (&'a [u8], &'a [u8])>,
    O: HeadOut,
{
    let m = req.method;
    let path = match req.path {
        Some(p) if !p.is_empty() => p,
        None if m == b"OPTIONS" => b"*",
        // CONNECT (§8.5) has no path: HTTP/1.1 here carries no tunnel.
        _ => return Err(Unfit),
    };
    if !token(m) || !visible(path) || !req.authority.is_none_or(visible) {
        return Err(Unfit);
    }
    out.put(m);
    out.put(b" ");
    let t0 = out.at();
    out.put(path);
    let t1 = out.at();
    out.put(b" HTTP/1.1\r\n");
    let authority = req.authority.filter(|a| !a.is_empty());
    if let Some(a) = authority {
        field_line(out, b"host", a);
    }
    let mut length = false;
    let mut cookies = 0;
    for (n, value) in req.fields {
        let hop = HOP_BY_HOP.iter().any(|h| h.as_bytes() == n);
        if hop && !(n == b"te" && value == b"trailers") {
            return Err(Unfit);
        }
        if n == b"host" && authority.is_some() {
            // :authority wins (RFC 9113 §8.3.1); a differing Host is dropped.
            continue;
        }
        if n == b"cookie" {
            // Split cookie fields are one line in HTTP/1.1 (RFC 9113 §8.2.3).
            cookies += 1;
            continue;
        }
        if n == b"content-length" {
            length = true;
        }
        if n == b"te" {
            continue;
        }
        field_line(out, n, value);
    }
    if cookies > 0 {
        let n0 = out.at();
        out.put(b"cookie");
        let n1 = out.at();
        out.put(b": ");
        let v0 = out.at();
        let mut i = 0;
        for (n, v) in req.fields {
            if n != b"cookie" {
                continue;
            }
            if i > 0 {
                out.put(b"; ");
            }
            i += 1;
            out.put(v);
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
pub(super) fn render_in_place<'a, F>(
    req: &Req<'a, F>,
    has_body: bool,
    buf: &mut [u8],
    head: &mut RequestHead,
    slots: usize,
) -> Result<Option<bool>, Unfit>
where
    F: Copy + IntoIterator<Item = (&'a [u8], &'a [u8])>,
{
    let mut out = InPlace::new(buf, &mut head.headers, slots);
    let r = render_request(req, has_body, &mut out)?;
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

    /// A request as a test writes it: a method, a URI (its authority and
    /// path become the pseudo-headers) and fields.
    #[derive(Clone)]
    struct B {
        method: String,
        uri: String,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
    }

    struct Builder;

    impl Builder {
        fn builder() -> B {
            B {
                method: "GET".into(),
                uri: "/".into(),
                fields: Vec::new(),
            }
        }
    }

    impl B {
        fn method(mut self, m: &str) -> B {
            self.method = m.into();
            self
        }
        fn uri(mut self, u: &str) -> B {
            self.uri = u.into();
            self
        }
        fn header(mut self, n: impl AsRef<str>, v: &str) -> B {
            self.fields
                .push((n.as_ref().as_bytes().to_vec(), v.as_bytes().to_vec()));
            self
        }
    }

    /// The fields of a [`B`] as the renderer iterates them.
    #[derive(Copy, Clone)]
    struct L<'a>(&'a [(&'a [u8], &'a [u8])]);

    impl<'a> IntoIterator for L<'a> {
        type Item = (&'a [u8], &'a [u8]);
        type IntoIter = std::iter::Copied<std::slice::Iter<'a, (&'a [u8], &'a [u8])>>;
        fn into_iter(self) -> Self::IntoIter {
            self.0.iter().copied()
        }
    }

    /// `f` with the request as the codec would hand it over.
    fn with<R>(b: &B, f: impl FnOnce(&Req<'_, L<'_>>) -> R) -> R {
        let (authority, path) = match b.uri.split_once("://") {
            Some((_, rest)) => match rest.find('/') {
                Some(at) => (Some(&rest[..at]), Some(&rest[at..])),
                None => (Some(rest), None),
            },
            None => (None, Some(b.uri.as_str())),
        };
        let pairs: Vec<(&[u8], &[u8])> = b
            .fields
            .iter()
            .map(|(n, v)| (n.as_slice(), v.as_slice()))
            .collect();
        let r = Req {
            method: b.method.as_bytes(),
            authority: authority.map(str::as_bytes),
            path: path.map(str::as_bytes),
            fields: L(&pairs),
        };
        f(&r)
    }

    fn render(b: &B, has_body: bool, out: &mut Vec<u8>) -> Result<Rendered, Unfit> {
        with(b, |r| render_request(r, has_body, out))
    }

    #[test]
    fn a_request_becomes_an_http11_head_with_host_one_cookie_and_chunked_framing() {
        let p = Builder::builder()
            .method("POST")
            .uri("https://site.example:8443/a?b=c")
            .header("host", "other.example")
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .header("te", "trailers")
            .header("x-k", "v");
        let mut out = Vec::new();
        assert!(
            render(&p, true, &mut out).unwrap().chunked,
            "no length: chunked"
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /a?b=c HTTP/1.1\r\nhost: site.example:8443\r\nx-k: v\r\n\
             cookie: a=1; b=2\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let p = Builder::builder()
            .uri("http://h/")
            .header("content-length", "3");
        let mut out = Vec::new();
        assert!(
            !render(&p, true, &mut out).unwrap().chunked,
            "a length stays"
        );
        let p = Builder::builder().uri("/").header("connection", "close");
        assert!(render(&p, false, &mut Vec::new()).is_err());
        let p = Builder::builder().uri("/").header("te", "gzip");
        assert!(render(&p, false, &mut Vec::new()).is_err());
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
        p: &B,
        has_body: bool,
        room: usize,
    ) -> (
        Option<Result<RequestHead, zgix_parser::ParseError>>,
        Result<RequestHead, zgix_parser::ParseError>,
    ) {
        let parser = zgix_parser::RequestParser::new(limits());
        let mut text = Vec::new();
        let chunked = render(p, has_body, &mut text).unwrap().chunked;
        let mut parsed = RequestHead::new(&limits());
        let want = match parser.parse(&text, &mut parsed) {
            Ok(zgix_parser::Status::Complete(())) => Ok(parsed),
            Ok(zgix_parser::Status::Partial) => panic!("a whole head is partial"),
            Err(e) => Err(e),
        };
        let mut buf = vec![0u8; room];
        let mut head = RequestHead::new(&limits());
        let slots = limits().header_slots();
        let placed = with(p, |r| {
            render_in_place(r, has_body, &mut buf, &mut head, slots)
        });
        let got = match placed.unwrap() {
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
        let get = |uri: &str| Builder::builder().uri(uri);
        let cases = [
            (
                get("http://a.example/x/../y?q=1").header("user-agent", "h2load"),
                false,
            ),
            (
                Builder::builder()
                    .method("POST")
                    .uri("https://a.example:8443/up")
                    .header("cookie", "a=1")
                    .header("cookie", "b=2")
                    .header("te", "trailers")
                    .header("x-forwarded-for", "10.0.0.1"),
                true,
            ),
            (
                Builder::builder()
                    .method("PUT")
                    .uri("http://a.example/up")
                    .header("content-length", "5"),
                true,
            ),
            (
                Builder::builder()
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
                Builder::builder().method("OPTIONS").uri("http://a.example"),
                false,
            ),
            (get("http://a.example/").header("x-v", "caf\u{e9}"), false),
        ];
        for (b, has_body) in cases {
            let p = b;
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
        let p = Builder::builder()
            .uri("http://a.example/")
            .header("x-a", "1");
        assert!(both(&p, false, 32).0.is_none(), "the buffer is too small");
        let mut b = Builder::builder().uri("http://a.example/");
        for i in 0..20 {
            b = b.header(format!("x-{i}"), "v");
        }
        assert!(both(&b, false, 4096).0.is_none(), "more fields than slots");
        let p = Builder::builder()
            .uri("http://a.example/")
            .header("x-a", " lead");
        assert!(both(&p, false, 4096).0.is_none(), "a value parse trims");
    }
}
