//! Randomized tests of HPACK: encoder-to-decoder round trips, the Huffman decoder against a bit-by-bit one, the dynamic table against a model, and random bytes that must never panic.

use super::huffman;
use super::tests::{decode, Fields};
use super::*;

/// xorshift64*: a small deterministic generator, no dependency.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub(super) fn bytes(&mut self, n: usize, alphabet: &[u8]) -> Vec<u8> {
        (0..n)
            .map(|_| {
                if alphabet.is_empty() {
                    self.next() as u8
                } else {
                    alphabet[self.below(alphabet.len())]
                }
            })
            .collect()
    }
}

const TOKEN: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-_";
const TEXT: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ;=,/.:-_\"'()<>{}[]\\~^`|@#$%&*+?!";

fn random_value(r: &mut Rng) -> Vec<u8> {
    let len = match r.below(6) {
        0 => 0,
        1 => r.below(8),
        2 | 3 => r.below(128),
        4 => 127 + r.below(3),
        _ => r.below(3000),
    };
    let alphabet: &[u8] = if r.below(3) == 0 { &[] } else { TEXT };
    r.bytes(len, alphabet)
}

fn random_name(r: &mut Rng) -> Vec<u8> {
    match r.below(4) {
        0 => {
            let names = [
                &b"content-type"[..],
                b"date",
                b"server",
                b"content-length",
                b"set-cookie",
                b"accept-encoding",
                b"www-authenticate",
                b"x-long-name-for-a-multi-byte-length-and-more-bytes-than-one-hundred-and-twenty-seven-octets-to-see-the-integer-continue-across",
            ];
            names[r.below(names.len())].to_vec()
        }
        1 => {
            let n = r.below(300);
            r.bytes(n, &[])
        }
        _ => {
            let n = 1 + r.below(20);
            r.bytes(n, TOKEN)
        }
    }
}

#[test]
fn random_responses_round_trip_through_the_decoder() {
    let mut r = Rng::new(0x5eed);
    let mut d = Decoder::new(4096);
    let mut e = Encoder::new();
    for round in 0..3000 {
        let mut block = Vec::new();
        if round % 97 == 0 {
            e.set_peer_max_table(r.below(5000));
        }
        e.begin(&mut block);
        let code = [
            200, 204, 206, 304, 400, 404, 500, 100, 302, 503, 999, 0, 65535,
        ][r.below(13)];
        e.status(code, &mut block);
        let mut want: Fields = vec![(b":status".to_vec(), code.to_string().into_bytes())];
        for _ in 0..r.below(12) {
            let (n, v) = (random_name(&mut r), random_value(&mut r));
            e.field(&n, &v, r.below(4) == 0, &mut block);
            want.push((n, v));
        }
        assert_eq!(decode(&mut d, &block), Ok(want), "round {round}");
        // Nothing the encoder writes adds to a table.
        assert_eq!(d.heap_bytes(), 0);
    }
}

#[test]
fn the_encoder_uses_indexes_huffman_and_never_indexed_literals() {
    let mut e = Encoder::new();
    let mut b = Vec::new();
    e.begin(&mut b);
    assert!(b.is_empty());
    e.status(200, &mut b);
    e.status(404, &mut b);
    assert_eq!(b, [0x88, 0x8d]);
    b.clear();
    e.status(302, &mut b);
    // Name index 8 without indexing, "302" in Huffman (RFC 7541 C.6.1).
    assert_eq!(b, [0x08, 0x82, 0x64, 0x02]);
    b.clear();
    e.field(b"cache-control", b"private", false, &mut b);
    // §6.2.2 with name index 24 (15 + 9), Huffman as C.6.1's.
    assert_eq!(b, [0x0f, 0x09, 0x85, 0xae, 0xc3, 0x77, 0x1a, 0x4b]);
    b.clear();
    e.field(b"authorization", b"secret", true, &mut b);
    assert_eq!(b[..2], [0x1f, 0x08]);
    b.clear();
    e.field(b"x-a", b"\x00\x01", false, &mut b);
    // Raw where Huffman is longer: the name 3 bytes either way? 'x' is 7
    // bits, '-' 6, 'a' 5: 18 bits = 3 bytes, not shorter, so raw.
    assert_eq!(b, [0x00, 0x03, b'x', b'-', b'a', 0x02, 0x00, 0x01]);
    b.clear();
    e.field(b"accept-encoding", b"gzip, deflate", false, &mut b);
    assert_eq!(b, [0x80 | 16]);
    // A size update to 0 after the client's setting, once.
    e.set_peer_max_table(0);
    e.set_peer_max_table(100);
    b.clear();
    e.begin(&mut b);
    e.begin(&mut b);
    assert_eq!(b, [0x20]);
}

/// The Huffman decoder, one bit at a time, from the code table.
fn slow_huffman(src: &[u8]) -> Result<Vec<u8>, ()> {
    let (mut out, mut code, mut len) = (Vec::new(), 0u32, 0u32);
    for k in 0..src.len() * 8 {
        code = (code << 1) | u32::from(src[k / 8] >> (7 - k % 8) & 1);
        len += 1;
        if let Some(s) =
            (0..257).find(|&s| u32::from(huffman::BITS[s]) == len && huffman::CODES[s] == code)
        {
            if s == 256 {
                return Err(());
            }
            out.push(s as u8);
            (code, len) = (0, 0);
        }
    }
    if len > 7 || code != (1 << len) - 1 {
        return Err(());
    }
    Ok(out)
}

fn fast_huffman(src: &[u8]) -> Result<Vec<u8>, ()> {
    let mut out = vec![0; huffman::max_decoded(src.len())];
    let n = huffman::decode(src, &mut out)?;
    out.truncate(n);
    Ok(out)
}

#[test]
fn the_huffman_code_is_rfc_7541s() {
    assert_eq!(huffman::CODES[usize::from(b'a')], 0b00011);
    assert_eq!(huffman::CODES[usize::from(b'&')], 0b1111_1000);
    assert_eq!(huffman::CODES[256], 0x3fff_ffff);
    assert_eq!(huffman::CODES[0], 0x1ff8);
    assert_eq!(huffman::CODES[255], 0x3ff_ffee);
    let mut b = Vec::new();
    huffman::encode(b"www.example.com", &mut b);
    assert_eq!(b, super::tests::hex("f1e3c2e5f23a6ba0ab90f4ff"));
    assert_eq!(huffman::encoded_len(b"www.example.com"), 12);
}

#[test]
fn huffman_round_trips_and_matches_a_bit_by_bit_decoder() {
    let mut r = Rng::new(7);
    for i in 0..20_000 {
        let n = r.below(64);
        let s = r.bytes(n, if i % 2 == 0 { &[] } else { TEXT });
        let mut b = Vec::new();
        huffman::encode(&s, &mut b);
        assert_eq!(b.len(), huffman::encoded_len(&s));
        assert_eq!(fast_huffman(&b), Ok(s.clone()), "{s:?}");
        // Random bytes, and encoded strings with a byte changed or cut.
        let n = r.below(20);
        let mut junk = r.bytes(n, &[]);
        if i % 3 == 0 && !b.is_empty() {
            junk = b.clone();
            let at = r.below(junk.len());
            junk[at] ^= 1 << r.below(8);
            junk.truncate(junk.len() - r.below(2));
        }
        assert_eq!(fast_huffman(&junk), slow_huffman(&junk), "{junk:02x?}");
    }
}
