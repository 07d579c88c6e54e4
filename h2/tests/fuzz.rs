//! Random input never panics the server (random bytes, and valid frames mutated, fed in random pieces, with the send calls mixed in), and a valid conversation fed a byte at a time gives the events and frames it gives fed whole.

mod support;
use support::*;

/// Rounds per fuzz test: 3,000, or `ZGIX_H2_FUZZ_ROUNDS`.
fn rounds() -> usize {
    std::env::var("ZGIX_H2_FUZZ_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

/// The seed, or `ZGIX_H2_FUZZ_SEED` mixed into it.
fn seed(base: u64) -> u64 {
    let extra: u64 = std::env::var("ZGIX_H2_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (base ^ extra.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1
}

/// xorshift64*: reproducible without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A valid conversation: streams with bodies, padding, priority,
/// CONTINUATION, trailers, resets, pings, settings, window updates.
fn script() -> Vec<u8> {
    let mut b = PREFACE.to_vec();
    b.extend(frame(
        SETTINGS,
        0,
        0,
        &[0, 4, 0, 1, 0, 0, 0, 1, 0, 0, 0x10, 0],
    ));
    b.extend(frame(SETTINGS, ACK, 0, &[]));
    b.extend(frame(WINDOW_UPDATE, 0, 0, &[0, 1, 0, 0]));
    b.extend(headers(1, &post(Some("12")), false));
    let mut ix = get("/indexed");
    lit_indexed(&mut ix, b"x-kept", b"some value");
    b.extend(headers(3, &ix, true));
    let blk = get("/split/over/continuation");
    b.extend(frame(HEADERS, 0, 5, &blk[..7]));
    b.extend(frame(CONTINUATION, 0, 5, &blk[7..12]));
    b.extend(frame(CONTINUATION, END_HEADERS, 5, &blk[12..]));
    b.extend(frame(DATA, 0, 1, b"hello "));
    b.extend(frame(PING, 0, 0, b"pingpong"));
    let mut padded = vec![3, 0, 0, 0, 0, 16];
    padded.extend(post(None));
    padded.extend([0, 0, 0]);
    b.extend(frame(
        HEADERS,
        END_HEADERS | PADDED | PRIORITY_FLAG,
        7,
        &padded,
    ));
    b.extend(frame(PRIORITY, 0, 9, &[0, 0, 0, 1, 16]));
    b.extend(frame(DATA, PADDED, 7, &[2, b'a', b'b', 0, 0]));
    b.extend(frame(DATA, END_STREAM, 1, b"world!"));
    b.extend(frame(0x42, 0, 0, b"unknown"));
    let mut again = get("/again");
    again.push(0x80 | 62);
    b.extend(headers(9, &again, true));
    b.extend(frame(RST_STREAM, 0, 7, &8u32.to_be_bytes()));
    b.extend(frame(WINDOW_UPDATE, 0, 5, &[0, 0, 1, 0]));
    b.extend(headers(11, &post(None), false));
    b.extend(frame(DATA, 0, 11, &[b'z'; 3000]));
    let mut t = Vec::new();
    lit(&mut t, b"x-trailer", b"t");
    b.extend(frame(HEADERS, END_HEADERS | END_STREAM, 11, &t));
    b.extend(frame(GOAWAY, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0]));
    b
}

fn run(
    bytes: &[u8],
    pieces: &mut dyn FnMut(usize) -> usize,
) -> (Vec<Ev>, Vec<Out>, Option<ConnError>) {
    let mut c = Client::bare(Config::default());
    let mut at = 0;
    while at < bytes.len() {
        let n = pieces(bytes.len() - at).clamp(1, bytes.len() - at);
        c.send(&bytes[at..at + n]);
        at += n;
        // Respond the same whatever the pieces: on each request once whole.
        for e in c.events.clone() {
            if let Ev::Request { id, end: true, .. } = e {
                let _ = c.s.send_response(id, 200, std::iter::empty(), true);
            }
        }
    }
    // The answers go in when a request is whole, which depends on the
    // pieces: the server's own frames in order, then the answers in order.
    let p = c.s.pending().to_vec();
    let (mut out, answers): (Vec<Out>, Vec<Out>) = parse_frames(&p)
        .into_iter()
        .partition(|f| f.kind != HEADERS);
    out.extend(answers);
    (joined(&c.events), out, c.err)
}

#[test]
fn a_conversation_fed_a_byte_at_a_time_gives_what_it_gives_whole() {
    let s = script();
    let whole = run(&s, &mut |n| n);
    assert!(whole.2.is_none(), "{:?}", whole.2);
    let reqs = whole
        .0
        .iter()
        .filter(|e| matches!(e, Ev::Request { .. }))
        .count();
    assert_eq!(reqs, 6, "{:?}", whole.0);
    assert!(whole.0.contains(&Ev::Data {
        id: 1,
        data: b"world!".to_vec(),
        end: true
    }));
    assert!(whole.0.contains(&Ev::Trailers {
        id: 11,
        fields: vec![(b"x-trailer".to_vec(), b"t".to_vec())]
    }));
    assert!(whole.0.contains(&Ev::Reset { id: 7, code: 8 }));
    assert!(whole.0.contains(&Ev::GoAway { last: 0, code: 0 }));
    let Some(Ev::Request { fields, .. }) = whole
        .0
        .iter()
        .find(|e| matches!(e, Ev::Request { id: 9, .. }))
    else {
        panic!()
    };
    assert_eq!(fields, &[(b"x-kept".to_vec(), b"some value".to_vec())]);
    let bytewise = run(&s, &mut |_| 1);
    assert_eq!(whole.0, bytewise.0);
    assert_eq!(whole.1, bytewise.1);
    let mut r = Rng(7);
    for _ in 0..50 {
        let random = run(&s, &mut |n| 1 + r.below(n.min(40)));
        assert_eq!(whole.0, random.0);
        assert_eq!(whole.1, random.1);
    }
}

/// Feeds `bytes` in random pieces with random send calls between; never panics.
fn chaos(bytes: &[u8], r: &mut Rng) {
    let mut s = Server::new(Config {
        max_concurrent_streams: 8,
        max_header_list: 4096,
        ..Config::default()
    });
    let mut tail = Vec::new();
    let mut at = 0;
    let mut ids = vec![1u32];
    while at < bytes.len() {
        let n = (1 + r.below(64)).min(bytes.len() - at);
        tail.extend_from_slice(&bytes[at..at + n]);
        at += n;
        let mut err = false;
        match s.recv(&tail, &mut |e| {
            if let Event::Request { id, .. } = e {
                ids.push(id);
            }
        }) {
            Ok(k) => {
                tail.drain(..k);
            }
            Err(_) => err = true,
        }
        let id = ids[r.below(ids.len())];
        match r.below(8) {
            0 => {
                let _ = s.send_response(
                    id,
                    200,
                    [(&b"x"[..], &b"y"[..])].into_iter(),
                    r.below(2) == 0,
                );
            }
            1 => {
                let _ = s.send_data(id, &[0; 3000], r.below(2) == 0);
            }
            2 => s.release(id, r.below(20_000)),
            3 => s.reset(id, Code::CANCEL),
            4 => {
                let w = r.below(s.pending().len() + 1);
                s.written(w);
            }
            5 => s.tick(),
            6 => {
                let _ = s.send_trailers(id, std::iter::empty());
            }
            _ => {
                let _ = s.send_window(id);
            }
        }
        if r.below(200) == 0 {
            s.graceful_shutdown();
        }
        if err {
            assert!(
                s.recv(b"more", &mut |_| {}).is_err(),
                "an ended connection stays ended"
            );
            return;
        }
        assert!(s.open_streams() <= 8, "max_concurrent_streams holds");
        assert!(s.heap_bytes() < 4 << 20, "{}", s.heap_bytes());
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut r = Rng(seed(0x9e37_79b9_7f4a_7c15));
    for _ in 0..rounds() {
        let mut b = PREFACE.to_vec();
        b.extend(frame(SETTINGS, 0, 0, &[]));
        let n = r.below(600);
        b.extend((0..n).map(|_| r.next() as u8));
        chaos(&b, &mut r);
    }
}

#[test]
fn mutated_conversations_never_panic() {
    let s = script();
    let mut r = Rng(seed(42));
    for _ in 0..rounds() {
        let mut b = s.clone();
        for _ in 0..1 + r.below(6) {
            let i = 33 + r.below(b.len() - 33);
            match r.below(4) {
                0 => b[i] = r.next() as u8,
                1 => b[i] ^= 1 << r.below(8),
                2 => {
                    b.remove(i);
                }
                _ => b.insert(i, r.next() as u8),
            }
        }
        chaos(&b, &mut r);
    }
}

#[test]
fn random_frames_never_panic() {
    // Well-framed nonsense: random types, flags, small stream ids and
    // payloads, with now and then a real header block.
    let mut r = Rng(seed(2026));
    for _ in 0..rounds() {
        let mut b = PREFACE.to_vec();
        b.extend(frame(SETTINGS, 0, 0, &[]));
        for _ in 0..r.below(40) {
            let kind = r.below(11) as u8;
            let flags = r.next() as u8;
            let id = r.below(12) as u32;
            let p: Vec<u8> = if r.below(3) == 0 {
                get("/x")
            } else {
                (0..r.below(24)).map(|_| r.next() as u8).collect()
            };
            b.extend(frame(kind, flags, id, &p));
        }
        chaos(&b, &mut r);
    }
}
