//! Randomized tests of HPACK: encoder-to-decoder round trips, the Huffman decoder against a bit-by-bit one, the dynamic table against a model, and random bytes that must never panic.

use super::huffman;
use super::tests::{decode, Fields};
use super::*;
use super::{encode, table};
use std::collections::HashMap;

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
fn slow_huffman(codes: &HashMap<(u32, u32), usize>, src: &[u8]) -> Result<Vec<u8>, ()> {
    let (mut out, mut code, mut len) = (Vec::new(), 0u32, 0u32);
    for k in 0..src.len() * 8 {
        code = (code << 1) | u32::from(src[k / 8] >> (7 - k % 8) & 1);
        len += 1;
        if let Some(&s) = codes.get(&(len, code)) {
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
    let codes: HashMap<(u32, u32), usize> = (0..257)
        .map(|s| ((u32::from(huffman::BITS[s]), huffman::CODES[s]), s))
        .collect();
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
        assert_eq!(
            fast_huffman(&junk),
            slow_huffman(&codes, &junk),
            "{junk:02x?}"
        );
    }
}

/// The dynamic table as RFC 7541 §2.3.2 and §4 describe it, newest first.
struct Model {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    max: usize,
}

impl Model {
    fn size(&self) -> usize {
        self.entries
            .iter()
            .map(|(n, v)| n.len() + v.len() + 32)
            .sum()
    }
    fn evict(&mut self) {
        while self.size() > self.max {
            self.entries.pop();
        }
    }
    fn insert(&mut self, n: Vec<u8>, v: Vec<u8>) {
        self.entries.insert(0, (n, v));
        self.evict();
    }
}

/// A string literal, raw or Huffman as asked.
fn string(b: &mut Vec<u8>, s: &[u8], huffman: bool) {
    if huffman {
        encode::integer(b, 0x80, 7, huffman::encoded_len(s));
        huffman::encode(s, b);
    } else {
        encode::integer(b, 0, 7, s.len());
        b.extend_from_slice(s);
    }
}

#[test]
fn the_dynamic_table_matches_a_model_through_wraps_evictions_and_size_updates() {
    let mut r = Rng::new(42);
    for limit in [100, 256, 4096, 600] {
        let mut d = Decoder::new(limit);
        let mut m = Model {
            entries: Vec::new(),
            max: limit,
        };
        for round in 0..1500 {
            let mut block = Vec::new();
            let mut want: Fields = Vec::new();
            for _ in 0..r.below(3) {
                let max = if r.below(2) == 0 {
                    limit
                } else {
                    r.below(limit + 1)
                };
                encode::integer(&mut block, 0x20, 5, max);
                m.max = max;
                m.evict();
            }
            for _ in 0..r.below(8) {
                let dynamic = m.entries.len();
                let kind = r.below(10);
                if kind < 3 {
                    // An indexed field, static or dynamic.
                    let i = 1 + r.below(61 + dynamic);
                    encode::integer(&mut block, 0x80, 7, i);
                    want.push(if i <= 61 {
                        let (n, v) = table::STATIC[i - 1];
                        (n.to_vec(), v.to_vec())
                    } else {
                        m.entries[i - 62].clone()
                    });
                    continue;
                }
                let (flags, prefix, insert) = match r.below(3) {
                    0 => (0x00, 4, false),
                    1 => (0x10, 4, false),
                    _ => (0x40, 6, true),
                };
                // The name: new, or by index (static or dynamic).
                let name = if r.below(3) == 0 {
                    encode::integer(&mut block, flags, prefix, 0);
                    let n = random_name(&mut r);
                    string(&mut block, &n, r.below(2) == 0);
                    n
                } else {
                    let i = 1 + r.below(61 + dynamic);
                    encode::integer(&mut block, flags, prefix, i);
                    if i <= 61 {
                        table::STATIC[i - 1].0.to_vec()
                    } else {
                        m.entries[i - 62].0.clone()
                    }
                };
                let n = match r.below(4) {
                    0 => r.below(limit),
                    _ => r.below(limit / 4),
                };
                let v = r.bytes(n, TEXT);
                string(&mut block, &v, r.below(2) == 0);
                want.push((name.clone(), v.clone()));
                if insert {
                    m.insert(name, v);
                }
            }
            assert_eq!(decode(&mut d, &block), Ok(want), "{limit} round {round}");
            assert_eq!(d.table_size(), m.size(), "{limit} round {round}");
            assert_eq!(d.table_len(), m.entries.len());
            for (k, e) in m.entries.iter().enumerate() {
                assert_eq!(
                    d.table_entry(k).as_ref(),
                    Some(e),
                    "{limit} round {round} {k}"
                );
            }
            // Never more than the ring and 12 bytes per entry slot.
            assert!(
                d.heap_bytes() <= limit + 12 * (limit / 32).next_power_of_two(),
                "{limit}: {}",
                d.heap_bytes()
            );
        }
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut r = Rng::new(99);
    let mut d = Decoder::new(4096);
    let mut valid: Vec<Vec<u8>> = Vec::new();
    let (mut ok, mut err) = (0, 0);
    for i in 0..100_000 {
        let block = match i % 4 {
            // Valid blocks with bytes flipped, cut or added.
            0 if !valid.is_empty() => {
                let mut b: Vec<u8> = valid[r.below(valid.len())].clone();
                for _ in 0..1 + r.below(3) {
                    if b.is_empty() {
                        break;
                    }
                    let at = r.below(b.len());
                    match r.below(3) {
                        0 => b[at] = r.next() as u8,
                        1 => b.truncate(at),
                        _ => b.insert(at, r.next() as u8),
                    }
                }
                b
            }
            _ => {
                let n = r.below(48);
                r.bytes(n, &[])
            }
        };
        let mut list = 0;
        match d.decode(&block, 1 + r.below(8192), |n, v| {
            list += n.len() + v.len();
            Ok(())
        }) {
            Ok(_) => ok += 1,
            Err(_) => err += 1,
        }
        assert!(list <= 8192);
        if i % 100 == 0 {
            // Fresh valid blocks that insert, to mutate.
            let mut b = Vec::new();
            b.push(0x40);
            let n = random_name(&mut r);
            string(&mut b, &n, r.below(2) == 0);
            let v = random_value(&mut r);
            string(&mut b, &v, r.below(2) == 0);
            b.push(0x80 | 62);
            valid.push(b);
        }
        if i % 5000 == 0 {
            d = Decoder::new([0, 64, 4096][r.below(3)]);
        }
    }
    assert!(ok > 1000 && err > 1000, "{ok} {err}");
}

#[test]
fn static_names_are_found_at_their_first_index_and_others_not() {
    for (i, (name, _)) in table::STATIC.iter().enumerate() {
        let first = table::STATIC.iter().position(|(n, _)| n == name).unwrap() + 1;
        assert_eq!(encode::static_name(name), Some(first), "{i}");
        assert!(first <= i + 1);
    }
    for name in [
        &b""[..],
        b"x",
        b"dates",
        b"dat",
        b"content-typ",
        b"Content-Type",
        b":statu",
    ] {
        assert_eq!(encode::static_name(name), None, "{name:?}");
    }
}
