//! Byte classes and list helpers shared by the head parsers (RFC 9110 §5.6, RFC 3986 §2).

/// Builds a 256-entry membership table from a list of ASCII bytes.
const fn table(members: &[u8]) -> [bool; 256] {
    let mut t = [false; 256];
    let mut i = 0;
    while i < members.len() {
        t[members[i] as usize] = true;
        i += 1;
    }
    t
}

const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// `tchar` (RFC 9110 §5.6.2): the characters of a token (field names, methods, codings).
static TCHAR: [bool; 256] = table(concat_bytes(ALNUM, b"!#$%&'*+-.^_`|~").as_slice());

/// RFC 3986 §2.3 unreserved and §2.2 sub-delims: what a reg-name may hold besides
/// pct-encoded triplets (§3.2.2).
static REG_NAME: [bool; 256] = table(concat_bytes(ALNUM, b"-._~!$&'()*+,;=").as_slice());

/// RFC 3986 §3.3 path characters: pchar (unreserved, sub-delims, ":" and "@") and "/".
/// "%" is checked separately as the start of a pct-encoded triplet.
static PATH: [bool; 256] = table(concat_bytes(ALNUM, b"-._~!$&'()*+,;=:@/").as_slice());

/// RFC 3986 §3.4 query characters (pchar, "/" and "?"), plus `[ ] { } | ^ \``: the URL
/// Standard's query percent-encode set leaves those raw, so browsers send them unencoded in
/// queries and refusing them would refuse real traffic. The path stays strict.
static QUERY: [bool; 256] = table(concat_bytes(ALNUM, b"-._~!$&'()*+,;=:@/?[]{}|^`").as_slice());

/// Concatenates two byte strings at compile time into a fixed buffer (for the tables above).
const fn concat_bytes(a: &[u8], b: &[u8]) -> ConstBytes {
    let mut out = ConstBytes {
        buf: [0; 128],
        len: 0,
    };
    let mut i = 0;
    while i < a.len() {
        out.buf[out.len] = a[i];
        out.len += 1;
        i += 1;
    }
    let mut j = 0;
    while j < b.len() {
        out.buf[out.len] = b[j];
        out.len += 1;
        j += 1;
    }
    out
}

struct ConstBytes {
    buf: [u8; 128],
    len: usize,
}

impl ConstBytes {
    const fn as_slice(&self) -> &[u8] {
        self.buf.split_at(self.len).0
    }
}

/// Whether `b` is a tchar.
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[b as usize]
}

/// Whether `s` is a non-empty token (RFC 9110 §5.6.2).
pub fn is_token(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&b| is_tchar(b))
}

/// Whether `b` may appear in a field value (RFC 9110 §5.5: VCHAR, obs-text, SP, HTAB).
pub fn is_field_vchar(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
}

/// Strips optional whitespace (RFC 9110 §5.6.3 OWS: SP / HTAB) from both ends.
pub(crate) fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// The value of one hex digit (RFC 5234 HEXDIG, either case).
pub(crate) fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The elements of a comma-separated list field value (RFC 9110 §5.6.1), OWS-trimmed.
/// Empty elements are yielded too; each caller decides whether they are tolerable.
pub(crate) fn list_elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(trim_ows)
}

/// Checks bytes of a URI component against `class`, with "%" allowed only as the start of a
/// pct-encoded triplet (RFC 3986 §2.1). A lone "%" is refused: origins decode it differently.
fn valid_component(s: &[u8], class: &[bool; 256]) -> bool {
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if b == b'%' {
            if i + 2 >= s.len() {
                return false;
            }
            if !s[i + 1].is_ascii_hexdigit() || !s[i + 2].is_ascii_hexdigit() {
                return false;
            }
            i += 3;
        } else if class[b as usize] {
            i += 1;
        } else {
            return false;
        }
    }
    true
}

/// RFC 3986 §3.3 path-abempty / absolute-path characters.
pub(crate) fn valid_path(s: &[u8]) -> bool {
    valid_component(s, &PATH)
}

/// RFC 3986 §3.4 query characters, with the browser leniency described at [`QUERY`].
pub(crate) fn valid_query(s: &[u8]) -> bool {
    valid_component(s, &QUERY)
}

/// RFC 3986 §3.2.2 reg-name (which also covers IPv4address).
fn valid_reg_name(s: &[u8]) -> bool {
    valid_component(s, &REG_NAME)
}

/// RFC 3986 §3.2.2 IP-literal, the part between "[" and "]": an IPv6address or an
/// IPvFuture (`"v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" )`).
fn valid_ip_literal(s: &[u8]) -> bool {
    match s {
        [b'v' | b'V', rest @ ..] => {
            let Some(dot) = rest.iter().position(|&b| b == b'.') else {
                return false;
            };
            let (ver, tail) = (&rest[..dot], &rest[dot + 1..]);
            !ver.is_empty()
                && ver.iter().all(u8::is_ascii_hexdigit)
                && !tail.is_empty()
                && tail.iter().all(|&b| b == b':' || REG_NAME[b as usize])
        }
        _ => std::str::from_utf8(s)
            .ok()
            .and_then(|t| t.parse::<std::net::Ipv6Addr>().ok())
            .is_some(),
    }
}

/// RFC 3986 §3.2.2-§3.2.3 `host [ ":" port ]`, as used by the Host field (RFC 9110 §7.2) and
/// the authority of an absolute-form target. The host may be empty (RFC 9112 §3.2 has clients
/// send an empty Host when the target has no authority); callers that need a host check that.
/// The port, when present, must be decimal and at most 65535.
pub(crate) fn valid_host_port(s: &[u8]) -> bool {
    let (host, port) = if let [b'[', rest @ ..] = s {
        let Some(close) = rest.iter().position(|&b| b == b']') else {
            return false;
        };
        if !valid_ip_literal(&rest[..close]) {
            return false;
        }
        match &rest[close + 1..] {
            [] => return true,
            [b':', port @ ..] => (&s[..0], port),
            _ => return false,
        }
    } else {
        match s.iter().position(|&b| b == b':') {
            Some(colon) => (&s[..colon], &s[colon + 1..]),
            None => (s, &s[..0]),
        }
    };
    valid_reg_name(host) && valid_port(port)
}

/// RFC 3986 §3.2.3 `port = *DIGIT`, bounded to the TCP range.
fn valid_port(port: &[u8]) -> bool {
    port.len() <= 5
        && port.iter().all(u8::is_ascii_digit)
        && port.iter().fold(0u32, |n, &d| n * 10 + u32::from(d - b'0')) <= 65535
}

/// The host part of an already validated `host [ ":" port ]`.
pub(crate) fn host_part(s: &[u8]) -> &[u8] {
    if s.first() == Some(&b'[') {
        let close = s.iter().position(|&b| b == b']').unwrap_or(s.len() - 1);
        &s[..=close]
    } else {
        s.split(|&b| b == b':').next().unwrap_or(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        assert!(is_token(b"chunked"));
        assert!(is_token(b"X-Custom_1!"));
        assert!(!is_token(b""));
        assert!(!is_token(b"a b"));
        assert!(!is_token(b"a:b"));
        assert!(!is_token(b"a\"b"));
    }

    #[test]
    fn trimming_and_lists() {
        assert_eq!(trim_ows(b" \t a b \t"), b"a b");
        assert_eq!(trim_ows(b"   "), b"");
        let v: Vec<&[u8]> = list_elements(b"a, b ,,c").collect();
        assert_eq!(v, [&b"a"[..], b"b", b"", b"c"]);
    }

    #[test]
    fn pct_encoding_must_be_complete() {
        assert!(valid_path(b"/a%2Fb"));
        assert!(!valid_path(b"/a%2"));
        assert!(!valid_path(b"/a%"));
        assert!(!valid_path(b"/a%zz"));
        assert!(!valid_query(b"q=100%"));
    }

    #[test]
    fn path_and_query_classes() {
        assert!(valid_path(b"/a/b;c=d/@x:y/~z!$&'()*+,="));
        assert!(!valid_path(b"/a\\b"));
        assert!(!valid_path(b"/a b"));
        assert!(!valid_path(b"/a#b"));
        assert!(!valid_path(b"/a{b}"));
        assert!(!valid_path(b"/caf\xc3\xa9"));
        assert!(valid_query(b"a[]=1&b={x}|^`&c=/?"));
        assert!(!valid_query(b"a=\"b\""));
        assert!(!valid_query(b"a=<b>"));
        assert!(!valid_query(b"a#b"));
        assert!(!valid_query(b"a\\b"));
    }

    #[test]
    fn hosts() {
        for ok in [
            &b"example.com"[..],
            b"example.com:8080",
            b"127.0.0.1",
            b"127.0.0.1:80",
            b"[::1]",
            b"[::1]:443",
            b"[v1.fe80::a+en1]",
            b"ex%41mple.com",
            b"",
            b"a:",
            b"a:65535",
        ] {
            assert!(valid_host_port(ok), "{:?}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &b"a b"[..],
            b"a:b",
            b"a:65536",
            b"a:123456",
            b"[::1",
            b"[::1]x",
            b"[zz]",
            b"a@b",
            b"a/b",
            b"a:1:2",
            b"%zz",
            b"[v.x]",
        ] {
            assert!(!valid_host_port(bad), "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(host_part(b"a.com:80"), b"a.com");
        assert_eq!(host_part(b"[::1]:80"), b"[::1]");
        assert_eq!(host_part(b"a.com"), b"a.com");
    }
}
