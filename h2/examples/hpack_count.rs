//! Runs one HPACK job `n` times, for counting instructions under callgrind: `hpack_count <job> <n>` (jobs: decode-c4, decode-c4-steady, decode-indexed, encode-response); per-run cost = (count(n) - count(1)) / (n - 1).

use std::hint::black_box;
use zgix_h2::hpack::{Decoder, Encoder};

/// RFC 7541 Appendix C.4.1–C.4.3: three requests with Huffman.
const C4: [&[u8]; 3] = [
    &[
        0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90,
        0xf4, 0xff,
    ],
    &[
        0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf,
    ],
    &[
        0x82, 0x87, 0x85, 0xbf, 0x40, 0x88, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f, 0x89,
        0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf,
    ],
];

fn sink(n: &[u8], v: &[u8]) -> Result<(), ()> {
    black_box((n, v));
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let job = args.get(1).map(String::as_str).unwrap_or("decode-c4");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    match job {
        // A fresh decoder (its table allocated) and the three requests.
        "decode-c4" => {
            for _ in 0..n {
                let mut d = Decoder::new(4096);
                for b in C4 {
                    black_box(d.decode(black_box(b), 65536, sink)).unwrap();
                }
                black_box(&d);
            }
        }
        // One decoder: the three requests again and again (the table
        // full and evicting after a while).
        "decode-c4-steady" => {
            let mut d = Decoder::new(4096);
            for _ in 0..n {
                for b in C4 {
                    black_box(d.decode(black_box(b), 65536, sink)).unwrap();
                }
            }
        }
        // What h2load's requests become once the table has them: every
        // field an index (static, or the connection's entries).
        "decode-indexed" => {
            let mut d = Decoder::new(4096);
            let mut seed = vec![0x82, 0x87, 0x84, 0x41, 14];
            seed.extend_from_slice(b"localhost:8443");
            seed.extend_from_slice(&[0x40 | 58, 21]);
            seed.extend_from_slice(b"h2load nghttp2/1.59.0");
            seed.extend_from_slice(&[0x40 | 19, 3]);
            seed.extend_from_slice(b"*/*");
            d.decode(&seed, 65536, sink).unwrap();
            let block = [0x82, 0x87, 0x84, 0x80 | 64, 0x80 | 62, 0x80 | 63];
            for _ in 0..n {
                black_box(d.decode(black_box(&block), 65536, sink)).unwrap();
            }
        }
        "encode-response" => {
            let mut e = Encoder::new();
            let mut dst = Vec::with_capacity(256);
            for _ in 0..n {
                dst.clear();
                e.begin(&mut dst);
                e.status(black_box(200), &mut dst);
                e.field(
                    b"content-type",
                    b"text/html; charset=utf-8",
                    false,
                    &mut dst,
                );
                e.field(b"content-length", black_box(b"12345"), false, &mut dst);
                e.field(
                    b"date",
                    black_box(b"Thu, 03 Dec 2026 18:50:00 GMT"),
                    false,
                    &mut dst,
                );
                e.field(b"server", b"zgix", false, &mut dst);
                black_box(&dst);
            }
        }
        _ => panic!("unknown job {job}"),
    }
}
