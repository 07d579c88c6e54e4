//! The attacks of proxy/tests/http2_attacks.rs against the codec alone, each refused as that suite expects and at a bounded cost: a bad preface, streams over the limit, rapid reset, CONTINUATION and empty-frame floods, a header list over the limit, an HPACK bomb, SETTINGS and PING floods, a client that reads none of its answers, stream id reuse, DATA on a closed stream, malformed requests.

mod support;
use support::*;

fn limits() -> Config {
    Config {
        max_concurrent_streams: 4,
        max_header_list: 8192,
        ..Config::default()
    }
}

#[test]
fn a_bad_preface_gets_goaway_protocol_error_with_last_stream_0() {
    let mut c = Client::bare(Config::default());
    c.out();
    c.send(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n");
    assert_eq!(c.goaway(), (0, 0x1));
    assert_eq!(c.err.unwrap().reason, Reason::BadPreface);
    // Checked as it comes, a byte at a time too.
    let mut c = Client::bare(Config::default());
    for &b in b"PRI * HTTP/1.1" {
        c.send(&[b]);
    }
    assert_eq!(c.err.unwrap().reason, Reason::BadPreface);
    // The magic, then a frame other than SETTINGS.
    let mut c = Client::bare(Config::default());
    c.send(PREFACE);
    c.send(&frame(PING, 0, 0, b"12345678"));
    assert_eq!(c.goaway(), (0, 0x1));
    assert_eq!(c.err.unwrap().reason, Reason::BadPreface);
}

#[test]
fn a_stream_over_max_concurrent_streams_is_refused_and_the_others_go_on() {
    let mut c = Client::open(limits());
    for id in [1, 3, 5, 7] {
        c.send(&headers(id, &post(Some("2")), false));
    }
    c.send(&headers(9, &get("/"), true));
    assert_eq!(c.rst(9), 0x7);
    assert_eq!(c.s.stats().refused_streams, 1);
    c.send(&frame(DATA, END_STREAM, 1, b"hi"));
    let ev = c.take_events();
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(e, Ev::Request { .. }))
            .count(),
        4
    );
    assert!(ev.contains(&Ev::Data {
        id: 1,
        data: b"hi".to_vec(),
        end: true
    }));
    assert_eq!(c.s.open_streams(), 4);
}

#[test]
fn rapid_reset_gets_goaway_enhance_your_calm() {
    let mut c = Client::open(limits());
    let mut id = 1;
    for _ in 0..300 {
        c.send(&headers(id, &get("/hang"), true));
        c.send(&frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
        id += 2;
        if c.err.is_some() {
            break;
        }
    }
    assert_eq!(c.err.unwrap().reason, Reason::RapidReset);
    assert_eq!(c.goaway().1, 0xb);
    assert_eq!(id, 1 + 2 * 201, "the 201st reset in a tick");
    // A tick later the count starts again.
    let mut c = Client::open(limits());
    for round in 0..3 {
        for _ in 0..150 {
            c.send(&headers(id, &get("/hang"), true));
            c.send(&frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
            id += 2;
        }
        c.s.tick();
        assert!(c.err.is_none(), "round {round}");
    }
    assert_eq!(c.s.stats().client_resets, 450);
}

#[test]
fn a_continuation_flood_ends_the_connection_before_it_is_buffered() {
    let mut c = Client::open(limits());
    let mut first = get("/");
    lit(&mut first, b"x-a", b"1");
    c.send(&frame(HEADERS, END_STREAM, 1, &first));
    let mut junk = Vec::new();
    while junk.len() < 16_000 {
        lit(&mut junk, b"x-flood", &[b'f'; 200]);
    }
    let mut sent = 0;
    for _ in 0..4000 {
        c.send(&frame(CONTINUATION, 0, 1, &junk));
        sent += 1;
        if c.err.is_some() {
            break;
        }
    }
    assert_eq!(sent, 1, "refused at the first frame past the limit");
    assert_eq!(c.goaway(), (0, 0xb));
    assert_eq!(c.err.unwrap().reason, Reason::HeaderFlood);
    // Small CONTINUATION frames: bounded by their count.
    let mut c = Client::open(Config::default());
    c.send(&frame(HEADERS, END_STREAM, 1, &first));
    for _ in 0..100 {
        c.send(&frame(CONTINUATION, 0, 1, &[0x82]));
    }
    assert_eq!(c.err.unwrap().reason, Reason::HeaderFlood);
    assert!(c.s.heap_bytes() < 1024, "{}", c.s.heap_bytes());
    // Empty ones: the empty-frame bound.
    let mut c = Client::open(Config {
        max_continuations: 1000,
        ..Config::default()
    });
    c.send(&frame(HEADERS, END_STREAM, 1, &first));
    for _ in 0..200 {
        c.send(&frame(CONTINUATION, 0, 1, &[]));
    }
    assert_eq!(c.err.unwrap().reason, Reason::EmptyFrames);
}

#[test]
fn empty_data_frames_are_bounded() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &post(None), false));
    for _ in 0..100 {
        c.send(&frame(DATA, 0, 1, &[]));
    }
    assert!(c.err.is_none());
    c.send(&frame(DATA, 0, 1, &[]));
    assert_eq!(c.err.unwrap().reason, Reason::EmptyFrames);
    assert_eq!(c.goaway(), (1, 0xb));
}

#[test]
fn a_header_list_over_the_limit_gets_431_and_the_connection_goes_on() {
    let mut c = Client::open(limits());
    let mut big = get("/");
    lit(&mut big, b"x-big", &[b'b'; 10_000]);
    c.send(&headers(1, &big, true));
    let out = c.out();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].kind, out[0].id, out[0].flags),
        (HEADERS, 1, END_HEADERS | END_STREAM)
    );
    assert_eq!(c.s.stats().headers_too_large, 1);
    // Not ended by the client: reset after the 431, its DATA ignored.
    c.send(&headers(3, &big, false));
    let out = c.out();
    assert_eq!(out[1].kind, RST_STREAM);
    assert_eq!(out[1].code(), 0);
    c.send(&frame(DATA, END_STREAM, 3, b"late"));
    assert!(c.out().iter().all(|f| f.kind != RST_STREAM));
    c.send(&headers(5, &get("/after"), true));
    let ev = c.take_events();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(matches!(&ev[0], Ev::Request { id: 5, .. }));
}

#[test]
fn an_hpack_bomb_does_not_decode_into_a_request() {
    let mut c = Client::open(limits());
    let mut first = get("/seed");
    lit_indexed(&mut first, b"x-bomb", &[b'x'; 4000]);
    c.send(&headers(1, &first, true));
    let mut bomb = get("/bomb");
    bomb.extend(std::iter::repeat_n(0x80 | 62, 2000));
    c.send(&headers(3, &bomb, true));
    let ev = c.take_events();
    assert_eq!(ev.len(), 1, "only the seed: {ev:?}");
    assert!(c.err.is_none());
    assert_eq!(c.s.stats().headers_too_large, 1);
    // The table is still in step: index 62 is still the seed's field.
    let mut again = get("/again");
    again.push(0x80 | 62);
    c.send(&headers(5, &again, true));
    let ev = c.take_events();
    let Ev::Request { fields, .. } = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(fields[0].0, b"x-bomb");
}

#[test]
fn settings_and_ping_floods_get_goaway_enhance_your_calm() {
    for (kind, payload, reason) in [
        (SETTINGS, &[0u8, 3, 0, 0, 0, 100][..], Reason::SettingsFlood),
        (PING, &[1u8, 2, 3, 4, 5, 6, 7, 8][..], Reason::PingFlood),
    ] {
        let mut c = Client::open(Config::default());
        let mut batch = Vec::new();
        for _ in 0..1000 {
            batch.extend(frame(kind, 0, 0, payload));
        }
        c.send(&batch);
        assert_eq!(c.err.unwrap().reason, reason);
        assert_eq!(c.goaway().1, 0xb);
        // Read as they come, a tick each 100: no flood.
        let mut c = Client::open(Config::default());
        for k in 0..1000 {
            if k % 100 == 0 {
                c.s.tick();
            }
            c.send(&frame(kind, 0, 0, payload));
            c.out();
        }
        assert!(c.err.is_none());
    }
}

#[test]
fn a_client_that_reads_none_of_its_answers_is_cut_off() {
    // Within the per-tick counts, but nothing written out: the backlog bound.
    let mut c = Client::open(Config {
        max_pings_per_tick: u32::MAX,
        ..Config::default()
    });
    let mut n = 0;
    while c.err.is_none() {
        c.send(&frame(PING, 0, 0, b"12345678"));
        n += 1;
    }
    assert_eq!(c.err.unwrap().reason, Reason::ControlBacklog);
    assert_eq!(n, 16_384 / 17 + 1);
    assert!(c.s.pending().len() < 17_000);
}

#[test]
fn a_reused_or_lower_stream_id_is_a_connection_error() {
    let mut c = Client::open(limits());
    c.send(&headers(1, &get("/"), true));
    c.s.send_response(1, 200, std::iter::empty(), true).unwrap();
    c.out();
    c.send(&headers(1, &get("/again"), true));
    let (last, code) = c.goaway();
    assert_eq!(last, 1);
    assert!([0x1, 0x5].contains(&code), "{code}");
    let mut c = Client::open(limits());
    c.send(&headers(5, &get("/"), true));
    c.send(&headers(3, &get("/lower"), true));
    assert_eq!(c.goaway(), (5, 0x1));
}

#[test]
fn data_on_a_closed_stream_is_refused() {
    let mut c = Client::open(limits());
    c.send(&headers(1, &get("/"), true));
    c.s.send_response(1, 200, std::iter::empty(), true).unwrap();
    c.out();
    c.send(&frame(DATA, 0, 1, b"late"));
    assert_eq!(c.rst(1), 0x5);
}

#[test]
fn malformed_requests_reset_their_stream_alone_and_are_never_handed_over() {
    let mut c = Client::open(limits());
    let mut missing = Vec::new();
    lit(&mut missing, b":method", b"GET");
    lit(&mut missing, b":scheme", b"http");
    let mut twice = get("/");
    lit(&mut twice, b":method", b"POST");
    let mut conn = get("/");
    lit(&mut conn, b"connection", b"keep-alive");
    let mut proto = get("/");
    lit(&mut proto, b":protocol", b"x");
    let mut upper = get("/");
    lit_indexed(&mut upper, b"X-Upper", b"1");
    let mut id = 1;
    for (i, b) in [missing, twice, conn, proto, upper].iter().enumerate() {
        c.send(&headers(id, b, true));
        assert_eq!(c.rst(id), 0x1, "case {i}");
        id += 2;
    }
    assert!(c.take_events().is_empty());
    assert_eq!(c.s.stats().stream_errors, 5);
    // The HPACK state stayed in step (X-Upper went into the table).
    let mut after = get("/fine");
    after.push(0x80 | 62);
    c.send(&headers(id, &after, true));
    assert_eq!(c.rst(id), 0x1, "the indexed X-Upper is still malformed");
    c.send(&headers(id + 2, &get("/fine"), true));
    assert!(matches!(c.take_events()[..], [Ev::Request { .. }]));
}

#[test]
fn an_undecodable_header_block_gets_goaway_compression_error_last_stream_0() {
    for block in [
        &[0x82, 0x7f, 0xff, 0xff, 0xff, 0xff, 0x0f][..],
        &[0x82, 0x80],
        &[0x82, 0x80 | 70],
        &[0x82, 0x41, 0x05, b'a'],
    ] {
        let mut c = Client::open(Config::default());
        c.send(&headers(1, block, true));
        assert_eq!(c.goaway(), (0, 0x9), "{block:x?}");
        assert_eq!(c.err.unwrap().reason, Reason::Hpack);
    }
}

#[test]
fn too_many_stream_errors_in_a_tick_end_the_connection() {
    let mut c = Client::open(Config::default());
    let mut bad = get("/");
    lit(&mut bad, b"te", b"gzip");
    let mut id = 1;
    while c.err.is_none() {
        c.send(&headers(id, &bad, true));
        id += 2;
        c.out();
    }
    assert_eq!(c.err.unwrap().reason, Reason::StreamErrors);
    assert_eq!(id, 1 + 2 * 101);
}
