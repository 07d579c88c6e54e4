//! The request-target forms of RFC 9112 §3.2, split into path, query and authority spans.

use crate::error::ParseError;
use crate::message::Method;
use crate::span::Span;
use crate::syntax::{host_part, valid_host_port, valid_path, valid_query};

/// The parts of a request-target, as spans into the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// Raw path; for absolute-form with an empty path, a span holding a lone "/" elsewhere in
    /// the request line (see [`parse_target`]).
    pub path: Span,
    /// Raw query without the "?".
    pub query: Option<Span>,
    /// `host[:port]` of an absolute-form target.
    pub authority: Option<Span>,
    /// asterisk-form.
    pub asterisk: bool,
}

/// Splits and validates `buf[target]`.
///
/// `slash` is the offset of some "/" byte in `buf` (the one in "HTTP/1.x"): RFC 9112 §3.2.2
/// says an absolute-form target with an empty path means "/", and spans can only point into
/// the buffer, so an empty path is reported as a span over that byte.
///
/// Forms (RFC 9112 §3.2):
/// - origin-form `absolute-path [ "?" query ]` (§3.2.1), for every method but CONNECT;
/// - absolute-form (§3.2.2) with an `http` or `https` scheme only: zgix is not a forward
///   proxy for other schemes. Userinfo is refused (RFC 9110 §4.2.4: a recipient SHOULD treat
///   it as an error; it hides the real host from naive log readers) and so is an empty host
///   (RFC 9110 §4.2.1: a recipient MUST reject an http URI with an empty host);
/// - asterisk-form `*` (§3.2.4) only with OPTIONS;
/// - authority-form (§3.2.3) is only for CONNECT, and zgix does not tunnel, so CONNECT is
///   refused as Malformed whatever its target.
///
/// A fragment ("#") is never part of a request-target (RFC 9112 §3.2: the target is built
/// from the URI "excluding any fragment"), and every byte must be a URI character
/// (RFC 3986 §3.3, §3.4); both refusals are Malformed.
pub(crate) fn parse_target(
    buf: &[u8],
    target: Span,
    method: Method,
    slash: usize,
) -> Result<Target, ParseError> {
    let raw = target.get(buf);
    let base = target.start as usize;
    if method == Method::Connect {
        return Err(ParseError::Malformed);
    }
    if raw == b"*" {
        if method != Method::Options {
            return Err(ParseError::Malformed);
        }
        return Ok(Target {
            path: target,
            query: None,
            authority: None,
            asterisk: true,
        });
    }
    // Offset of the path within `raw`, and of the authority for absolute-form.
    let (path_at, authority) = if raw.first() == Some(&b'/') {
        (0, None)
    } else {
        let after_scheme = scheme_len(raw).ok_or(ParseError::Malformed)?;
        let rest = &raw[after_scheme..];
        let auth_len = rest
            .iter()
            .position(|&b| b == b'/' || b == b'?')
            .unwrap_or(rest.len());
        let auth = &rest[..auth_len];
        if auth.contains(&b'@') || !valid_host_port(auth) || host_part(auth).is_empty() {
            return Err(ParseError::Malformed);
        }
        (
            after_scheme + auth_len,
            Some(Span::at(base + after_scheme, auth_len)),
        )
    };
    let rest = &raw[path_at..];
    let (path, query) = match rest.iter().position(|&b| b == b'?') {
        Some(q) => (&rest[..q], Some(&rest[q + 1..])),
        None => (rest, None),
    };
    if !valid_path(path) || query.is_some_and(|q| !valid_query(q)) {
        return Err(ParseError::Malformed);
    }
    let path = if path.is_empty() {
        Span::at(slash, 1)
    } else {
        Span::at(base + path_at, path.len())
    };
    Ok(Target {
        path,
        query: query.map(|q| Span::of(buf, q)),
        authority,
        asterisk: false,
    })
}

/// Length of `http://` or `https://` (scheme case-insensitive, RFC 3986 §3.1) at the start of
/// `raw`, or None for any other scheme or form.
fn scheme_len(raw: &[u8]) -> Option<usize> {
    for scheme in [&b"http://"[..], b"https://"] {
        if raw.len() >= scheme.len() && raw[..scheme.len()].eq_ignore_ascii_case(scheme) {
            return Some(scheme.len());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `target` as it would sit in a request line, returning the texts of the parts.
    fn parse(
        method: Method,
        target: &str,
    ) -> Result<(String, Option<String>, Option<String>), ParseError> {
        let line = format!("X {target} HTTP/1.1");
        let buf = line.as_bytes();
        let span = Span::at(2, target.len());
        let slash = line.rfind('/').unwrap();
        let t = parse_target(buf, span, method, slash)?;
        let text = |s: Span| String::from_utf8(s.get(buf).to_vec()).unwrap();
        Ok((text(t.path), t.query.map(text), t.authority.map(text)))
    }

    fn ok(
        path: &str,
        query: Option<&str>,
        authority: Option<&str>,
    ) -> (String, Option<String>, Option<String>) {
        (
            path.into(),
            query.map(Into::into),
            authority.map(Into::into),
        )
    }

    #[test]
    fn origin_form() {
        assert_eq!(parse(Method::Get, "/"), Ok(ok("/", None, None)));
        assert_eq!(
            parse(Method::Get, "/a/b?x=1&y"),
            Ok(ok("/a/b", Some("x=1&y"), None))
        );
        assert_eq!(parse(Method::Get, "/a?"), Ok(ok("/a", Some(""), None)));
        assert_eq!(
            parse(Method::Get, "/a?b?c"),
            Ok(ok("/a", Some("b?c"), None))
        );
        assert_eq!(parse(Method::Post, "//x"), Ok(ok("//x", None, None)));
    }

    #[test]
    fn absolute_form() {
        assert_eq!(
            parse(Method::Get, "http://example.com:8080/a?b"),
            Ok(ok("/a", Some("b"), Some("example.com:8080")))
        );
        assert_eq!(
            parse(Method::Get, "HTTPS://[::1]/"),
            Ok(ok("/", None, Some("[::1]")))
        );
        // An empty path means "/" (RFC 9112 §3.2.2); the span is the slash of "HTTP/1.1".
        assert_eq!(
            parse(Method::Get, "http://a.com"),
            Ok(ok("/", None, Some("a.com")))
        );
        assert_eq!(
            parse(Method::Get, "http://a.com?q"),
            Ok(ok("/", Some("q"), Some("a.com")))
        );
    }

    #[test]
    fn refused_targets() {
        for (method, target) in [
            (Method::Get, "a/b"),
            (Method::Get, "ftp://a.com/"),
            (Method::Get, "http:/a.com/"),
            (Method::Get, "http://"),
            (Method::Get, "http:///a"),
            (Method::Get, "http://:80/a"),
            (Method::Get, "http://user@a.com/"),
            (Method::Get, "http://a b/"),
            (Method::Get, "http://a.com:x/"),
            (Method::Get, "/a#frag"),
            (Method::Get, "/a\\b"),
            (Method::Get, "/a%zz"),
            (Method::Get, "/a?b#c"),
            (Method::Get, "*"),
            (Method::Connect, "a.com:443"),
            (Method::Connect, "/"),
            (Method::Options, "a.com:443"),
        ] {
            assert_eq!(
                parse(method, target),
                Err(ParseError::Malformed),
                "{method:?} {target}"
            );
        }
    }

    #[test]
    fn asterisk_form() {
        assert_eq!(parse(Method::Options, "*"), Ok(ok("*", None, None)));
    }
}
