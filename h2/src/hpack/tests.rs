//! Tests of HPACK: RFC 7541 Appendix C, every decoding error, the header-list limit, the table's memory.

use super::*;

pub(super) type Fields = Vec<(Vec<u8>, Vec<u8>)>;

pub(super) fn hex(s: &str) -> Vec<u8> {
    let s: Vec<u8> = s.bytes().filter(|c| c.is_ascii_hexdigit()).collect();
    s.chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

pub(super) fn decode(d: &mut Decoder, block: &[u8]) -> Result<Fields, DecodeError> {
    let mut out = Vec::new();
    let all = d.decode(block, usize::MAX, |n, v| {
        out.push((n.to_vec(), v.to_vec()));
        Ok(())
    })?;
    assert!(all);
    Ok(out)
}

fn fields(f: &[(&str, &str)]) -> Fields {
    f.iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn table(d: &Decoder) -> Fields {
    (0..d.table_len())
        .map(|k| d.table_entry(k).unwrap())
        .collect()
}

/// One step of an Appendix C example: the block, the fields it decodes
/// to, the dynamic table after it (newest first) and its size.
type Step<'a> = (
    &'a str,
    &'a [(&'a str, &'a str)],
    &'a [(&'a str, &'a str)],
    usize,
);

fn run(max_table: usize, steps: &[Step]) {
    let mut d = Decoder::new(max_table);
    for (i, (block, want, tab, size)) in steps.iter().enumerate() {
        assert_eq!(decode(&mut d, &hex(block)), Ok(fields(want)), "step {i}");
        assert_eq!(table(&d), fields(tab), "step {i}");
        assert_eq!(d.table_size(), *size, "step {i}");
    }
}

#[test]
fn c2_literals_and_indexed() {
    run(
        4096,
        &[(
            "400a637573746f6d2d6b65790d637573746f6d2d686561646572",
            &[("custom-key", "custom-header")],
            &[("custom-key", "custom-header")],
            55,
        )],
    );
    let plain: Step = (
        "040c2f73616d706c652f70617468",
        &[(":path", "/sample/path")],
        &[],
        0,
    );
    run(4096, &[plain]);
    run(
        4096,
        &[(
            "100870617373776f726406736563726574",
            &[("password", "secret")],
            &[],
            0,
        )],
    );
    run(4096, &[("82", &[(":method", "GET")], &[], 0)]);
}

const REQ1: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":path", "/"),
    (":authority", "www.example.com"),
];
const REQ2: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":path", "/"),
    (":authority", "www.example.com"),
    ("cache-control", "no-cache"),
];
const REQ3: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "https"),
    (":path", "/index.html"),
    (":authority", "www.example.com"),
    ("custom-key", "custom-value"),
];
const REQ_T1: &[(&str, &str)] = &[(":authority", "www.example.com")];
const REQ_T2: &[(&str, &str)] = &[
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];
const REQ_T3: &[(&str, &str)] = &[
    ("custom-key", "custom-value"),
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];

pub(super) const C3: [&str; 3] = [
    "828684410f7777772e6578616d706c652e636f6d",
    "828684be58086e6f2d6361636865",
    "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
];
pub(super) const C4: [&str; 3] = [
    "828684418cf1e3c2e5f23a6ba0ab90f4ff",
    "828684be5886a8eb10649cbf",
    "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
];

#[test]
fn c3_requests_without_huffman() {
    run(
        4096,
        &[
            (C3[0], REQ1, REQ_T1, 57),
            (C3[1], REQ2, REQ_T2, 110),
            (C3[2], REQ3, REQ_T3, 164),
        ],
    );
}

#[test]
fn c4_requests_with_huffman() {
    run(
        4096,
        &[
            (C4[0], REQ1, REQ_T1, 57),
            (C4[1], REQ2, REQ_T2, 110),
            (C4[2], REQ3, REQ_T3, 164),
        ],
    );
}

const DATE1: &str = "Mon, 21 Oct 2013 20:13:21 GMT";
const DATE2: &str = "Mon, 21 Oct 2013 20:13:22 GMT";
const LOC: &str = "https://www.example.com";
const COOKIE: &str = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
const RESP1: &[(&str, &str)] = &[
    (":status", "302"),
    ("cache-control", "private"),
    ("date", DATE1),
    ("location", LOC),
];
const RESP2: &[(&str, &str)] = &[
    (":status", "307"),
    ("cache-control", "private"),
    ("date", DATE1),
    ("location", LOC),
];
const RESP3: &[(&str, &str)] = &[
    (":status", "200"),
    ("cache-control", "private"),
    ("date", DATE2),
    ("location", LOC),
    ("content-encoding", "gzip"),
    ("set-cookie", COOKIE),
];
const RESP_T1: &[(&str, &str)] = &[
    ("location", LOC),
    ("date", DATE1),
    ("cache-control", "private"),
    (":status", "302"),
];
const RESP_T2: &[(&str, &str)] = &[
    (":status", "307"),
    ("location", LOC),
    ("date", DATE1),
    ("cache-control", "private"),
];
const RESP_T3: &[(&str, &str)] = &[
    ("set-cookie", COOKIE),
    ("content-encoding", "gzip"),
    ("date", DATE2),
];

#[test]
fn c5_responses_without_huffman_evict_at_256() {
    run(
        256,
        &[
            (
                "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d54\
                 6e1768747470733a2f2f7777772e6578616d706c652e636f6d",
                RESP1,
                RESP_T1,
                222,
            ),
            ("4803333037c1c0bf", RESP2, RESP_T2, 222),
            (
                "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f\
                 3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b2076\
                 657273696f6e3d31",
                RESP3,
                RESP_T3,
                215,
            ),
        ],
    );
}

#[test]
fn c6_responses_with_huffman_evict_at_256() {
    run(
        256,
        &[
            (
                "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f\
                 0b97c8e9ae82ae43d3",
                RESP1,
                RESP_T1,
                222,
            ),
            ("4883640effc1c0bf", RESP2, RESP_T2, 222),
            (
                "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335df\
                 dfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007",
                RESP3,
                RESP_T3,
                215,
            ),
        ],
    );
}

fn refused(block: &[u8]) {
    let mut d = Decoder::new(4096);
    assert_eq!(
        decode(&mut d, block),
        Err(DecodeError::Compression),
        "{block:02x?}"
    );
}

#[test]
fn an_index_of_0_is_refused() {
    refused(&[0x80]);
    refused(&[0x82, 0x80]);
}

#[test]
fn an_index_past_both_tables_is_refused() {
    refused(&[0x80 | 62]);
    refused(&[0x82, 0x80 | 70]);
    // As a literal's name: with and without indexing, never indexed.
    refused(&[0x40 | 62, 0x01, b'a']);
    refused(&[0x0f, 62 - 15, 0x01, b'a']);
    refused(&[0x1f, 62 - 15, 0x01, b'a']);
    // One past the entries there are.
    let mut d = Decoder::new(4096);
    decode(&mut d, &hex(C3[0])).unwrap();
    assert!(decode(&mut d, &[0x80 | 62]).is_ok());
    assert_eq!(decode(&mut d, &[0x80 | 63]), Err(DecodeError::Compression));
}

#[test]
fn an_integer_past_u32_or_5_continuation_bytes_is_refused() {
    // The e2e suite's block: 2^32 + 62.
    refused(&[0x82, 0x7f, 0xff, 0xff, 0xff, 0xff, 0x0f]);
    refused(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
    // Six continuation bytes, however small the value.
    refused(&[0xff, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]);
    refused(&[0x3f, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]);
    let mut d = Decoder::new(4096);
    // A size update spelt with 5 continuation bytes: 31 + 0.
    assert!(decode(&mut d, &[0x3f, 0x80, 0x80, 0x80, 0x80, 0x00]).is_ok());
    assert_eq!(d.table_len(), 0);
}

#[test]
fn a_block_cut_inside_a_field_is_refused() {
    for block in [
        &[0xff][..],
        &[0xff, 0x80],
        &[0x82, 0x41, 0x05, b'a'],
        &[0x40, 0x05, b'a'],
        &[0x40, 0x01, b'a'],
        &[0x40, 0x01, b'a', 0x7f],
        &[0x40, 0x01, b'a', 0x02, b'v'],
        &[0x04],
        &[0x10],
        &[0x3f],
        &[0x40, 0x81],
    ] {
        refused(block);
    }
}

/// A literal without indexing, new name "a", its value these Huffman bytes.
fn huffman_value(code: &[u8]) -> Vec<u8> {
    let mut b = vec![0x00, 0x01, b'a', 0x80 | code.len() as u8];
    b.extend_from_slice(code);
    b
}

#[test]
fn eos_in_a_huffman_string_is_refused() {
    // EOS (30 ones) then 2 bits of padding.
    refused(&huffman_value(&[0xff, 0xff, 0xff, 0xff]));
    // 'a' (00011), then EOS, then padding.
    refused(&huffman_value(&[0x1f, 0xff, 0xff, 0xff, 0xff]));
    // EOS as a name.
    refused(&[0x00, 0x84, 0xff, 0xff, 0xff, 0xff, 0x00]);
}

#[test]
fn a_huffman_padding_over_7_bits_or_not_ones_is_refused() {
    // 'a' then 11 one bits.
    refused(&huffman_value(&[0x1f, 0xff]));
    // A whole byte of padding alone.
    refused(&huffman_value(&[0xff]));
    // 'a' then 000 (not a prefix of EOS), then 001.
    refused(&huffman_value(&[0x18]));
    refused(&huffman_value(&[0x19]));
    // But 'a' then 111 is "a".
    let mut d = Decoder::new(4096);
    assert_eq!(
        decode(&mut d, &huffman_value(&[0x1f])).unwrap(),
        fields(&[("a", "a")])
    );
    // And no bytes decode to "".
    assert_eq!(
        decode(&mut d, &huffman_value(&[])).unwrap(),
        fields(&[("a", "")])
    );
}

#[test]
fn a_size_update_over_the_maximum_or_after_a_field_is_refused() {
    // 4097 > 4096.
    refused(&[0x3f, 0xe2, 0x1f]);
    refused(&[0x82, 0x20]);
    refused(&[0x20, 0x82, 0x20]);
    let mut d = Decoder::new(100);
    assert_eq!(decode(&mut d, &[0x3f, 0x46]), Err(DecodeError::Compression));
    // Two at the start are fine (RFC 7541 §4.2): 0, then 4096.
    let mut d = Decoder::new(4096);
    decode(&mut d, &hex(C3[0])).unwrap();
    assert_eq!(
        decode(&mut d, &[0x20, 0x3f, 0xe1, 0x1f, 0x82]).unwrap(),
        fields(&[(":method", "GET")])
    );
    assert_eq!(d.table_len(), 0);
    assert_eq!(decode(&mut d, &[0x80 | 62]), Err(DecodeError::Compression));
    // A smaller maximum evicts; entries then fit it.
    decode(&mut d, &hex(C3[0])).unwrap();
    decode(&mut d, &hex(C3[1])).unwrap();
    assert_eq!(d.table_size(), 110);
    decode(&mut d, &[0x3f, 0x1b]).unwrap(); // 58
    assert_eq!(table(&d), fields(&[("cache-control", "no-cache")]));
    decode(&mut d, &hex(C3[0])).unwrap();
    assert_eq!(table(&d), fields(&[(":authority", "www.example.com")]));
}

/// Blocks that add `x-N: value` (incremental indexing, new names).
fn inserting(n: usize, value_len: usize) -> Vec<u8> {
    let mut enc = Vec::new();
    for i in 0..n {
        let name = format!("x-{i}");
        enc.push(0x40);
        encode::string(&mut enc, name.as_bytes());
        encode::string(&mut enc, &vec![b'v'; value_len]);
    }
    enc
}

#[test]
fn a_list_too_large_is_decoded_whole_and_keeps_the_table_in_step() {
    let mut d = Decoder::new(4096);
    let block = inserting(5, 40);
    let mut seen = 0;
    // Each field is 3 + 40 + 32 = 75: two fit in 160, the third does not.
    let r = d.decode(&block, 160, |_, _| {
        seen += 1;
        Ok(())
    });
    assert_eq!(r, Err(DecodeError::ListTooLarge));
    assert_eq!(seen, 2);
    assert_eq!(d.table_len(), 5);
    // Exactly at the limit is within it.
    let r = d.decode(&[0x80 | 62, 0x80 | 63], 150, |_, _| Ok(()));
    assert_eq!(r, Ok(true));
    let r = d.decode(&[0x80 | 62, 0x80 | 63], 149, |_, _| Ok(()));
    assert_eq!(r, Err(DecodeError::ListTooLarge));
    let got = decode(&mut d, &[0x80 | 62, 0x80 | 66]).unwrap();
    assert_eq!(
        got,
        vec![
            (b"x-4".to_vec(), vec![b'v'; 40]),
            (b"x-0".to_vec(), vec![b'v'; 40])
        ]
    );
    // A decoding error after the limit is still a decoding error.
    let mut bad = inserting(5, 40);
    bad.push(0x80);
    assert_eq!(
        d.decode(&bad, 160, |_, _| Ok(())),
        Err(DecodeError::Compression)
    );
}

#[test]
fn a_callback_that_stops_is_not_called_again_and_the_table_keeps_in_step() {
    let mut d = Decoder::new(4096);
    let mut seen = 0;
    let r = d.decode(&inserting(4, 3), usize::MAX, |_, _| {
        seen += 1;
        Err(())
    });
    assert_eq!(r, Ok(false));
    assert_eq!(seen, 1);
    assert_eq!(
        decode(&mut d, &[0x80 | 62]).unwrap(),
        fields(&[("x-3", "vvv")])
    );
}

#[test]
fn an_hpack_bomb_hands_over_at_most_max_list() {
    let mut d = Decoder::new(4096);
    // The e2e suite's bomb: 4,000 bytes at index 62, then 2,000 references.
    let mut seed = vec![0x40];
    encode::string(&mut seed, b"x-bomb");
    encode::string(&mut seed, &[b'x'; 4000]);
    decode(&mut d, &seed).unwrap();
    let bomb = vec![0x80 | 62; 2000];
    let (mut calls, mut bytes) = (0, 0);
    let r = d.decode(&bomb, 16 << 10, |n, v| {
        calls += 1;
        bytes += n.len() + v.len();
        Ok(())
    });
    assert_eq!(r, Err(DecodeError::ListTooLarge));
    assert_eq!(calls, 4);
    assert!(bytes <= 16 << 10);
}

#[test]
fn heap_bytes_is_0_until_an_insert_and_bounded_after_many() {
    let mut d = Decoder::new(4096);
    assert_eq!(d.heap_bytes(), 0);
    decode(&mut d, &hex("040c2f73616d706c652f70617468")).unwrap();
    decode(&mut d, &[0x82, 0x86, 0x84]).unwrap();
    decode(&mut d, &huffman_value(&[0x1f])).unwrap();
    assert_eq!(d.heap_bytes(), 0);
    decode(&mut d, &hex(C4[0])).unwrap();
    let small = d.heap_bytes();
    assert!(small > 0 && small <= 256, "{small}");
    let mut most = 0;
    for round in 0..200 {
        decode(&mut d, &inserting(7, round % 90)).unwrap();
        most = most.max(d.heap_bytes());
    }
    // The ring (<= 4096) and 12 bytes for each of at most 128 entries.
    assert!(most <= 4096 + 128 * 12, "{most}");
    // Emptied by a size update to 0: nothing held.
    decode(&mut d, &[0x20]).unwrap();
    assert_eq!(d.heap_bytes(), 0);
}

#[test]
fn a_lowered_limit_evicts_and_wants_a_size_update_first() {
    let mut d = Decoder::new(4096);
    decode(&mut d, &hex(C3[0])).unwrap();
    decode(&mut d, &hex(C3[1])).unwrap();
    assert_eq!(d.table_size(), 110);
    // Raised: nothing due.
    d.set_max_table(8192);
    assert!(decode(&mut d, &[0x82]).is_ok());
    // Lowered to 60: the older entry goes now, and an update is due.
    d.set_max_table(60);
    assert_eq!(table(&d), fields(&[("cache-control", "no-cache")]));
    assert_eq!(decode(&mut d, &[0x82]), Err(DecodeError::Compression));
    let mut d = Decoder::new(4096);
    decode(&mut d, &hex(C3[0])).unwrap();
    d.set_max_table(60);
    assert_eq!(decode(&mut d, &[]), Err(DecodeError::Compression));
    let mut d = Decoder::new(4096);
    d.set_max_table(60);
    // An update over the new limit is refused; one within it is fine.
    assert_eq!(
        decode(&mut d, &[0x3f, 0x1e, 0x82]),
        Err(DecodeError::Compression)
    );
    let mut d = Decoder::new(4096);
    d.set_max_table(60);
    assert!(decode(&mut d, &[0x3f, 0x1d, 0x82]).is_ok());
    assert!(decode(&mut d, &[0x82]).is_ok());
}
