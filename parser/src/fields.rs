//! Header fields as spans, their kinds, and the framing summary both head parsers build.

use crate::span::Span;
use crate::syntax::{is_token, list_elements, trim_ows};

/// What a field means to the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderKind {
    /// An end-to-end field the proxy forwards untouched.
    Other,
    /// Host (RFC 9110 §7.2).
    Host,
    /// Content-Length (RFC 9110 §8.6).
    ContentLength,
    /// Transfer-Encoding (RFC 9112 §6.1).
    TransferEncoding,
    /// Connection (RFC 9110 §7.6.1); hop-by-hop itself.
    Connection,
    /// A hop-by-hop field the proxy must not forward (RFC 9110 §7.6.1): Keep-Alive, TE,
    /// Trailer, Upgrade, Proxy-Connection, and any otherwise [`HeaderKind::Other`] field named
    /// in a Connection field. Fields with their own kind keep it even when named in
    /// Connection: `Connection: Content-Length` must not make the proxy drop the framing it
    /// parsed (a known smuggling trick), and Host / Expect / X-Forwarded-For are handled
    /// explicitly by the proxy.
    HopByHop,
    /// Expect (RFC 9110 §10.1.1).
    Expect,
    /// X-Forwarded-For.
    XForwardedFor,
}

/// One field line: spans of its name and (OWS-trimmed) value in the parsed buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The field name as sent (case preserved).
    pub name: Span,
    /// The field value without leading and trailing whitespace.
    pub value: Span,
    /// What the field means to the proxy.
    pub kind: HeaderKind,
}

impl HeaderKind {
    /// Classifies a field name (case-insensitive, RFC 9110 §5.1).
    pub fn of(name: &[u8]) -> HeaderKind {
        // Dispatch on length first: most names miss every comparison on it.
        let is = |known: &str| name.eq_ignore_ascii_case(known.as_bytes());
        match name.len() {
            4 if is("host") => HeaderKind::Host,
            14 if is("content-length") => HeaderKind::ContentLength,
            17 if is("transfer-encoding") => HeaderKind::TransferEncoding,
            10 if is("connection") => HeaderKind::Connection,
            6 if is("expect") => HeaderKind::Expect,
            15 if is("x-forwarded-for") => HeaderKind::XForwardedFor,
            10 if is("keep-alive") => HeaderKind::HopByHop,
            2 if is("te") => HeaderKind::HopByHop,
            7 if is("trailer") => HeaderKind::HopByHop,
            7 if is("upgrade") => HeaderKind::HopByHop,
            16 if is("proxy-connection") => HeaderKind::HopByHop,
            _ => HeaderKind::Other,
        }
    }
}

/// Transfer codings zgix knows (RFC 9112 §7 and the IANA registry, plus `identity`).
/// Anything else is refused 501 on requests (RFC 9112 §6.1).
const KNOWN_CODINGS: [&str; 6] = [
    "gzip",
    "x-gzip",
    "deflate",
    "compress",
    "x-compress",
    "identity",
];

/// What the framing-relevant fields of one head say, before any decision.
#[derive(Debug, Default)]
pub(crate) struct Fields {
    /// The agreed Content-Length, if any field carried one.
    pub content_length: Option<u64>,
    /// Some Content-Length element was not 1*DIGIT, overflowed u64, or disagreed with
    /// another (RFC 9112 §6.3 rule 5).
    pub content_length_invalid: bool,
    /// At least one Transfer-Encoding field.
    pub te_present: bool,
    /// The last coding listed was `chunked`.
    pub te_final_chunked: bool,
    /// `chunked` was listed more than once (RFC 9112 §6.1 forbids it).
    pub te_chunked_twice: bool,
    /// A coding outside [`KNOWN_CODINGS`] and `chunked`.
    pub te_unknown: bool,
    /// An empty element, a non-token coding name, or parameters on `chunked`.
    pub te_invalid: bool,
    /// Number of Host fields, and the value of the last.
    pub host_count: usize,
    /// Value of the (last) Host field.
    pub host: Option<Span>,
    /// `close` among the Connection options.
    pub conn_close: bool,
    /// `keep-alive` among the Connection options.
    pub conn_keep_alive: bool,
    /// A Connection element that is not a token.
    pub conn_invalid: bool,
    /// At least one Expect field.
    pub expect_present: bool,
    /// Every Expect value was exactly `100-continue` (case-insensitive, RFC 9110 §10.1.1).
    pub expect_all_continue: bool,
}

impl Fields {
    /// Walks `headers` (spans into `buf`) once to summarise framing, then once more per
    /// Connection field to reclassify the fields it names as [`HeaderKind::HopByHop`].
    pub(crate) fn scan(buf: &[u8], headers: &mut [Header]) -> Fields {
        let mut f = Fields {
            expect_all_continue: true,
            ..Fields::default()
        };
        let mut chunked_seen = false;
        let mut any_connection = false;
        for h in headers.iter() {
            let value = h.value.get(buf);
            match h.kind {
                HeaderKind::Host => {
                    f.host_count += 1;
                    f.host = Some(h.value);
                }
                HeaderKind::ContentLength => f.content_length_field(value),
                HeaderKind::TransferEncoding => {
                    f.te_present = true;
                    for element in list_elements(value) {
                        // transfer-coding = token *( OWS ";" OWS transfer-parameter )
                        // (RFC 9112 §7). Parameters of known codings are not interpreted.
                        let mut parts = element.splitn(2, |&b| b == b';');
                        let name = trim_ows(parts.next().unwrap_or_default());
                        let has_params = parts.next().is_some();
                        if !is_token(name) {
                            // An empty element ("chunked,") is legal list syntax
                            // (RFC 9110 §5.6.1) but framing is no place for tolerance.
                            f.te_invalid = true;
                            continue;
                        }
                        if name.eq_ignore_ascii_case(b"chunked") {
                            // chunked defines no parameters (RFC 9112 §7.1).
                            f.te_invalid |= has_params;
                            f.te_chunked_twice |= chunked_seen;
                            chunked_seen = true;
                            f.te_final_chunked = true;
                        } else {
                            f.te_final_chunked = false;
                            f.te_unknown |= !KNOWN_CODINGS
                                .iter()
                                .any(|c| name.eq_ignore_ascii_case(c.as_bytes()));
                        }
                    }
                }
                HeaderKind::Connection => {
                    any_connection = true;
                    for option in list_elements(value) {
                        if option.is_empty() {
                            // RFC 9110 §5.6.1: recipients ignore empty list elements.
                            continue;
                        }
                        if !is_token(option) {
                            f.conn_invalid = true;
                        } else if option.eq_ignore_ascii_case(b"close") {
                            f.conn_close = true;
                        } else if option.eq_ignore_ascii_case(b"keep-alive") {
                            f.conn_keep_alive = true;
                        }
                    }
                }
                HeaderKind::Expect => {
                    f.expect_present = true;
                    f.expect_all_continue &= value.eq_ignore_ascii_case(b"100-continue");
                }
                _ => {}
            }
        }
        if any_connection {
            mark_connection_options(buf, headers);
        }
        f
    }

    /// One Content-Length field: `1*DIGIT`, or a list of identical ones, which RFC 9112
    /// §6.3 rule 5 lets a recipient reduce to one value. Anything else is invalid framing.
    fn content_length_field(&mut self, value: &[u8]) {
        for element in list_elements(value) {
            match parse_decimal(element) {
                Some(n) if self.content_length.unwrap_or(n) == n => {
                    self.content_length = Some(n);
                }
                _ => self.content_length_invalid = true,
            }
        }
    }
}

/// RFC 9110 §8.6 `Content-Length = 1*DIGIT`: no sign, no whitespace, no overflow.
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &d| {
        if d.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

/// RFC 9110 §7.6.1: "a proxy or gateway MUST parse a received Connection header field before
/// a message is forwarded and, for each connection-option in this field, remove any header or
/// trailer field(s) from the message with the same name as the connection-option". Marks
/// those fields [`HeaderKind::HopByHop`]; fields with a kind of their own keep it (see
/// [`HeaderKind::HopByHop`]). Quadratic in the worst case, bounded by the header count.
fn mark_connection_options(buf: &[u8], headers: &mut [Header]) {
    for i in 0..headers.len() {
        if headers[i].kind != HeaderKind::Connection {
            continue;
        }
        let value = headers[i].value.get(buf);
        for option in list_elements(value) {
            if option.is_empty() {
                continue;
            }
            for h in headers.iter_mut() {
                if h.kind == HeaderKind::Other && h.name.get(buf).eq_ignore_ascii_case(option) {
                    h.kind = HeaderKind::HopByHop;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        assert_eq!(HeaderKind::of(b"HOST"), HeaderKind::Host);
        assert_eq!(HeaderKind::of(b"content-length"), HeaderKind::ContentLength);
        assert_eq!(
            HeaderKind::of(b"Transfer-Encoding"),
            HeaderKind::TransferEncoding
        );
        assert_eq!(HeaderKind::of(b"Connection"), HeaderKind::Connection);
        assert_eq!(HeaderKind::of(b"Keep-Alive"), HeaderKind::HopByHop);
        assert_eq!(HeaderKind::of(b"TE"), HeaderKind::HopByHop);
        assert_eq!(HeaderKind::of(b"Trailer"), HeaderKind::HopByHop);
        assert_eq!(HeaderKind::of(b"Upgrade"), HeaderKind::HopByHop);
        assert_eq!(HeaderKind::of(b"Proxy-Connection"), HeaderKind::HopByHop);
        assert_eq!(HeaderKind::of(b"Expect"), HeaderKind::Expect);
        assert_eq!(
            HeaderKind::of(b"X-Forwarded-For"),
            HeaderKind::XForwardedFor
        );
        assert_eq!(HeaderKind::of(b"Accept"), HeaderKind::Other);
        assert_eq!(HeaderKind::of(b"Hosts"), HeaderKind::Other);
    }

    #[test]
    fn decimal() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"007"), Some(7));
        assert_eq!(parse_decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_decimal(b"18446744073709551616"), None);
        assert_eq!(parse_decimal(b"+5"), None);
        assert_eq!(parse_decimal(b"-5"), None);
        assert_eq!(parse_decimal(b"5a"), None);
        assert_eq!(parse_decimal(b"0x5"), None);
        assert_eq!(parse_decimal(b""), None);
    }
}
