//! Unit tests of the PROXY protocol v1/v2 parser.

use super::*;
use ProxyStatus::{Complete, Partial};

const HTTP: &[u8] = b"GET / HTTP/1.1\r\nHost: 192.168.0.11\r\n\r\n";
const FFFF6: &str = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";

fn sa(s: &str) -> Option<SocketAddr> {
    Some(s.parse().unwrap())
}

/// Feeds every strict prefix (each must be Partial), then the whole header (Complete with
/// `consumed` exact), then the header followed by HTTP bytes (same result, HTTP untouched).
fn accept(input: &[u8]) -> ProxyHeader {
    for n in 0..input.len() {
        assert_eq!(
            parse_proxy_header(&input[..n]),
            Ok(Partial),
            "prefix of {n} bytes"
        );
    }
    let Ok(Complete(header)) = parse_proxy_header(input) else {
        panic!("not complete: {:?}", parse_proxy_header(input));
    };
    assert_eq!(header.consumed, input.len());
    let mut stream = input.to_vec();
    stream.extend_from_slice(HTTP);
    assert_eq!(parse_proxy_header(&stream), Ok(Complete(header)));
    assert_eq!(&stream[header.consumed..], HTTP);
    header
}

/// Prefixes shorter than `at` are Partial; from `at` bytes on (and with more bytes after the
/// input) the header is refused with `err`.
fn refuse_at(input: &[u8], at: usize, err: ProxyError) {
    assert!(at <= input.len());
    for n in 0..at {
        assert_eq!(
            parse_proxy_header(&input[..n]),
            Ok(Partial),
            "prefix of {n} bytes"
        );
    }
    for n in at..=input.len() {
        assert_eq!(
            parse_proxy_header(&input[..n]),
            Err(err),
            "prefix of {n} bytes"
        );
    }
    let mut stream = input.to_vec();
    stream.extend_from_slice(HTTP);
    assert_eq!(parse_proxy_header(&stream), Err(err));
}

/// Refused at the first byte of `needle` in `input`, or at its end.
fn refuse_at_str(input: &str, needle: &str, err: ProxyError) {
    let at = input.find(needle).expect("needle") + needle.len();
    refuse_at(input.as_bytes(), at, err);
}

// ---- v1 -------------------------------------------------------------------------------

#[test]
fn v1_tcp4_spec_example() {
    let h = accept(b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n");
    assert_eq!(h.version, 1);
    assert_eq!(h.consumed, 47);
    assert_eq!(h.source, sa("192.168.0.1:56324"));
    assert_eq!(h.destination, sa("192.168.0.11:443"));
}

#[test]
fn v1_tcp4_longest() {
    let line = b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n";
    assert_eq!(line.len(), 56);
    let h = accept(line);
    assert_eq!(h.source, sa("255.255.255.255:65535"));
    let h = accept(b"PROXY TCP4 0.0.0.0 10.0.0.1 0 0\r\n");
    assert_eq!(h.source, sa("0.0.0.0:0"));
    assert_eq!(h.destination, sa("10.0.0.1:0"));
}

#[test]
fn v1_tcp6_longest() {
    let line = format!("PROXY TCP6 {FFFF6} {FFFF6} 65535 65535\r\n");
    assert_eq!(line.len(), 104);
    let h = accept(line.as_bytes());
    assert_eq!(h.source, sa(&format!("[{FFFF6}]:65535")));
    assert_eq!(h.destination, h.source);
}

#[test]
fn v1_tcp6_compressed_and_mapped() {
    let h = accept(b"PROXY TCP6 2001:db8::1 ::ffff:192.0.2.1 1234 80\r\n");
    assert_eq!(h.source, sa("[2001:db8::1]:1234"));
    assert_eq!(h.destination, sa("[::ffff:192.0.2.1]:80"));
    let h = accept(b"PROXY TCP6 :: ::1 1 2\r\n");
    assert_eq!(h.source, sa("[::]:1"));
    assert_eq!(h.destination, sa("[::1]:2"));
}

#[test]
fn v1_unknown() {
    let short = b"PROXY UNKNOWN\r\n";
    assert_eq!(short.len(), 15);
    let h = accept(short);
    assert_eq!((h.source, h.destination, h.version), (None, None, 1));

    let h = accept(b"PROXY UNKNOWN 192.168.0.1 192.168.0.11 56324 443\r\n");
    assert_eq!((h.source, h.destination), (None, None));
    // §2.1: anything before the CRLF is ignored, even if it is not an address.
    let h = accept(b"PROXY UNKNOWN what  ever\tgoes\r\n");
    assert_eq!(h.source, None);
}

#[test]
fn v1_worst_case_107_bytes() {
    let line = format!("PROXY UNKNOWN {FFFF6} {FFFF6} 65535 65535\r\n");
    assert_eq!(line.len(), V1_MAX_LEN);
    let h = accept(line.as_bytes());
    assert_eq!((h.consumed, h.source), (107, None));
}

#[test]
fn v1_too_long() {
    // One byte more than the worst case: the CR lands at index 106 and the line would be
    // 108 bytes, so it is refused once 106 bytes without CRLF are in.
    let line = format!("PROXY UNKNOWN {FFFF6} {FFFF6} 65535 655350\r\n");
    assert_eq!(line.len(), 108);
    refuse_at(line.as_bytes(), 106, ProxyError::TooLong);
    let endless = [b"PROXY UNKNOWN ".as_slice(), &[b'a'; 200]].concat();
    refuse_at(&endless, 106, ProxyError::TooLong);
}

#[test]
fn v1_line_endings() {
    // §2.1: a lone LF or CR does not end the line.
    refuse_at_str(
        "PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\n",
        "\n",
        ProxyError::Malformed,
    );
    refuse_at_str(
        "PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r!",
        "!",
        ProxyError::Malformed,
    );
    refuse_at_str("PROXY UNKNOWN\n", "\n", ProxyError::Malformed);
    refuse_at_str("PROXY UNKNOWN foo\nbar\r\n", "\n", ProxyError::Malformed);
    refuse_at_str("PROXY UNKNOWN\r\r\n", "\r\r", ProxyError::Malformed);
}

#[test]
fn v1_spacing_and_field_count() {
    use ProxyError::Malformed;
    refuse_at_str("PROXY  TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "  ", Malformed);
    refuse_at_str("PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n", "  ", Malformed);
    refuse_at_str("PROXY TCP4 1.2.3.4 5.6.7.8  1 2\r\n", "  ", Malformed);
    refuse_at_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n", "2 ", Malformed);
    refuse_at_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", "2 ", Malformed);
    refuse_at_str("PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "\r\n", Malformed);
    refuse_at_str("PROXY TCP4\r\n", "\r\n", Malformed);
    refuse_at_str("PROXY \r\n", "\r\n", Malformed);
    refuse_at_str("PROXY\r\n", "\r", Malformed);
    refuse_at_str("PROXY\tTCP4", "\t", Malformed);
}

#[test]
fn v1_bad_family() {
    use ProxyError::BadFamily;
    refuse_at_str("PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", "UD", BadFamily);
    refuse_at_str("PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", "5", BadFamily);
    refuse_at_str("PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n", "t", BadFamily);
    refuse_at_str("PROXY UNKNOWNX\r\n", "WNX", BadFamily);
    refuse_at_str("PROXY TCP\r\n", "\r\n", BadFamily);
}

#[test]
fn v1_bad_address() {
    use ProxyError::BadAddress;
    // TCP4 with an IPv6 address: refused on the first byte outside the IPv4 alphabet.
    refuse_at_str("PROXY TCP4 ::1 ::1 1 2\r\n", ":", BadAddress);
    refuse_at_str("PROXY TCP4 1.2.3.4 fe80::1 1 2\r\n", "f", BadAddress);
    // TCP6 with an IPv4 address: plausible text until the field ends.
    refuse_at_str("PROXY TCP6 1.2.3.4 ::1 1 2\r\n", "1.2.3.4 ", BadAddress);
    refuse_at_str("PROXY TCP4 256.1.1.1 1.1.1.1 1 2\r\n", "256", BadAddress);
    refuse_at_str("PROXY TCP4 1.2.3 4.5.6.7 1 2\r\n", "1.2.3 ", BadAddress);
    refuse_at_str(
        "PROXY TCP4 1.2.3.4.5 6.7.8.9 1 2\r\n",
        "1.2.3.4.",
        BadAddress,
    );
    refuse_at_str("PROXY TCP4 1..2.3 4.5.6.7 1 2\r\n", "1..", BadAddress);
    // §2.1: no heading zeroes in octets or ports.
    refuse_at_str("PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", "01", BadAddress);
    refuse_at_str("PROXY TCP4 1.2.3.4 5.6.7.8 080 2\r\n", "08", BadAddress);
    refuse_at_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 00\r\n", "00", BadAddress);
    refuse_at_str(
        "PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
        "65536",
        BadAddress,
    );
    refuse_at_str("PROXY TCP4 1.2.3.4 5.6.7.8 +80 2\r\n", "+", BadAddress);
    refuse_at_str("PROXY TCP4 1.2.3.4 5.6.7.8 1 -2\r\n", "-", BadAddress);
    refuse_at_str("PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", "%", BadAddress);
    refuse_at_str("PROXY TCP6 12345::1 ::1 1 2\r\n", "12345::1 ", BadAddress);
    refuse_at_str(
        "PROXY TCP6 1:2:3:4:5:6:7:8:9 ::1 1 2\r\n",
        ":9 ",
        BadAddress,
    );
    refuse_at_str("PROXY TCP6 [::1] ::1 1 2\r\n", "[", BadAddress);
}

#[test]
fn wrong_signature_refused_on_first_wrong_byte() {
    refuse_at(HTTP, 1, ProxyError::BadSignature);
    refuse_at(b"\x16\x03\x01\x02\x00", 1, ProxyError::BadSignature);
    refuse_at(b"PROXX TCP4", 5, ProxyError::BadSignature);
    refuse_at(b"PUT / HTTP/1.1\r\n", 2, ProxyError::BadSignature);
    // Every byte of the v2 signature matters.
    let good = v2(0x21, 0x11, &V4_BLOCK, &[]);
    for i in 0..V2_SIGNATURE.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x40;
        refuse_at(&bad, i + 1, ProxyError::BadSignature);
    }
}

// ---- v2 -------------------------------------------------------------------------------

/// 192.168.0.1:56324 -> 192.168.0.11:443.
const V4_BLOCK: [u8; 12] = [192, 168, 0, 1, 192, 168, 0, 11, 0xDC, 0x04, 0x01, 0xBB];

fn v6_block() -> Vec<u8> {
    let src: Ipv6Addr = "2001:db8::1".parse().unwrap();
    let dst: Ipv6Addr = "2001:db8::2:3".parse().unwrap();
    [&src.octets()[..], &dst.octets(), &[0xDC, 0x04, 0x01, 0xBB]].concat()
}

fn v2_raw(ver_cmd: u8, fam: u8, len: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    out.extend_from_slice(&[ver_cmd, fam]);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn v2(ver_cmd: u8, fam: u8, addrs: &[u8], tlvs: &[u8]) -> Vec<u8> {
    let payload = [addrs, tlvs].concat();
    v2_raw(ver_cmd, fam, payload.len().try_into().unwrap(), &payload)
}

fn tlv(kind: u8, value: &[u8]) -> Vec<u8> {
    let len = u16::try_from(value.len()).unwrap().to_be_bytes();
    [&[kind, len[0], len[1]][..], value].concat()
}

fn some_tlvs() -> Vec<u8> {
    [
        tlv(0x01, b"h2"),               // PP2_TYPE_ALPN
        tlv(0x02, b"www.example.com"),  // PP2_TYPE_AUTHORITY
        tlv(0x04, b""),                 // PP2_TYPE_NOOP, empty value
        tlv(0x20, &[0x01, 0, 0, 0, 0]), // PP2_TYPE_SSL, no sub-TLVs
        tlv(0xEA, &[7; 40]),            // custom range
    ]
    .concat()
}

#[test]
fn v2_proxy_ipv4() {
    let h = accept(&v2(0x21, 0x11, &V4_BLOCK, &[]));
    assert_eq!(h.version, 2);
    assert_eq!(h.consumed, 28);
    assert_eq!(h.source, sa("192.168.0.1:56324"));
    assert_eq!(h.destination, sa("192.168.0.11:443"));
}

#[test]
fn v2_proxy_ipv4_with_tlvs() {
    let input = v2(0x21, 0x11, &V4_BLOCK, &some_tlvs());
    let h = accept(&input);
    assert_eq!(h.consumed, input.len());
    assert_eq!(h.source, sa("192.168.0.1:56324"));
    assert_eq!(h.destination, sa("192.168.0.11:443"));
}

#[test]
fn v2_proxy_ipv6() {
    for tlvs in [Vec::new(), some_tlvs()] {
        let input = v2(0x21, 0x21, &v6_block(), &tlvs);
        let h = accept(&input);
        assert_eq!(h.consumed, 16 + 36 + tlvs.len());
        assert_eq!(h.source, sa("[2001:db8::1]:56324"));
        assert_eq!(h.destination, sa("[2001:db8::2:3]:443"));
    }
}

#[test]
fn v2_local() {
    // §2.2: LOCAL normally carries no address (len 0, family UNSPEC).
    let h = accept(&v2(0x20, 0x00, &[], &[]));
    assert_eq!((h.consumed, h.source, h.destination), (16, None, None));
    // Addresses present, and any family byte: still ignored, still skipped.
    let h = accept(&v2(0x20, 0x11, &V4_BLOCK, &some_tlvs()));
    assert_eq!((h.source, h.destination), (None, None));
    let h = accept(&v2(0x20, 0x12, &V4_BLOCK, &[]));
    assert_eq!(h.source, None);
    let h = accept(&v2(0x20, 0xFF, &[1, 2, 3], &[]));
    assert_eq!((h.consumed, h.source), (19, None));
}

#[test]
fn v2_unspec_and_unix() {
    let h = accept(&v2(0x21, 0x00, &[], &[]));
    assert_eq!((h.consumed, h.source), (16, None));
    // AF_UNSPEC: whatever follows is ignored, not parsed as TLVs.
    let h = accept(&v2(0x21, 0x00, &[0xFF; 5], &[]));
    assert_eq!((h.consumed, h.source), (21, None));
    let h = accept(&v2(0x21, 0x31, &[b'/'; 216], &some_tlvs()));
    assert_eq!((h.source, h.destination), (None, None));
    assert_eq!(h.consumed, 16 + 216 + some_tlvs().len());
}

#[test]
fn v2_bad_version_and_command() {
    refuse_at(&v2(0x11, 0x11, &V4_BLOCK, &[]), 13, ProxyError::BadVersion);
    refuse_at(&v2(0x31, 0x11, &V4_BLOCK, &[]), 13, ProxyError::BadVersion);
    refuse_at(&v2(0x01, 0x11, &V4_BLOCK, &[]), 13, ProxyError::BadVersion);
    refuse_at(&v2(0x22, 0x11, &V4_BLOCK, &[]), 13, ProxyError::BadCommand);
    refuse_at(&v2(0x2F, 0x11, &V4_BLOCK, &[]), 13, ProxyError::BadCommand);
}

#[test]
fn v2_bad_family() {
    // DGRAM is refused (TCP only), as are combinations §2.2 does not list.
    for fam in [0x12, 0x22, 0x32, 0x01, 0x10, 0x13, 0x41, 0xFF] {
        refuse_at(&v2(0x21, fam, &V4_BLOCK, &[]), 14, ProxyError::BadFamily);
    }
}

#[test]
fn v2_length_smaller_than_address_block() {
    refuse_at(
        &v2_raw(0x21, 0x11, 11, &V4_BLOCK[..11]),
        16,
        ProxyError::BadLength,
    );
    refuse_at(&v2_raw(0x21, 0x11, 0, &[]), 16, ProxyError::BadLength);
    refuse_at(
        &v2_raw(0x21, 0x21, 12, &V4_BLOCK),
        16,
        ProxyError::BadLength,
    );
    refuse_at(
        &v2_raw(0x21, 0x31, 215, &[0; 215]),
        16,
        ProxyError::BadLength,
    );
}

#[test]
fn v2_tlv_past_the_end() {
    // One TLV announcing 5 value bytes when the header leaves room for 1: refused as soon as
    // its length field is in.
    let payload = [&V4_BLOCK[..], &[0x04, 0x00, 0x05, 0xAA]].concat();
    let input = v2_raw(0x21, 0x11, 16, &payload);
    refuse_at(&input, 16 + 12 + 3, ProxyError::BadLength);
    // The second TLV overruns.
    let tlvs = [tlv(0x01, b"h2"), vec![0x02, 0x00, 0x10, b'a']].concat();
    let input = v2(0x21, 0x21, &v6_block(), &tlvs);
    refuse_at(&input, 16 + 36 + 5 + 3, ProxyError::BadLength);
    // Leftover bytes too short to be a TLV header: known from `len` alone.
    let input = v2(0x21, 0x11, &V4_BLOCK, &[0x04, 0x00]);
    refuse_at(&input, 16, ProxyError::BadLength);
    let input = v2(
        0x21,
        0x11,
        &V4_BLOCK,
        &[tlv(0x04, b"x"), vec![0x04]].concat(),
    );
    // Known once the last whole TLV's length shows what is left.
    refuse_at(&input, 16 + 12 + 3, ProxyError::BadLength);
}

#[test]
fn v2_length_cap() {
    // Exactly at the cap: a NOOP TLV pads the header to V2_MAX_LEN.
    let pad = tlv(0x04, &[0; V2_MAX_ADDR_LEN - 12 - 3]);
    let h = accept(&v2(0x21, 0x11, &V4_BLOCK, &pad));
    assert_eq!(h.consumed, V2_MAX_LEN);
    let h = accept(&v2(0x20, 0x00, &[0; V2_MAX_ADDR_LEN], &[]));
    assert_eq!(h.consumed, V2_MAX_LEN);
    // One byte over, refused on the length field alone.
    let over = u16::try_from(V2_MAX_ADDR_LEN + 1).unwrap();
    refuse_at(&v2_raw(0x21, 0x11, over, &[]), 16, ProxyError::TooLong);
    refuse_at(&v2_raw(0x20, 0x00, u16::MAX, &[]), 16, ProxyError::TooLong);
}

#[test]
fn back_to_back_headers_consume_only_the_first() {
    let first = v2(0x21, 0x11, &V4_BLOCK, &[]);
    let stream = [&first[..], b"PROXY UNKNOWN\r\n"].concat();
    let Ok(Complete(h)) = parse_proxy_header(&stream) else {
        panic!("not complete");
    };
    assert_eq!(h.consumed, first.len());
}

/// Once refused or complete, a header stays so as more bytes arrive: byte-at-a-time and
/// whole-buffer parsing agree. Checked on every single-byte corruption of valid headers.
#[test]
fn verdicts_are_stable_under_more_bytes() {
    let valid: Vec<Vec<u8>> = vec![
        b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n".to_vec(),
        b"PROXY TCP6 2001:db8::1 ::ffff:192.0.2.1 1234 80\r\n".to_vec(),
        b"PROXY UNKNOWN 1.2.3.4\r\n".to_vec(),
        v2(0x21, 0x11, &V4_BLOCK, &tlv(0x01, b"h2")),
        v2(0x21, 0x21, &v6_block(), &[]),
        v2(0x20, 0x00, &[], &[]),
    ];
    let interesting = [
        0x00, 0x01, 0x02, 0x0A, 0x0D, 0x10, 0x11, 0x12, 0x20, 0x21, 0x22, 0x2E, 0x30, 0x31, 0x35,
        0x39, 0x3A, 0x41, 0x46, 0x50, 0x61, 0x66, 0x67, 0x7F, 0xFF,
    ];
    for good in &valid {
        let mut stream = good.clone();
        stream.extend_from_slice(HTTP);
        for at in 0..good.len() {
            for &byte in &interesting {
                let mut input = stream.clone();
                input[at] = byte;
                // A corrupted v2 length may legitimately still be waiting for bytes.
                let mut settled = None;
                for n in 0..=input.len() {
                    let got = parse_proxy_header(&input[..n]);
                    match settled {
                        Some(verdict) => assert_eq!(got, verdict, "{input:?} at {n}"),
                        None if got != Ok(Partial) => settled = Some(got),
                        None => {}
                    }
                }
            }
        }
    }
}

#[test]
fn error_strings_are_distinct() {
    use ProxyError::*;
    let all = [
        BadSignature,
        BadVersion,
        BadCommand,
        BadFamily,
        BadAddress,
        TooLong,
        BadLength,
        Malformed,
    ];
    for (i, a) in all.iter().enumerate() {
        assert!(!a.as_str().is_empty());
        assert_eq!(a.to_string(), a.as_str());
        for b in &all[i + 1..] {
            assert_ne!(a.as_str(), b.as_str());
        }
    }
}
