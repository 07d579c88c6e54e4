//! The known HTTP/2 attacks against zgix, each with hand-written frames on a prior-knowledge listener, each refused as RFC 9113 says at a bounded cost and counted in `zgix_h2_refused_total`: invalid preface, too many concurrent streams, rapid reset (CVE-2023-44487), CONTINUATION flood (CVE-2024-27316), a header list over `max_header_list_bytes`, an HPACK bomb, SETTINGS and PING floods, stream-ID reuse and regression, DATA on a closed stream, pseudo-header errors, forbidden field names (a stream error each), an undecodable header block, a zero-window stall, and a preface dribbled a byte at a time.

mod http2_support;
mod support;

use http2_support::*;
use support::{metrics_text, series, Origin, Zgix};

const LIMITS: &str = r#", "max_concurrent_streams": 4, "max_header_list_bytes": 8192"#;

fn start(o: &Origin) -> Zgix {
    Zgix::start_json(&h2c_config(o.addr(), LIMITS, ""))
}

/// A GET on a new connection works: zgix is still serving.
#[track_caller]
fn still_serves(z: &Zgix) {
    let mut c = Raw::open(z.addr());
    c.headers(1, &get_block("/alive"), true);
    assert_eq!(c.answer(1), Some(Ok(200)));
}

#[test]
fn an_invalid_preface_gets_goaway_protocol_error() {
    let o = Origin::start();
    let z = start(&o);
    let mut c = Raw::bare(z.addr());
    c.write(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n");
    let g = c.goaway().expect("a GOAWAY");
    assert_eq!((g.code(), g.last_stream()), (PROTOCOL_ERROR, 0));
    assert!(c.closed());
    assert_eq!(wait_series(&z, &refused("bad_preface"), 1.0), 1.0);
    still_serves(&z);
}

#[test]
fn a_stream_over_max_concurrent_streams_is_refused_and_the_others_go_on() {
    let o = Origin::start();
    let z = start(&o);
    let mut c = Raw::open(z.addr());
    // The server's SETTINGS carry the limit; open four streams that wait
    // for their bodies, then a fifth.
    c.until(|f| f.kind == SETTINGS && f.flags & 1 == 0).unwrap();
    c.frame(SETTINGS, 1, 0, &[]);
    let mut post = Vec::new();
    lit(&mut post, b":method", b"POST");
    lit(&mut post, b":scheme", b"http");
    lit(&mut post, b":path", b"/echo");
    lit(&mut post, b":authority", b"site.example");
    lit(&mut post, b"content-length", b"2");
    for id in [1, 3, 5, 7] {
        c.headers(id, &post, false);
    }
    c.headers(9, &get_block("/"), true);
    assert_eq!(c.answer(9), Some(Err(REFUSED_STREAM)));
    c.frame(DATA, END_STREAM, 1, b"hi");
    assert_eq!(c.answer(1), Some(Ok(200)));
    assert_eq!(wait_series(&z, &refused("refused_stream"), 1.0), 1.0);
}

#[test]
fn rapid_reset_gets_goaway_enhance_your_calm() {
    let o = Origin::start();
    let z = start(&o);
    let mut c = Raw::open(z.addr());
    let block = get_block("/hang");
    let mut batch = Vec::new();
    let mut id = 1;
    // Streams opened and reset at once, in batches, until zgix stops
    // reading (the reader thread keeps what it says meanwhile).
    for _ in 0..50 {
        batch.clear();
        for _ in 0..100 {
            batch.extend(Raw::frame_bytes(
                HEADERS,
                END_HEADERS | END_STREAM,
                id,
                &block,
            ));
            batch.extend(Raw::frame_bytes(RST_STREAM, 0, id, &CANCEL.to_be_bytes()));
            id += 2;
        }
        if !c.write(&batch) {
            break;
        }
    }
    let g = c.goaway().expect("a GOAWAY");
    assert_eq!(g.code(), ENHANCE_YOUR_CALM);
    assert!(c.closed());
    let m = support::metrics_text(&z);
    let n = support::series(&m, &refused("rapid_reset")) + support::series(&m, &refused("calm"));
    assert_eq!(n, 1.0, "{m}");
    // A stream opened and reset in the same read runs no request loop (not
    // counted in zgix_h2_streams_total): only a pair split by a read's
    // boundary may be taken, at most one a batch (before, every stream zgix
    // decoded ran one, about 200).
    let taken = support::series(&m, "zgix_h2_streams_total{listener=\"h2c\"}");
    assert!(taken <= 50.0, "{taken} streams taken\n{m}");
    // Each stream zgix took may have cost an upstream request; the limit
    // bounds how many.
    assert!(
        o.accepted() <= 1000,
        "{} upstream connections",
        o.accepted()
    );
    still_serves(&z);
}

#[test]
fn a_continuation_flood_ends_the_connection_before_it_is_buffered() {
    let o = Origin::start();
    let z = start(&o);
    let mut c = Raw::open(z.addr());
    let mut first = get_block("/");
    lit(&mut first, b"x-a", b"1");
    c.frame(HEADERS, END_STREAM, 1, &first);
    let mut junk = Vec::new();
    while junk.len() < 16_000 {
        lit(&mut junk, b"x-flood", &[b'f'; 200]);
    }
    // Endless CONTINUATION frames, never END_HEADERS: 64 MB if nothing stops it.
    for _ in 0..4000 {
        if !c.frame(CONTINUATION, 0, 1, &junk) {
            break;
        }
        if c.sent > 1 << 20 {
            break;
        }
    }
    let g = c.goaway().expect("a GOAWAY");
    assert!(
        [ENHANCE_YOUR_CALM, COMPRESSION_ERROR].contains(&g.code()),
        "GOAWAY code {}",
        g.code()
    );
    assert!(c.closed());
    assert!(c.sent <= (1 << 20) + 20_000, "{} bytes taken", c.sent);
    let m = support::metrics_text(&z);
    let n = support::series(&m, &refused("calm")) + support::series(&m, &refused("hpack"));
    assert_eq!(n, 1.0, "{m}");
    still_serves(&z);
}

#[test]
fn a_header_list_over_the_limit_is_refused_and_the_connection_goes_on() {
    let o = Origin::start();
    let z = start(&o);
    let mut c = Raw::open(z.addr());
    let mut big = get_block("/");
    lit(&mut big, b"x-big", &[b'b'; 10_000]);
    c.headers(1, &big, true);
    let a = c.answer(1).expect("an answer");
    assert!(a != Ok(200), "{a:?}");
    c.headers(3, &get_block("/after"), true);
    assert_eq!(c.answer(3), Some(Ok(200)));
    assert_eq!(
        o.requests().len(),
        1,
        "the big one never reached the origin"
    );
    assert_eq!(a, Ok(431));
    assert_eq!(wait_series(&z, &refused("header_list"), 1.0), 1.0);
}

#[test]
fn an_hpack_bomb_does_not_decode_into_a_request() {
    let o = Origin::start();
    let z = start(&o);
    let mut c = Raw::open(z.addr());
    // 4 kB into the dynamic table (index 62), then 2,000 one-byte
    // references to it: 2 kB on the wire, 8 MB decoded.
    let mut first = get_block("/seed");
    lit_indexed(&mut first, b"x-bomb", &[b'x'; 4000]);
    c.headers(1, &first, true);
    assert_eq!(c.answer(1), Some(Ok(200)));
    let mut bomb = get_block("/bomb");
    bomb.extend(std::iter::repeat_n(0x80 | 62, 2000));
    c.headers(3, &bomb, true);
    let refusal =
        c.until(|f| f.kind == GOAWAY || (f.id == 3 && (f.kind == HEADERS || f.kind == RST_STREAM)));
    let f = refusal.expect("an answer or GOAWAY");
    if f.kind == HEADERS {
        assert_ne!(status_of(&f.payload), 200);
    }
    let seen: Vec<_> = o.requests().iter().map(|r| r.head.len()).collect();
    assert_eq!(seen.len(), 1, "only the seed reached the origin: {seen:?}");
    // Counted: a 431 as `header_list`, a connection error as `hpack`.
    let why = if f.kind == GOAWAY {
        "hpack"
    } else {
        "header_list"
    };
    assert_eq!(wait_series(&z, &refused(why), 1.0), 1.0, "{f:?}");
    still_serves(&z);
}

#[test]
fn settings_and_ping_floods_get_goaway_enhance_your_calm() {
    let o = Origin::start();
    let z = start(&o);
    for (kind, payload, reason) in [
        (SETTINGS, &[0u8, 3, 0, 0, 0, 100][..], "settings_flood"),
        (PING, &[1u8, 2, 3, 4, 5, 6, 7, 8][..], "ping_flood"),
    ] {
        let mut c = Raw::open(z.addr());
        let mut batch = Vec::new();
        for _ in 0..1000 {
            batch.extend(Raw::frame_bytes(kind, 0, 0, payload));
        }
        c.write(&batch);
        let g = c.goaway().expect("a GOAWAY");
        assert_eq!(g.code(), ENHANCE_YOUR_CALM, "{reason}");
        assert!(c.closed(), "{reason}");
        assert_eq!(wait_series(&z, &refused(reason), 1.0), 1.0);
    }
    still_serves(&z);
}

#[test]
fn a_reused_or_lower_stream_id_is_a_connection_error() {
    let o = Origin::start();
    let z = start(&o);
    // Stream 1 again after it closed.
    let mut c = Raw::open(z.addr());
    c.headers(1, &get_block("/"), true);
    c.answer_end(1).expect("stream 1 answered");
    c.headers(1, &get_block("/again"), true);
    let g = c.goaway().expect("a GOAWAY");
    assert!(
        [PROTOCOL_ERROR, STREAM_CLOSED].contains(&g.code()),
        "{}",
        g.code()
    );
    assert_eq!(g.last_stream(), 1);
    // A lower id than one already used.
    let mut c = Raw::open(z.addr());
    c.headers(5, &get_block("/"), true);
    c.answer_end(5).expect("stream 5 answered");
    c.headers(3, &get_block("/lower"), true);
    let g = c.goaway().expect("a GOAWAY");
    assert!(
        [PROTOCOL_ERROR, STREAM_CLOSED].contains(&g.code()),
        "{}",
        g.code()
    );
    assert_eq!(wait_series(&z, &refused("protocol"), 2.0), 2.0);
    assert_eq!(o.requests().len(), 2);
}

#[test]
fn data_on_a_closed_stream_is_refused() {
    let o = Origin::start();
    let z = start(&o);
    let mut c = Raw::open(z.addr());
    c.headers(1, &get_block("/"), true);
    c.answer_end(1).expect("stream 1 answered");
    c.frame(DATA, 0, 1, b"late");
    let f = c
        .until(|f| f.kind == GOAWAY || (f.kind == RST_STREAM && f.id == 1))
        .expect("a refusal");
    assert_eq!(f.code(), STREAM_CLOSED, "{f:?}");
}

#[test]
fn pseudo_header_errors_reset_their_stream_and_the_connection_goes_on() {
    let o = Origin::start();
    let z = start(&o);
    let mut c = Raw::open(z.addr());
    let mut missing = Vec::new();
    lit(&mut missing, b":method", b"GET");
    lit(&mut missing, b":scheme", b"http");
    lit(&mut missing, b":authority", b"site.example");
    let mut twice = get_block("/");
    lit(&mut twice, b":method", b"POST");
    let mut after = Vec::new();
    lit(&mut after, b":method", b"GET");
    lit(&mut after, b"x-regular", b"1");
    lit(&mut after, b":path", b"/");
    lit(&mut after, b":scheme", b"http");
    let mut conn_specific = get_block("/");
    lit(&mut conn_specific, b"connection", b"keep-alive");
    let mut unknown = get_block("/");
    lit(&mut unknown, b":protocol", b"x");
    let cases = [missing, twice, after, conn_specific, unknown];
    let mut id = 1;
    for (i, block) in cases.iter().enumerate() {
        c.headers(id, block, true);
        assert_eq!(c.answer(id), Some(Err(PROTOCOL_ERROR)), "case {i}");
        id += 2;
    }
    c.headers(id, &get_block("/fine"), true);
    assert_eq!(c.answer(id), Some(Ok(200)));
    assert_eq!(wait_series(&z, &refused("stream_error"), 5.0), 5.0);
    assert_eq!(
        o.requests().len(),
        1,
        "only the well-formed one was forwarded"
    );
}

/// `X-Upper` in HPACK's Huffman code (RFC 7541 Appendix B).
const X_UPPER_HUFFMAN: [u8; 6] = [0xfc, 0x5b, 0x85, 0x75, 0x96, 0xcf];

#[test]
fn a_forbidden_field_name_resets_its_stream_alone() {
    // RFC 9113 §8.2.1, §8.3, §8.1.1: an uppercase name, one that is no
    // token, an unknown pseudo-header and a pseudo-header in trailers make
    // the request malformed, a stream error; the codec alone would end the
    // connection for the first three.
    let o = Origin::start();
    let z = start(&o);
    let mut c = Raw::open(z.addr());
    let mut raw = get_block("/");
    lit_indexed(&mut raw, b"X-Upper", b"1");
    let mut huffman = get_block("/");
    huffman.extend_from_slice(&[0x40, 0x80 | X_UPPER_HUFFMAN.len() as u8]);
    huffman.extend_from_slice(&X_UPPER_HUFFMAN);
    huffman.extend_from_slice(&[1, b'1']);
    let mut space = get_block("/");
    lit(&mut space, b"x y", b"1");
    let mut pseudo = get_block("/");
    lit(&mut pseudo, b":foo", b"1");
    let mut id = 1;
    for (i, block) in [raw, huffman, space, pseudo].iter().enumerate() {
        c.headers(id, block, true);
        assert_eq!(c.answer(id), Some(Err(PROTOCOL_ERROR)), "case {i}");
        id += 2;
    }
    // Trailers with a pseudo-header, after a body.
    let mut post = Vec::new();
    lit(&mut post, b":method", b"POST");
    lit(&mut post, b":scheme", b"http");
    lit(&mut post, b":path", b"/echo");
    lit(&mut post, b":authority", b"site.example");
    c.headers(id, &post, false);
    c.frame(DATA, 0, id, b"abc");
    let mut trailers = Vec::new();
    lit(&mut trailers, b":path", b"/");
    c.headers(id, &trailers, true);
    let f = c
        .until(|f| f.kind == GOAWAY || (f.kind == RST_STREAM && f.id == id))
        .expect("a reset");
    assert_eq!((f.kind, f.code()), (RST_STREAM, PROTOCOL_ERROR), "{f:?}");
    // The connection goes on (its HPACK state with it).
    c.headers(id + 2, &get_block("/fine"), true);
    assert_eq!(c.answer(id + 2), Some(Ok(200)));
    assert_eq!(wait_series(&z, &refused("stream_error"), 5.0), 5.0);
    assert_eq!(series(&metrics_text(&z), &refused("protocol")), 0.0);
    let heads: Vec<_> = o.requests().into_iter().map(|r| r.head).collect();
    assert!(heads.iter().any(|h| h.starts_with(b"GET /fine ")));
    assert!(
        !heads.iter().any(|h| h.starts_with(b"GET / ")),
        "no malformed request was forwarded"
    );
}

#[test]
fn an_undecodable_header_block_gets_goaway_compression_error() {
    let o = Origin::start();
    let z = start(&o);
    // RFC 7541 §2.3.3, §5.1, §6.1: an integer past the codec's 4
    // continuation bytes, an index 0, an index past both tables, a block
    // cut inside a representation.
    for block in [
        &[0x82, 0x7f, 0xff, 0xff, 0xff, 0xff, 0x0f][..],
        &[0x82, 0x80],
        &[0x82, 0x80 | 70],
        &[0x82, 0x41, 0x05, b'a'],
    ] {
        let mut c = Raw::open(z.addr());
        c.headers(1, block, true);
        let g = c.goaway().expect("a GOAWAY");
        assert_eq!(
            (g.code(), g.last_stream()),
            (COMPRESSION_ERROR, 0),
            "{block:x?}"
        );
    }
    assert_eq!(wait_series(&z, &refused("hpack"), 4.0), 4.0);
    assert!(o.requests().is_empty());
    still_serves(&z);
}

#[test]
fn a_zero_window_stall_holds_the_stream_only_for_the_idle_timeout() {
    let o = Origin::start();
    let z = Zgix::start_json(&h2c_config(
        o.addr(),
        LIMITS,
        r#", "limits": {"client_idle_timeout_ms": 300}"#,
    ));
    let mut c = Raw::bare(z.addr());
    c.write(PREFACE);
    // SETTINGS_INITIAL_WINDOW_SIZE = 0: no DATA may come.
    c.frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 0]);
    c.headers(1, &get_block("/cl/1000000"), true);
    assert_eq!(c.answer(1), Some(Ok(200)));
    let t = std::time::Instant::now();
    let end = c.answer_end(1).expect("the stream ends");
    assert_eq!((end.kind, end.code()), (RST_STREAM, 2), "INTERNAL_ERROR");
    assert!(t.elapsed() < WAIT, "ended by the idle timeout");
}

#[test]
fn a_preface_dribbled_a_byte_at_a_time_is_cut_at_the_header_timeout() {
    use std::io::{Read, Write};
    let o = Origin::start();
    let z = Zgix::start_json(&h2c_config(
        o.addr(),
        LIMITS,
        r#", "limits": {"client_header_timeout_ms": 1000}"#,
    ));
    // The preface and an empty SETTINGS, a byte every 200 ms or so: each
    // byte comes well within the timeout, the whole would take 6.6 s.
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&Raw::frame_bytes(SETTINGS, 0, 0, &[]));
    let mut s = std::net::TcpStream::connect(z.addr()).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let mut sent = 0;
    let mut buf = [0u8; 256];
    let cut = 'dribble: {
        for b in &hello {
            if s.write_all(&[*b]).is_err() {
                break 'dribble true;
            }
            sent += 1;
            // The pace, and the check: zgix's own SETTINGS may come first;
            // end of stream (or a reset) is the cut.
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break 'dribble true,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break,
                    Err(_) => break 'dribble true,
                }
            }
        }
        false
    };
    assert!(cut, "the dribbled handshake was never cut");
    assert!(sent < hello.len(), "cut only after all {sent} bytes");
    still_serves(&z);
}
