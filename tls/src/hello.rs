//! A first look at what a client sent on a TLS port, before rustls sees it: a ClientHello (RFC 8446 §4.1.2) and its SNI (RFC 6066 §3), a plaintext HTTP request (answered 400 in cleartext, as nginx does), or garbage. zgix reads the SNI here because `unknown_sni: "refuse"` answers `unrecognized_name` (RFC 6066 §3), which rustls' resolver cannot send, and because the access log and the metrics want it.

/// The largest ClientHello zgix reads (all its records together). Browsers
/// send about 2 KB with post-quantum key shares; 16 KiB leaves room for
/// long ALPN and PSK lists and refuses a 64 KiB hello at a bounded cost.
pub const MAX_HELLO: usize = 16 * 1024;

/// The record layer's content type of a handshake (RFC 8446 §5.1).
const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
/// The extension type of `application_layer_protocol_negotiation` (RFC 7301 §3.1).
const ALPN: usize = 16;
/// A plaintext record carries at most 2^14 bytes (RFC 8446 §5.1).
const MAX_RECORD: usize = 1 << 14;

/// What the first bytes of a connection are.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// More bytes are needed to tell.
    Incomplete,
    /// A ClientHello, with its SNI lower-cased (without a trailing dot), and
    /// whether its ALPN offer (RFC 7301 §3.1) names none of the listener's
    /// protocols (false when it offers none).
    ClientHello {
        sni: Option<String>,
        alpn_disjoint: bool,
    },
    /// Looks like a plaintext HTTP request (an upper-case token then a space).
    Plaintext,
    /// Neither: the reason, for the debug log.
    Bad(&'static str),
}

/// Looks at the first bytes received on a TLS listener whose ALPN list is
/// `ours`.
pub fn inspect(data: &[u8], ours: &[Vec<u8>]) -> Hello {
    let Some(&first) = data.first() else {
        return Hello::Incomplete;
    };
    if first != HANDSHAKE {
        return if looks_like_http(data) {
            Hello::Plaintext
        } else if first.is_ascii_uppercase()
            && data.len() < 8
            && data.iter().all(u8::is_ascii_uppercase)
        {
            Hello::Incomplete
        } else {
            Hello::Bad("not a TLS handshake record")
        };
    }
    let mut msg = Vec::new();
    let mut rest = data;
    // The handshake message may span records (RFC 8446 §5.1): join them.
    loop {
        if rest.len() < 5 {
            return Hello::Incomplete;
        }
        if rest[0] != HANDSHAKE {
            return Hello::Bad("a non-handshake record inside the ClientHello");
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > MAX_RECORD {
            return Hello::Bad("a record length out of range");
        }
        if rest.len() < 5 + len {
            if msg.len() + rest.len() > MAX_HELLO + 5 {
                return Hello::Bad("a ClientHello longer than zgix reads");
            }
            return Hello::Incomplete;
        }
        msg.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
        if msg.len() >= 4 {
            if msg[0] != CLIENT_HELLO {
                return Hello::Bad("the first handshake message is not a ClientHello");
            }
            let want =
                4 + (usize::from(msg[1]) << 16 | usize::from(msg[2]) << 8 | usize::from(msg[3]));
            if want > MAX_HELLO {
                return Hello::Bad("a ClientHello longer than zgix reads");
            }
            if msg.len() >= want {
                return match parse_client_hello(&msg[4..want], ours) {
                    Some((sni, alpn_disjoint)) => Hello::ClientHello { sni, alpn_disjoint },
                    None => Hello::Bad("a malformed ClientHello"),
                };
            }
        }
    }
}

fn looks_like_http(data: &[u8]) -> bool {
    let token = data.iter().take_while(|b| b.is_ascii_uppercase()).count();
    (3..=7).contains(&token) && data.get(token) == Some(&b' ')
}

/// A cursor over a length-prefixed structure.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A vector with a 1- or 2-byte length prefix.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// The SNI of a ClientHello body (after the 4-byte handshake header), and
/// whether it offers ALPN names none of which is in `ours`; `None` when it
/// is malformed, a `None` SNI when it names no host.
fn parse_client_hello(body: &[u8], ours: &[Vec<u8>]) -> Option<(Option<String>, bool)> {
    let mut r = Reader(body);
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    if r.vec8()?.len() > 32 {
        return None; // legacy_session_id<0..32>
    }
    let suites = r.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return None;
    }
    if r.vec8()?.is_empty() {
        return None; // legacy_compression_methods<1..2^8-1>
    }
    if r.0.is_empty() {
        return Some((None, false)); // no extensions (a TLS 1.2-only client may omit them)
    }
    let mut exts = Reader(r.vec16()?);
    if !r.0.is_empty() {
        return None;
    }
    let mut sni = None;
    let mut alpn_disjoint = false;
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind == ALPN {
            // ProtocolNameList: protocol_name_list<2..2^16-1> of opaque
            // ProtocolName<1..2^8-1> (RFC 7301 §3.1). A malformed list is
            // left to rustls, which refuses it with decode_error.
            let mut list = Reader(Reader(data).vec16()?);
            let mut common = false;
            while let Some(name) = list.vec8() {
                common |= ours.iter().any(|o| o.as_slice() == name);
            }
            alpn_disjoint = !common;
        } else if kind == 0 {
            if sni.is_some() {
                return None; // one extension of a type (RFC 8446 §4.2)
            }
            let mut list = Reader(Reader(data).vec16()?);
            while !list.0.is_empty() {
                let name_type = list.u8()?;
                let name = list.vec16()?;
                if name_type == 0 {
                    let s = std::str::from_utf8(name).ok()?;
                    if s.is_empty() || !s.is_ascii() {
                        return None;
                    }
                    sni = Some(s.trim_end_matches('.').to_ascii_lowercase());
                }
            }
        }
    }
    Some((sni, alpn_disjoint))
}

/// A fatal `unrecognized_name` alert (RFC 8446 §6: level 2, description
/// 112), in a plaintext record: sent before any key exists.
pub const UNRECOGNIZED_NAME_ALERT: [u8; 7] = [21, 3, 3, 0, 2, 2, 112];

/// A fatal `decode_error` alert (description 50), for a ClientHello zgix
/// cannot read.
pub const DECODE_ERROR_ALERT: [u8; 7] = [21, 3, 3, 0, 2, 2, 50];

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &[&[u8]] = &[b"h2", b"http/1.1"];

    fn ours() -> Vec<Vec<u8>> {
        OURS.iter().map(|p| p.to_vec()).collect()
    }

    /// A ClientHello record made by rustls' own client for `sni`.
    fn real_hello(sni: &str) -> Vec<u8> {
        hello_offering(sni, &[])
    }

    /// [`real_hello`] offering the ALPN names `alpn`.
    fn hello_offering(sni: &str, alpn: &[&[u8]]) -> Vec<u8> {
        let mut roots = rustls::RootCertStore::empty();
        let p = crate::testkeys::ecdsa(&[sni]);
        for c in crate::certs::read_chain(&p.cert).unwrap() {
            roots.add(c).unwrap();
        }
        let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut cfg = cfg;
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let mut c = rustls::ClientConnection::new(
            std::sync::Arc::new(cfg),
            sni.to_string().try_into().unwrap(),
        )
        .unwrap();
        let mut out = Vec::new();
        c.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn a_real_client_hello_gives_its_sni_whole_and_byte_by_byte() {
        let h = real_hello("Site.Example");
        assert_eq!(
            inspect(&h, &ours()),
            Hello::ClientHello {
                sni: Some("site.example".into()),
                alpn_disjoint: false
            }
        );
        for n in 0..h.len() {
            assert_eq!(
                inspect(&h[..n], &ours()),
                Hello::Incomplete,
                "prefix of {n}"
            );
        }
    }

    #[test]
    fn a_hello_split_over_two_records_is_joined() {
        let h = real_hello("a.example");
        let body = &h[5..];
        let (x, y) = body.split_at(40);
        let mut two = Vec::new();
        for part in [x, y] {
            two.extend_from_slice(&[22, 3, 1]);
            two.extend_from_slice(&(part.len() as u16).to_be_bytes());
            two.extend_from_slice(part);
        }
        assert_eq!(
            inspect(&two, &ours()),
            Hello::ClientHello {
                sni: Some("a.example".into()),
                alpn_disjoint: false
            }
        );
    }

    #[test]
    fn an_alpn_offer_with_no_name_of_ours_is_told_from_one_with_a_common_name() {
        let disjoint = |alpn: &[&[u8]]| match inspect(&hello_offering("a.example", alpn), &ours()) {
            Hello::ClientHello { alpn_disjoint, .. } => alpn_disjoint,
            other => panic!("{other:?}"),
        };
        assert!(disjoint(&[b"http/1.0"]));
        assert!(disjoint(&[b"spdy/3", b"http/1.0"]));
        assert!(!disjoint(&[b"http/1.0", b"http/1.1"]));
        assert!(!disjoint(&[b"h2"]));
        assert!(!disjoint(&[]), "no ALPN offered is not a disjoint offer");
    }

    #[test]
    fn plaintext_http_garbage_and_oversized_hellos_are_told_apart() {
        assert_eq!(inspect(b"GET / HTTP/1.1\r\n", &ours()), Hello::Plaintext);
        assert_eq!(
            inspect(b"OPTIONS * HTTP/1.1\r\n", &ours()),
            Hello::Plaintext
        );
        assert_eq!(inspect(b"GE", &ours()), Hello::Incomplete);
        assert_eq!(
            inspect(b"\x00", &ours()),
            Hello::Bad("not a TLS handshake record")
        );
        assert_eq!(
            inspect(b"\x16\x03\x01\x00\x00", &ours()),
            Hello::Bad("a record length out of range")
        );
        let mut big = vec![22, 3, 1, 0x40, 0x00, 1, 0x00, 0xff, 0xfc];
        big.resize(5 + 0x4000, 0);
        assert_eq!(
            inspect(&big, &ours()),
            Hello::Bad("a ClientHello longer than zgix reads")
        );
        let mut garbled = real_hello("a.example");
        garbled.truncate(60);
        let n = (garbled.len() - 5) as u16;
        garbled[3..5].copy_from_slice(&n.to_be_bytes());
        let m = (garbled.len() - 9) as u32;
        garbled[6..9].copy_from_slice(&m.to_be_bytes()[1..]);
        assert_eq!(
            inspect(&garbled, &ours()),
            Hello::Bad("a malformed ClientHello")
        );
    }
}
