//! PROXY protocol v1/v2 headers (haproxy's proxy-protocol.txt) that let one
//! load generator play many clients, each with its own fake source address.

use std::net::{Ipv4Addr, SocketAddrV4};

/// Which PROXY protocol version to send at the start of each connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl std::str::FromStr for Version {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "v1" | "1" => Ok(Version::V1),
            "v2" | "2" => Ok(Version::V2),
            _ => Err(format!("--proxy-header {s:?}: expected v1 or v2")),
        }
    }
}

/// Fake client addresses come from 198.18.0.0/15, the range RFC 2544 sets
/// aside for benchmarking: they never collide with a real client, and they
/// only ever appear inside the header, never as a packet's address.
const FAKE_BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
const FAKE_COUNT: u32 = 1 << 17;

/// The fake source for client number `i` (wraps after 131072 clients).
/// The port is derived from `i` too so that (address, port) is distinct.
pub fn fake_source(i: usize) -> SocketAddrV4 {
    let ip = Ipv4Addr::from(FAKE_BASE + (i as u32 % FAKE_COUNT));
    SocketAddrV4::new(ip, 1024 + (i % 64_000) as u16)
}

/// The header bytes for a TCP4 connection from `src` to `dst`.
pub fn encode(version: Version, src: SocketAddrV4, dst: SocketAddrV4) -> Vec<u8> {
    match version {
        // "PROXY TCP4 src dst sport dport\r\n", at most 107 bytes (§2.1).
        Version::V1 => format!(
            "PROXY TCP4 {} {} {} {}\r\n",
            src.ip(),
            dst.ip(),
            src.port(),
            dst.port()
        )
        .into_bytes(),
        // 12-byte signature, version 2 + PROXY command, AF_INET + STREAM,
        // 12 address bytes (§2.2).
        Version::V2 => {
            let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
            h.push(0x21);
            h.push(0x11);
            h.extend_from_slice(&12u16.to_be_bytes());
            h.extend_from_slice(&src.ip().octets());
            h.extend_from_slice(&dst.ip().octets());
            h.extend_from_slice(&src.port().to_be_bytes());
            h.extend_from_slice(&dst.port().to_be_bytes());
            h
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_and_v2_bytes() {
        let src = fake_source(258);
        assert_eq!(src, "198.18.1.2:1282".parse().unwrap());
        let dst: SocketAddrV4 = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(
            encode(Version::V1, src, dst),
            b"PROXY TCP4 198.18.1.2 127.0.0.1 1282 8080\r\n"
        );
        let v2 = encode(Version::V2, src, dst);
        assert_eq!(v2.len(), 16 + 12);
        assert_eq!(&v2[12..16], &[0x21, 0x11, 0, 12]);
        assert_eq!(&v2[16..20], &[198, 18, 1, 2]);
        assert_eq!(&v2[24..28], &[0x05, 0x02, 0x1f, 0x90]);
    }

    #[test]
    fn fake_sources_distinct() {
        assert_ne!(fake_source(0), fake_source(1));
        assert_eq!(fake_source(0).ip(), &Ipv4Addr::new(198, 18, 0, 0));
        assert_eq!(fake_source(131_071).ip(), &Ipv4Addr::new(198, 19, 255, 255));
    }
}
