//! A decoded header block checked as a request or as trailers (RFC 9113 §8.1, §8.2, §8.3), its fields copied into the connection's scratch buffer, and the borrowed views the caller gets: [`RequestHead`] and [`Fields`].

/// A request's pseudo-headers and fields, borrowed from the connection for
/// the time of the event.
#[derive(Debug)]
pub struct RequestHead<'a> {
    pub method: &'a [u8],
    pub scheme: Option<&'a [u8]>,
    pub authority: Option<&'a [u8]>,
    pub path: Option<&'a [u8]>,
    /// `:protocol` (RFC 8441): always `None`, since the server does not send
    /// SETTINGS_ENABLE_CONNECT_PROTOCOL and refuses it.
    pub protocol: Option<&'a [u8]>,
    /// The content-length field's value, checked against the DATA (§8.1.1).
    pub content_length: Option<u64>,
    /// The regular fields, in order.
    pub fields: Fields<'a>,
}

/// Regular fields, in order: records of a 4-byte name length, a 4-byte
/// value length, the name, the value.
#[derive(Copy, Clone)]
pub struct Fields<'a> {
    buf: &'a [u8],
}

impl std::fmt::Debug for Fields<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.iter()
                    .map(|(n, v)| (String::from_utf8_lossy(n), String::from_utf8_lossy(v))),
            )
            .finish()
    }
}

impl<'a> Fields<'a> {
    pub fn iter(&self) -> FieldsIter<'a> {
        FieldsIter { buf: self.buf }
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The first field named `name` (lowercase).
    pub fn get(&self, name: &[u8]) -> Option<&'a [u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

impl<'a> IntoIterator for Fields<'a> {
    type Item = (&'a [u8], &'a [u8]);
    type IntoIter = FieldsIter<'a>;
    fn into_iter(self) -> FieldsIter<'a> {
        self.iter()
    }
}

pub struct FieldsIter<'a> {
    buf: &'a [u8],
}

impl<'a> Iterator for FieldsIter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.buf;
        let n = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
        let v = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?) as usize;
        let name = b.get(8..8 + n)?;
        let value = b.get(8 + n..8 + n + v)?;
        self.buf = &b[8 + n + v..];
        Some((name, value))
    }
}

/// Lowercase token characters (RFC 9110 §5.6.2): what a field name may hold (§8.2.1).
const NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_lowercase()
            || b.is_ascii_digit()
            || matches!(
                b,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        c += 1;
    }
    t
};

/// §8.2.1: no NUL, CR or LF, and no SP or HTAB at either end. Eight bytes
/// a step: a byte of `w` is one of the three when a byte of `w`, `w ^ CR`
/// or `w ^ LF` is zero.
#[inline]
fn value_ok(v: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH != 0;
    let edge = |c: &u8| *c == b' ' || *c == b'\t';
    if v.first().is_some_and(edge) || v.last().is_some_and(edge) {
        return false;
    }
    let mut words = v.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().unwrap_or_default());
        if zero(w) || zero(w ^ (ONES * u64::from(b'\r'))) || zero(w ^ (ONES * u64::from(b'\n'))) {
            return false;
        }
    }
    !words
        .remainder()
        .iter()
        .any(|&c| c == 0 || c == b'\r' || c == b'\n')
}

/// §8.2.1: a lowercase token (no branch a byte: names are short and valid).
#[inline]
fn name_ok(n: &[u8]) -> bool {
    n.iter().fold(true, |ok, &c| ok & NAME[usize::from(c)])
}

const METHOD: usize = 0;
const SCHEME: usize = 1;
const AUTHORITY: usize = 2;
const PATH: usize = 3;

/// The checks of one header block as it decodes, its fields copied out.
pub(super) struct Collect<'s> {
    pub scratch: &'s mut Vec<u8>,
    trailers: bool,
    /// Where each pseudo-header's value is in `scratch`.
    pseudo: [Option<(u32, u32)>; 4],
    /// Where the regular fields start.
    regular: Option<usize>,
    pub malformed: bool,
    pub content_length: Option<u64>,
}

impl<'s> Collect<'s> {
    pub fn new(scratch: &'s mut Vec<u8>, trailers: bool) -> Collect<'s> {
        scratch.clear();
        Collect {
            scratch,
            trailers,
            pseudo: [None; 4],
            regular: None,
            malformed: false,
            content_length: None,
        }
    }

    /// One decoded field; `Err` once the block is malformed (the decoder
    /// goes on to keep its table, without calling again).
    pub fn field(&mut self, name: &[u8], value: &[u8]) -> Result<(), ()> {
        if self.check(name, value) {
            Ok(())
        } else {
            self.malformed = true;
            Err(())
        }
    }

    fn check(&mut self, name: &[u8], value: &[u8]) -> bool {
        if !value_ok(value) {
            return false;
        }
        let Some(&first) = name.first() else {
            return false;
        };
        if first == b':' {
            // §8.3: before every regular field, not in trailers, each once.
            if self.regular.is_some() || self.trailers {
                return false;
            }
            let k = match name {
                b":method" => METHOD,
                b":scheme" => SCHEME,
                b":authority" => AUTHORITY,
                b":path" => PATH,
                // :protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL, :status, unknown.
                _ => return false,
            };
            if self.pseudo[k].is_some() {
                return false;
            }
            self.pseudo[k] = Some((self.scratch.len() as u32, value.len() as u32));
            self.scratch.extend_from_slice(value);
            return true;
        }
        if !name_ok(name) {
            return false;
        }
        match name {
            // §8.2.2: connection-specific fields.
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => return false,
            b"te" if value != b"trailers" => return false,
            b"content-length" if !self.trailers => {
                let Some(n) = parse_length(value) else {
                    return false;
                };
                if self.content_length.is_some_and(|c| c != n) {
                    return false;
                }
                self.content_length = Some(n);
            }
            _ => {}
        }
        if self.regular.is_none() {
            self.regular = Some(self.scratch.len());
        }
        let s = &mut *self.scratch;
        s.reserve(8 + name.len() + value.len());
        let lens = (name.len() as u64) | ((value.len() as u64) << 32);
        s.extend_from_slice(&lens.to_le_bytes());
        s.extend_from_slice(name);
        s.extend_from_slice(value);
        true
    }

    /// Where the pseudo-headers and fields are, once the block decoded.
    pub fn finish(self) -> Collected {
        Collected {
            pseudo: self.pseudo,
            regular: self.regular.unwrap_or(self.scratch.len()),
            content_length: self.content_length,
        }
    }
}

/// What [`Collect`] found, as offsets into the scratch buffer.
pub(super) struct Collected {
    pseudo: [Option<(u32, u32)>; 4],
    regular: usize,
    pub content_length: Option<u64>,
}

impl Collected {
    /// The request's head over `scratch`, if the pseudo-headers make one (§8.3.1).
    pub fn head<'a>(&self, scratch: &'a [u8]) -> Option<RequestHead<'a>> {
        let get = |k: usize| self.pseudo[k].map(|(at, n)| &scratch[at as usize..(at + n) as usize]);
        let method = get(METHOD)?;
        let (scheme, authority, path) = (get(SCHEME), get(AUTHORITY), get(PATH));
        if method == b"CONNECT" {
            // §8.5: :authority alone.
            if scheme.is_some() || path.is_some() || authority.is_none_or(|a| a.is_empty()) {
                return None;
            }
        } else if scheme.is_none() || path.is_none_or(|p| p.is_empty()) {
            return None;
        }
        Some(RequestHead {
            method,
            scheme,
            authority,
            path,
            protocol: None,
            content_length: self.content_length,
            fields: Fields {
                buf: &scratch[self.regular..],
            },
        })
    }

    /// The trailers over `scratch`.
    pub fn fields<'a>(&self, scratch: &'a [u8]) -> Fields<'a> {
        Fields {
            buf: &scratch[self.regular..],
        }
    }
}

/// A content-length value: digits only, no overflow.
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 {
        return None;
    }
    v.iter().try_fold(0u64, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + u64::from(c - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(fields: &[(&[u8], &[u8])], trailers: bool) -> (bool, Vec<u8>, Collected) {
        let mut s = Vec::new();
        let mut c = Collect::new(&mut s, trailers);
        let mut ok = true;
        for (n, v) in fields {
            if c.field(n, v).is_err() {
                ok = false;
                break;
            }
        }
        let d = c.finish();
        (ok, s, d)
    }

    #[test]
    fn a_request_is_collected_in_order() {
        let (ok, s, d) = collect(
            &[
                (b":method", b"GET"),
                (b":scheme", b"https"),
                (b":path", b"/a?b"),
                (b":authority", b"x.example"),
                (b"accept", b"*/*"),
                (b"te", b"trailers"),
                (b"content-length", b"0"),
            ],
            false,
        );
        assert!(ok);
        let h = d.head(&s).unwrap();
        assert_eq!(h.method, b"GET");
        assert_eq!(h.path, Some(&b"/a?b"[..]));
        assert_eq!(h.authority, Some(&b"x.example"[..]));
        assert_eq!(h.content_length, Some(0));
        let f: Vec<_> = h.fields.iter().collect();
        assert_eq!(f.len(), 3);
        assert_eq!(f[0], (&b"accept"[..], &b"*/*"[..]));
        assert_eq!(h.fields.get(b"te"), Some(&b"trailers"[..]));
    }

    #[test]
    fn every_malformed_field_is_refused() {
        let bad: [(&[u8], &[u8]); 19] = [
            (b"X-Up", b"1"),
            (b"x y", b"1"),
            (b"", b"1"),
            (b":foo", b"1"),
            (b":status", b"200"),
            (b":protocol", b"websocket"),
            (b"connection", b"close"),
            (b"keep-alive", b"1"),
            (b"proxy-connection", b"1"),
            (b"transfer-encoding", b"chunked"),
            (b"upgrade", b"h2c"),
            (b"te", b"gzip"),
            (b"x", b" lead"),
            (b"x", b"trail\t"),
            (b"x", b"a\r\nb"),
            (b"x", b"0123456789\nabcdef"),
            (b"x", b"01234567\0"),
            (b"x", b"abcdefgh\rijklmnop"),
            (b"content-length", b"1x"),
        ];
        for (n, v) in bad {
            let (ok, _, _) = collect(&[(b":method", b"GET"), (n, v)], false);
            assert!(!ok, "{:?}: {:?}", String::from_utf8_lossy(n), v);
        }
        let twice = collect(&[(b":method", b"GET"), (b":method", b"GET")], false);
        assert!(!twice.0);
        let after = collect(&[(b"x", b"1"), (b":path", b"/")], false);
        assert!(!after.0);
        let cl = collect(
            &[(b"content-length", b"1"), (b"content-length", b"2")],
            false,
        );
        assert!(!cl.0);
        let in_trailers = collect(&[(b":path", b"/")], true);
        assert!(!in_trailers.0);
        let nul = collect(&[(b"x", b"a\0")], true);
        assert!(!nul.0);
    }

    #[test]
    fn the_pseudo_headers_must_make_a_request() {
        let m = |f: &[(&[u8], &[u8])]| {
            let (ok, s, d) = collect(f, false);
            ok && d.head(&s).is_some()
        };
        assert!(m(&[
            (b":method", b"GET"),
            (b":scheme", b"http"),
            (b":path", b"/")
        ]));
        assert!(!m(&[(b":scheme", b"http"), (b":path", b"/")]));
        assert!(!m(&[(b":method", b"GET"), (b":path", b"/")]));
        assert!(!m(&[(b":method", b"GET"), (b":scheme", b"http")]));
        assert!(!m(&[
            (b":method", b"GET"),
            (b":scheme", b"http"),
            (b":path", b"")
        ]));
        assert!(m(&[(b":method", b"CONNECT"), (b":authority", b"a:443")]));
        assert!(!m(&[
            (b":method", b"CONNECT"),
            (b":authority", b"a:443"),
            (b":path", b"/")
        ]));
        assert!(!m(&[(b":method", b"CONNECT")]));
        assert_eq!(parse_length(b"18446744073709551615"), None);
        // Inner SP, HTAB, obs-text and the bytes around CR and LF pass.
        let v = b"a\tb c\x0b\x0c\x0e\x8d\x8a\x80\xffzzzzzzzzzzzzzzzzz\x09\x0ex";
        assert!(value_ok(v));
        for i in 1..v.len() - 1 {
            for bad in [0, b'\r', b'\n'] {
                let mut w = v.to_vec();
                w[i] = bad;
                assert!(!value_ok(&w), "{i} {bad}");
            }
        }
        assert_eq!(parse_length(b"1234"), Some(1234));
    }
}
