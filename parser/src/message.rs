//! Request methods and HTTP versions.

/// HTTP version of a message; only 1.0 and 1.1 are accepted (others: 505).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.0
    Http10,
    /// HTTP/1.1
    Http11,
}

impl Version {
    /// From httparse's minor version.
    pub(crate) fn from_minor(minor: u8) -> Version {
        if minor == 0 {
            Version::Http10
        } else {
            Version::Http11
        }
    }

    /// The protocol string, e.g. `HTTP/1.1`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// A request method. Methods are case-sensitive (RFC 9110 §9.1), so `get` is [`Method::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// HEAD
    Head,
    /// POST
    Post,
    /// PUT
    Put,
    /// DELETE
    Delete,
    /// CONNECT (refused by the request parser: zgix does not tunnel)
    Connect,
    /// OPTIONS
    Options,
    /// TRACE
    Trace,
    /// PATCH
    Patch,
    /// Any other token; see `RequestHead::method_span` for its bytes.
    Other,
}

impl Method {
    /// Maps a method token.
    pub fn from_bytes(token: &[u8]) -> Method {
        match token {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"CONNECT" => Method::Connect,
            b"OPTIONS" => Method::Options,
            b"TRACE" => Method::Trace,
            b"PATCH" => Method::Patch,
            _ => Method::Other,
        }
    }

    /// Whether a request with this method may be retried on another connection
    /// (RFC 9110 §9.2.2: GET, HEAD, OPTIONS, TRACE, PUT and DELETE). Unknown methods are not.
    pub fn is_idempotent(self) -> bool {
        matches!(
            self,
            Method::Get
                | Method::Head
                | Method::Options
                | Method::Trace
                | Method::Put
                | Method::Delete
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_case_sensitive() {
        assert_eq!(Method::from_bytes(b"GET"), Method::Get);
        assert_eq!(Method::from_bytes(b"get"), Method::Other);
        assert_eq!(Method::from_bytes(b"PATCH"), Method::Patch);
        assert_eq!(Method::from_bytes(b"PROPFIND"), Method::Other);
    }

    #[test]
    fn idempotent_methods() {
        for m in [
            Method::Get,
            Method::Head,
            Method::Options,
            Method::Trace,
            Method::Put,
            Method::Delete,
        ] {
            assert!(m.is_idempotent(), "{m:?}");
        }
        for m in [Method::Post, Method::Patch, Method::Connect, Method::Other] {
            assert!(!m.is_idempotent(), "{m:?}");
        }
    }

    #[test]
    fn version_strings() {
        assert_eq!(Version::from_minor(0), Version::Http10);
        assert_eq!(Version::from_minor(1).as_str(), "HTTP/1.1");
    }
}
