//! PROXY protocol v1 (text) and v2 (binary) header parsing, per HAProxy doc/proxy-protocol.txt.
//!
//! A listener configured for the PROXY protocol calls [`parse_proxy_header`] on the first
//! bytes of each connection, before any HTTP parsing. The spec (§2) says the receiver MUST NOT
//! guess whether a header is present, so there is no "maybe" mode: anything that is not a valid
//! header is an error and the connection is dropped (§2.1: "abort the connection as soon as
//! possible so that the sender gets a chance to notice").
//!
//! The parser never allocates and never waits longer than needed: it returns
//! [`ProxyStatus::Partial`] only while the bytes seen so far are a valid prefix of some header,
//! so garbage is refused on the first byte that rules every header out, not after a timeout.
//! Section numbers in comments refer to doc/proxy-protocol.txt (2020/03/05 revision).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Longest v1 line including the CRLF (§2.1: the "worst case" UNKNOWN line with two full IPv6
/// addresses and two 5-digit ports is 107 bytes).
pub const V1_MAX_LEN: usize = 107;

/// The v1 protocol string (§2.1). The single space after it belongs to the line grammar.
pub const V1_SIGNATURE: [u8; 5] = *b"PROXY";

/// The constant first 12 bytes of a v2 header (§2.2).
pub const V2_SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];

/// Fixed part of a v2 header: signature, ver_cmd, fam, 16-bit len (§2.2 `struct proxy_hdr_v2`).
pub const V2_FIXED_LEN: usize = 16;

/// Largest v2 `len` field (address block plus TLVs) zgix accepts; beyond it the header is
/// refused with [`ProxyError::TooLong`].
///
/// The field itself allows 65535 bytes, which a buggy (or compromised) sender could use to make
/// every connection buffer 64 KiB before the HTTP head. Real senders stay far below 1536 bytes:
/// the largest address block is AF_UNIX at 216 bytes, and the registered TLVs (§2.2.1-§2.2.7)
/// are bounded: AUTHORITY is an SNI host name (at most 255 bytes), UNIQUE_ID at most 128 bytes,
/// ALPN a few protocol names, SSL a version, cipher, two algorithm names and a certificate CN
/// (at most 64 characters, 256 bytes of UTF-8). Together with the cloud load balancers' custom
/// TLVs (a VPC endpoint id, a link id) that is under 1.2 KiB, so 1536 keeps headroom while the
/// whole header (1552 bytes) still fits comfortably in one read buffer.
pub const V2_MAX_ADDR_LEN: usize = 1536;

/// Longest v2 header accepted, fixed part included.
pub const V2_MAX_LEN: usize = V2_FIXED_LEN + V2_MAX_ADDR_LEN;

/// Longest textual IPv6 address accepted in a v1 line: INET6_ADDRSTRLEN - 1, which covers the
/// IPv4-suffixed form `ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`.
const V1_MAX_IPV6_TEXT: usize = 45;

/// Why a PROXY header was refused. Every variant means "drop the connection" (§2.1, §2.2);
/// the variants exist for debug logging and counters.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ProxyError {
    /// The input starts with neither `PROXY` (v1) nor the 12-byte v2 signature.
    BadSignature,
    /// v2: the high nibble of the 13th byte is not 2 (§2.2).
    BadVersion,
    /// v2: the command nibble is neither LOCAL (0) nor PROXY (1) (§2.2).
    BadCommand,
    /// v1: the protocol is not `TCP4`, `TCP6` or `UNKNOWN` (§2.1). v2 PROXY command: the
    /// family/transport byte is not UNSPEC (0x00) or a STREAM family (0x11, 0x21, 0x31);
    /// DGRAM (UDP) is refused because zgix only proxies TCP.
    BadFamily,
    /// v1: an address or port does not parse as the announced family's (§2.1), including
    /// leading zeros, which §2.1 forbids in IPv4 octets and ports.
    BadAddress,
    /// v1: no CRLF within [`V1_MAX_LEN`] bytes (§2.1). v2: the length field exceeds
    /// [`V2_MAX_ADDR_LEN`].
    TooLong,
    /// v2: the length field is smaller than the family's address block, or a TLV runs past
    /// the end of the header (§2.2).
    BadLength,
    /// v1: not exactly one space between fields, a missing or extra field, or a CR or LF that
    /// is not part of the terminating CRLF (§2.1).
    Malformed,
}

impl ProxyError {
    /// A short, fixed description for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyError::BadSignature => "PROXY header: bad signature",
            ProxyError::BadVersion => "PROXY header: unsupported v2 version",
            ProxyError::BadCommand => "PROXY header: unknown v2 command",
            ProxyError::BadFamily => "PROXY header: unsupported address family or transport",
            ProxyError::BadAddress => "PROXY header: bad address or port",
            ProxyError::TooLong => "PROXY header: too long",
            ProxyError::BadLength => "PROXY header: inconsistent v2 length",
            ProxyError::Malformed => "PROXY header: malformed v1 line",
        }
    }
}

impl std::fmt::Display for ProxyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for ProxyError {}

/// A complete, valid PROXY header.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ProxyHeader {
    /// Bytes of the header; the HTTP stream starts right after.
    pub consumed: usize,
    /// The original client. `None` for v1 UNKNOWN, v2 LOCAL, and v2 AF_UNSPEC or AF_UNIX: the
    /// caller then uses the real peer address (§2.1 UNKNOWN, §2.2 LOCAL and AF_UNSPEC).
    pub source: Option<SocketAddr>,
    /// The address the client connected to; `None` exactly when `source` is.
    pub destination: Option<SocketAddr>,
    /// 1 or 2.
    pub version: u8,
}

/// Outcome of [`parse_proxy_header`] on input that is not (yet) invalid.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ProxyStatus {
    /// A whole header was found at the start of the buffer.
    Complete(ProxyHeader),
    /// Everything seen is a valid prefix of a header; read more bytes and call again.
    Partial,
}

/// Parses a v1 or v2 header at the start of `buf`.
///
/// Returns `Partial` while more bytes are needed and the prefix seen so far is still valid, so a
/// wrong signature is refused as soon as the first differing byte arrives, not after a timeout.
/// Call again with the same buffer extended by the newly read bytes; the result depends only on
/// the bytes, so re-parsing from the start is correct (headers are at most [`V2_MAX_LEN`] bytes).
///
/// Version detection follows §2.2's closing rules, decided on the first byte since `P` and CR
/// cannot start the same header.
pub fn parse_proxy_header(buf: &[u8]) -> Result<ProxyStatus, ProxyError> {
    match buf.first() {
        None => Ok(ProxyStatus::Partial),
        Some(&b) if b == V1_SIGNATURE[0] => parse_v1(buf),
        Some(&b) if b == V2_SIGNATURE[0] => parse_v2(buf),
        Some(_) => Err(ProxyError::BadSignature),
    }
}

/// Whether `buf` agrees with `signature` on their common length.
fn prefix_matches(buf: &[u8], signature: &[u8]) -> bool {
    let n = buf.len().min(signature.len());
    buf[..n] == signature[..n]
}

// ---------------------------------------------------------------------------------------------
// Version 1 (§2.1)
// ---------------------------------------------------------------------------------------------

/// Parses `"PROXY" SP proto [SP src SP dst SP sport SP dport] CRLF`.
fn parse_v1(buf: &[u8]) -> Result<ProxyStatus, ProxyError> {
    if !prefix_matches(buf, &V1_SIGNATURE) {
        return Err(ProxyError::BadSignature);
    }
    let start = V1_SIGNATURE.len() + 1;
    match buf.get(V1_SIGNATURE.len()) {
        None => return Ok(ProxyStatus::Partial),
        // §2.1: "exactly one space".
        Some(b' ') => {}
        Some(_) => return Err(ProxyError::Malformed),
    }

    // §2.1: "If the CRLF sequence is not found in the first 107 characters, the receiver should
    // declare the line invalid." The CR must therefore sit at index 105 at the latest; once 106
    // bytes are in without one, no continuation can be valid.
    let scan_end = buf.len().min(V1_MAX_LEN - 1);
    let line_end = buf[start..scan_end]
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .map(|i| start + i);

    // The fields before the terminator are always checked first, as an open prefix, so feeding
    // the bytes one at a time and all at once yield the same error.
    let Some(end) = line_end else {
        v1_fields(&buf[start..scan_end], true)?;
        return if buf.len() >= V1_MAX_LEN - 1 {
            Err(ProxyError::TooLong)
        } else {
            Ok(ProxyStatus::Partial)
        };
    };
    let line = &buf[start..end];
    // §2.1: "The receiver must not tolerate a single CR or LF character to end the line".
    if buf[end] == b'\n' {
        v1_fields(line, true)?;
        return Err(ProxyError::Malformed);
    }
    match buf.get(end + 1) {
        None => {
            v1_fields(line, true)?;
            Ok(ProxyStatus::Partial)
        }
        Some(b'\n') => {
            // §2.1: "The receiver must wait for the CRLF sequence before starting to decode the
            // addresses in order to ensure they are complete".
            let (source, destination) = v1_fields(line, false)?;
            Ok(ProxyStatus::Complete(ProxyHeader {
                consumed: end + 2,
                source,
                destination,
                version: 1,
            }))
        }
        Some(_) => {
            v1_fields(line, true)?;
            Err(ProxyError::Malformed)
        }
    }
}

#[derive(Copy, Clone)]
enum V1Family {
    Tcp4,
    Tcp6,
}

type Endpoints = (Option<SocketAddr>, Option<SocketAddr>);

/// Checks the space-separated fields after `"PROXY "`. With `open`, `line` is everything
/// received so far (no terminator yet): complete fields are checked in full, the last one only
/// as a prefix of a valid field, and `(None, None)` is returned.
fn v1_fields(line: &[u8], open: bool) -> Result<Endpoints, ProxyError> {
    // Splitting on single spaces turns a doubled space into an empty field (§2.1: "exactly
    // one space").
    let mut fields = line.split(|&b| b == b' ').peekable();
    // `split` yields at least one (possibly empty) field.
    let proto = fields.next().unwrap_or_default();
    if open && fields.peek().is_none() {
        let candidate = [&b"TCP4"[..], b"TCP6", b"UNKNOWN"]
            .iter()
            .any(|p| p.starts_with(proto));
        return if candidate {
            Ok((None, None))
        } else {
            Err(ProxyError::BadFamily)
        };
    }
    let family = match proto {
        b"TCP4" => V1Family::Tcp4,
        b"TCP6" => V1Family::Tcp6,
        // §2.1: for UNKNOWN "the receiver must ignore anything presented before the CRLF" and
        // use the real connection's endpoints.
        b"UNKNOWN" => return Ok((None, None)),
        b"" => return Err(ProxyError::Malformed),
        _ => return Err(ProxyError::BadFamily),
    };

    let mut ips = [IpAddr::V4(Ipv4Addr::UNSPECIFIED); 2];
    let mut ports = [0u16; 2];
    for i in 0..4 {
        let Some(field) = fields.next() else {
            return Err(ProxyError::Malformed);
        };
        let last_open = open && fields.peek().is_none();
        if field.is_empty() && !last_open {
            return Err(ProxyError::Malformed);
        }
        match i {
            0 | 1 => ips[i] = v1_ip(family, field, last_open)?,
            // §2.1: ports are decimal in [0..65535] without heading zeroes.
            _ => ports[i - 2] = decimal(field, u16::MAX.into(), last_open)? as u16,
        }
        if last_open {
            return Ok((None, None));
        }
    }
    // A fifth space means an extra field, or a trailing space before the CRLF.
    if fields.next().is_some() {
        return Err(ProxyError::Malformed);
    }
    Ok((
        Some(SocketAddr::new(ips[0], ports[0])),
        Some(SocketAddr::new(ips[1], ports[1])),
    ))
}

/// Parses one v1 address in the announced family (§2.1: "The advertised protocol family
/// dictates what format to use"). An `open` field returns a placeholder once it is known to be
/// a valid prefix.
fn v1_ip(family: V1Family, field: &[u8], open: bool) -> Result<IpAddr, ProxyError> {
    match family {
        V1Family::Tcp4 => ipv4(field, open).map(IpAddr::V4),
        V1Family::Tcp6 => ipv6(field, open).map(IpAddr::V6),
    }
}

/// §2.1: "exactly 4 integers in the range [0..255] inclusive written in decimal representation
/// separated by exactly one dot", without heading zeroes. With `open`, any prefix of such an
/// address is accepted.
fn ipv4(field: &[u8], open: bool) -> Result<Ipv4Addr, ProxyError> {
    let mut octets = [0u8; 4];
    let mut count = 0;
    let mut parts = field.split(|&b| b == b'.').peekable();
    while let Some(part) = parts.next() {
        if count == octets.len() {
            return Err(ProxyError::BadAddress);
        }
        let last_open = open && parts.peek().is_none();
        octets[count] = decimal(part, u8::MAX.into(), last_open)? as u8;
        count += 1;
    }
    if count < octets.len() && !open {
        return Err(ProxyError::BadAddress);
    }
    Ok(Ipv4Addr::from(octets))
}

/// §2.1 describes IPv6 as colon-separated 4-digit hex groups with at most one `::`. Senders
/// print with inet_ntop, which also drops leading zeros in a group and writes IPv4-mapped
/// addresses as `::ffff:192.0.2.1`, so the complete field is parsed with the standard RFC 4291
/// textual grammar (std's `Ipv6Addr` parser, which rejects zone ids and groups over 4 digits).
/// An open field is checked for its alphabet and length only.
fn ipv6(field: &[u8], open: bool) -> Result<Ipv6Addr, ProxyError> {
    if open {
        let plausible = field.len() <= V1_MAX_IPV6_TEXT
            && field
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        return if plausible {
            Ok(Ipv6Addr::UNSPECIFIED)
        } else {
            Err(ProxyError::BadAddress)
        };
    }
    std::str::from_utf8(field)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ProxyError::BadAddress)
}

/// A decimal number in `0..=max` with no sign and no heading zeroes (§2.1 forbids them "to avoid
/// any possible confusion with octal numbers"; `0` itself is fine). With `open`, `digits` may
/// be any prefix of such a number, including empty. Every prefix of a valid number is itself
/// `<= max`, so the range check is exact for prefixes too.
fn decimal(digits: &[u8], max: u32, open: bool) -> Result<u32, ProxyError> {
    if digits.is_empty() {
        return if open {
            Ok(0)
        } else {
            Err(ProxyError::BadAddress)
        };
    }
    if digits.len() > 1 && digits[0] == b'0' {
        return Err(ProxyError::BadAddress);
    }
    let mut value: u32 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(ProxyError::BadAddress);
        }
        // `value <= max <= u16::MAX` here, so this cannot overflow.
        value = value * 10 + u32::from(d - b'0');
        if value > max {
            return Err(ProxyError::BadAddress);
        }
    }
    Ok(value)
}

// ---------------------------------------------------------------------------------------------
// Version 2 (§2.2)
// ---------------------------------------------------------------------------------------------

/// Size of a TLV's type and length fields (§2.2 `struct pp2_tlv`).
const TLV_HEADER_LEN: usize = 3;

/// Parses the binary header: signature, ver_cmd, fam, len, address block, TLVs. Each field is
/// checked as soon as its bytes arrive.
fn parse_v2(buf: &[u8]) -> Result<ProxyStatus, ProxyError> {
    if !prefix_matches(buf, &V2_SIGNATURE) {
        return Err(ProxyError::BadSignature);
    }
    let Some(&ver_cmd) = buf.get(12) else {
        return Ok(ProxyStatus::Partial);
    };
    // §2.2: the version "must always be sent as \x2 and the receiver must only accept this
    // value".
    if ver_cmd >> 4 != 2 {
        return Err(ProxyError::BadVersion);
    }
    // §2.2: commands other than LOCAL and PROXY "must drop connections".
    let local = match ver_cmd & 0x0F {
        0x0 => true,
        0x1 => false,
        _ => return Err(ProxyError::BadCommand),
    };
    let Some(&fam) = buf.get(13) else {
        return Ok(ProxyStatus::Partial);
    };
    // Length of the address block zgix decodes, and whether it yields endpoints.
    let block: Option<(usize, bool)> = if local {
        // §2.2 LOCAL: "discard the protocol block including the family which is ignored". The
        // family byte is not checked and nothing after `len` is interpreted.
        None
    } else {
        match fam {
            // §2.2 AF_UNSPEC: "The receiver should ignore address information."
            0x00 => None,
            // §2.2: TCP over IPv4, 2*4 + 2*2 bytes.
            0x11 => Some((12, true)),
            // §2.2: TCP over IPv6, 2*16 + 2*2 bytes.
            0x21 => Some((36, true)),
            // §2.2: UNIX stream, 2*108 bytes. Still a real stream connection, but a path is no
            // SocketAddr: the caller falls back to the peer address.
            0x31 => Some((216, false)),
            // DGRAM (0x12, 0x22, 0x32): §2.2 lets a receiver fall back to UNSPEC for valid
            // combinations it does not support, but zgix is TCP-only and a UDP flow announced
            // on a TCP listener is a misconfigured sender, so it is refused loudly. Every other
            // value "must be rejected as invalid by receivers".
            _ => return Err(ProxyError::BadFamily),
        }
    };
    let (Some(&hi), Some(&lo)) = (buf.get(14), buf.get(15)) else {
        return Ok(ProxyStatus::Partial);
    };
    // §2.2: "the length of the protocol header in bytes is always exactly 16 + this value",
    // and receivers "MUST always consider this field".
    let len = usize::from(u16::from_be_bytes([hi, lo]));
    if len > V2_MAX_ADDR_LEN {
        return Err(ProxyError::TooLong);
    }
    let total = V2_FIXED_LEN + len;

    let Some((addr_len, has_endpoints)) = block else {
        return Ok(v2_done(buf, total, None, None));
    };
    if len < addr_len {
        return Err(ProxyError::BadLength);
    }
    // §2.2: bytes after the address block are TLVs (type, 16-bit length, value). zgix skips
    // them all, but each must fit inside the header or the sender and zgix disagree on where the
    // HTTP stream starts. Walk whatever has arrived so a bad TLV is refused early.
    let mut at = V2_FIXED_LEN + addr_len;
    while at < total {
        if total - at < TLV_HEADER_LEN {
            return Err(ProxyError::BadLength);
        }
        let (Some(&hi), Some(&lo)) = (buf.get(at + 1), buf.get(at + 2)) else {
            return Ok(ProxyStatus::Partial);
        };
        at += TLV_HEADER_LEN + usize::from(u16::from_be_bytes([hi, lo]));
        if at > total {
            return Err(ProxyError::BadLength);
        }
    }
    if buf.len() < total {
        return Ok(ProxyStatus::Partial);
    }
    if !has_endpoints {
        return Ok(v2_done(buf, total, None, None));
    }
    // §2.2 `union proxy_addr`: source address, destination address, source port, destination
    // port, all in network byte order.
    let addrs = &buf[V2_FIXED_LEN..V2_FIXED_LEN + addr_len];
    let (ips, ports) = addrs.split_at(addr_len - 4);
    let (src, dst): (IpAddr, IpAddr) = if addr_len == 12 {
        let (s, d) = ips.split_at(4);
        (ipv4_from(s).into(), ipv4_from(d).into())
    } else {
        let (s, d) = ips.split_at(16);
        (ipv6_from(s).into(), ipv6_from(d).into())
    };
    let sport = u16::from_be_bytes([ports[0], ports[1]]);
    let dport = u16::from_be_bytes([ports[2], ports[3]]);
    Ok(v2_done(
        buf,
        total,
        Some(SocketAddr::new(src, sport)),
        Some(SocketAddr::new(dst, dport)),
    ))
}

/// `Complete` once all `total` header bytes are in, else `Partial`.
fn v2_done(
    buf: &[u8],
    total: usize,
    source: Option<SocketAddr>,
    destination: Option<SocketAddr>,
) -> ProxyStatus {
    if buf.len() < total {
        return ProxyStatus::Partial;
    }
    ProxyStatus::Complete(ProxyHeader {
        consumed: total,
        source,
        destination,
        version: 2,
    })
}

fn ipv4_from(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

fn ipv6_from(b: &[u8]) -> Ipv6Addr {
    let mut octets = [0u8; 16];
    octets.copy_from_slice(b);
    Ipv6Addr::from(octets)
}

#[cfg(test)]
mod tests;
