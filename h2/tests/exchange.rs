//! Whole exchanges: requests with bodies and trailers, responses larger than the windows that wait for WINDOW_UPDATE (RFC 9113 §6.9), releases turned into WINDOW_UPDATE, a smaller SETTINGS_INITIAL_WINDOW_SIZE making a window negative (§6.9.2), interleaved streams, heads split into CONTINUATION, graceful shutdown (§6.8), and what an idle connection holds.

mod support;
use support::*;

fn data_frames(out: &[Out], id: u32) -> Vec<&Out> {
    out.iter()
        .filter(|f| f.kind == DATA && f.id == id)
        .collect()
}

#[test]
fn a_response_larger_than_the_window_waits_for_window_update() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &get("/big"), true));
    assert!(matches!(
        c.take_events()[..],
        [Ev::Request {
            id: 1,
            end: true,
            ..
        }]
    ));
    c.s.send_response(
        1,
        200,
        [(&b"content-type"[..], &b"text/plain"[..])].into_iter(),
        false,
    )
    .unwrap();
    let body = vec![7u8; 100_000];
    let mut at = 0;
    assert_eq!(c.s.send_window(1), 65_535);
    at += c.s.send_data(1, &body[at..], true).unwrap();
    assert_eq!(at, 65_535, "the default windows");
    assert_eq!(c.s.send_data(1, &body[at..], true), Ok(0));
    let out = c.out();
    assert_eq!(out[0].kind, HEADERS);
    let d = data_frames(&out, 1);
    assert_eq!(d.len(), 4, "16 KiB frames");
    assert!(d.iter().all(|f| f.payload.len() <= 16_384 && f.flags == 0));
    // The stream's window opens: still the connection's to wait for.
    c.send(&frame(WINDOW_UPDATE, 0, 1, &50_000u32.to_be_bytes()));
    assert_eq!(c.take_events(), [Ev::WindowOpen(Some(1))]);
    assert_eq!(c.s.send_window(1), 0);
    c.send(&frame(WINDOW_UPDATE, 0, 0, &50_000u32.to_be_bytes()));
    assert_eq!(c.take_events(), [Ev::WindowOpen(None)]);
    at += c.s.send_data(1, &body[at..], true).unwrap();
    assert_eq!(at, 100_000);
    let out = c.out();
    let d = data_frames(&out, 1);
    assert_eq!(d.last().unwrap().flags, END_STREAM);
    assert_eq!(d.iter().map(|f| f.payload.len()).sum::<usize>(), 34_465);
    assert_eq!(c.s.open_streams(), 0, "both sides ended");
    assert_eq!(
        c.s.send_data(1, b"x", true),
        Err(zgix_h2::server::StreamGone)
    );
}

#[test]
fn a_window_of_one_sends_data_of_one() {
    // e2e 6.9.1/4: SETTINGS_INITIAL_WINDOW_SIZE 1.
    let mut c = Client::open(Config::default());
    c.send(&frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 1]));
    c.send(&headers(1, &get("/cl/100"), true));
    c.s.send_response(1, 200, std::iter::empty(), false)
        .unwrap();
    assert_eq!(c.s.send_data(1, &[1; 100], true), Ok(1));
    let out = c.out();
    let d = data_frames(&out, 1);
    assert_eq!((d.len(), d[0].payload.len()), (1, 1));
}

#[test]
fn a_smaller_initial_window_makes_send_windows_negative_until_updates() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &get("/"), true));
    c.s.send_response(1, 200, std::iter::empty(), false)
        .unwrap();
    assert_eq!(c.s.send_data(1, &[0; 1000], false), Ok(1000));
    // 65,535 → 100: the window is 100 - 1000.
    c.send(&frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 100]));
    assert_eq!(c.s.send_window(1), 0);
    c.send(&frame(WINDOW_UPDATE, 0, 1, &1000u32.to_be_bytes()));
    assert_eq!(c.s.send_window(1), 100);
    // Larger again: every stream's window grows, and the caller is told.
    c.take_events();
    c.send(&frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 1, 0]));
    assert_eq!(c.s.send_window(1), 256);
    assert_eq!(c.take_events(), [Ev::WindowOpen(None)]);
    // Over 2^31-1 through the change: FLOW_CONTROL_ERROR.
    c.send(&frame(WINDOW_UPDATE, 0, 1, &0x7fff_0000u32.to_be_bytes()));
    c.send(&frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]));
    assert_eq!(c.goaway().1, 0x3);
}

#[test]
fn request_bodies_are_released_into_window_updates() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &post(None), false));
    c.out();
    let chunk = vec![1u8; 16_384];
    for _ in 0..3 {
        c.send(&frame(DATA, 0, 1, &chunk));
    }
    let got: usize = c
        .take_events()
        .iter()
        .map(|e| match e {
            Ev::Data { data, .. } => data.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(got, 3 * 16_384);
    assert!(c.out().is_empty(), "nothing released yet");
    c.s.release(1, 16_384);
    assert!(c.out().is_empty(), "under half a window");
    c.s.release(1, 32_768);
    let out = c.out();
    let w: Vec<_> = out
        .iter()
        .filter(|f| f.kind == WINDOW_UPDATE)
        .map(|f| (f.id, be32(&f.payload, 0)))
        .collect();
    assert_eq!(w, [(1, 49_152), (0, 49_152)]);
    // The windows are full again: 65,535 more may come, and no more.
    c.send(&frame(DATA, 0, 1, &chunk));
    c.send(&frame(DATA, 0, 1, &chunk));
    c.send(&frame(DATA, 0, 1, &chunk));
    c.send(&frame(DATA, 0, 1, &chunk[..16_383]));
    assert!(c.err.is_none());
    c.send(&frame(DATA, 0, 1, &[1]));
    assert_eq!(
        c.goaway().1,
        0x3,
        "the connection window is the first to run out"
    );
}

#[test]
fn a_stream_window_overrun_is_a_stream_error_when_the_connection_window_is_larger() {
    let mut c = Client::open(Config {
        initial_window: 1000,
        connection_window: 1 << 20,
        ..Config::default()
    });
    c.send(&headers(1, &post(None), false));
    c.send(&frame(DATA, 0, 1, &[0; 1000]));
    c.send(&frame(DATA, 0, 1, &[0; 1]));
    assert_eq!(c.rst(1), 0x3);
    assert_eq!(
        c.take_events().last(),
        Some(&Ev::StreamError { id: 1, code: 0x3 })
    );
}

#[test]
fn interleaved_streams_keep_their_bodies_and_trailers_apart() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &post(Some("6")), false));
    c.send(&headers(3, &post(None), false));
    c.send(&frame(DATA, 0, 3, b"three"));
    c.send(&frame(DATA, PADDED, 1, &[4, b'o', b'n', b'e', 0, 0, 0, 0]));
    let mut t = Vec::new();
    lit(&mut t, b"x-sum", b"abc");
    c.send(&frame(HEADERS, END_HEADERS | END_STREAM, 3, &t));
    c.send(&frame(DATA, END_STREAM, 1, b"one"));
    let ev = c.take_events();
    assert_eq!(ev.len(), 6, "{ev:?}");
    assert_eq!(
        ev[2],
        Ev::Data {
            id: 3,
            data: b"three".to_vec(),
            end: false
        }
    );
    assert_eq!(
        ev[3],
        Ev::Data {
            id: 1,
            data: b"one".to_vec(),
            end: false
        }
    );
    assert_eq!(
        ev[4],
        Ev::Trailers {
            id: 3,
            fields: vec![(b"x-sum".to_vec(), b"abc".to_vec())]
        }
    );
    assert_eq!(
        ev[5],
        Ev::Data {
            id: 1,
            data: b"one".to_vec(),
            end: true
        }
    );
    // Answers interleaved too, then trailers.
    c.s.send_response(3, 200, std::iter::empty(), false)
        .unwrap();
    c.s.send_response(1, 204, std::iter::empty(), true).unwrap();
    c.s.send_data(3, b"ok", false).unwrap();
    c.s.send_trailers(3, [(&b"x-done"[..], &b"1"[..])].into_iter())
        .unwrap();
    let out = c.out();
    let kinds: Vec<_> = out.iter().map(|f| (f.kind, f.id, f.flags)).collect();
    assert_eq!(
        kinds,
        [
            (HEADERS, 3, END_HEADERS),
            (HEADERS, 1, END_HEADERS | END_STREAM),
            (DATA, 3, 0),
            (HEADERS, 3, END_HEADERS | END_STREAM),
        ]
    );
    assert_eq!(c.s.open_streams(), 0);
    assert_eq!(
        c.s.send_trailers(3, std::iter::empty()),
        Err(zgix_h2::server::StreamGone)
    );
}

#[test]
fn interim_responses_come_before_the_final_one() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &post(None), false));
    c.s.send_response(1, 100, std::iter::empty(), true).unwrap();
    c.s.send_response(1, 200, std::iter::empty(), false)
        .unwrap();
    assert!(c
        .s
        .send_response(1, 200, std::iter::empty(), false)
        .is_err());
    let out = c.out();
    assert_eq!((out[0].flags, out[1].flags), (END_HEADERS, END_HEADERS));
}

#[test]
fn a_head_over_the_frame_size_goes_in_continuation_frames() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &get("/"), true));
    let v = vec![b'v'; 40_000];
    c.s.send_response(1, 200, [(&b"x-big"[..], &v[..])].into_iter(), true)
        .unwrap();
    let out = c.out();
    let k: Vec<_> = out
        .iter()
        .map(|f| (f.kind, f.flags, f.payload.len() <= 16_384))
        .collect();
    assert_eq!(
        k,
        [
            (HEADERS, END_STREAM, true),
            (CONTINUATION, 0, true),
            (CONTINUATION, END_HEADERS, true),
        ]
    );
    let block: Vec<u8> = out.iter().flat_map(|f| f.payload.clone()).collect();
    let mut d = zgix_h2::hpack::Decoder::new(4096);
    let mut got = Vec::new();
    d.decode(&block, 1 << 20, |n, v| {
        got.push((n.to_vec(), v.len()));
        Ok(())
    })
    .unwrap();
    assert_eq!(got, [(b":status".to_vec(), 3), (b"x-big".to_vec(), 40_000)]);
}

#[test]
fn a_graceful_shutdown_lets_the_streams_in_flight_finish() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &post(Some("4")), false));
    c.s.graceful_shutdown();
    let out = c.out();
    assert_eq!(
        (out[0].kind, out[0].last(), out[0].code()),
        (GOAWAY, 0x7fff_ffff, 0)
    );
    assert_eq!(out[1].kind, PING);
    // A stream the client started meanwhile is taken; then the final GOAWAY.
    c.send(&headers(3, &get("/"), true));
    c.send(&frame(PING, ACK, 0, &out[1].payload));
    let out = c.out();
    assert_eq!((out[0].kind, out[0].last(), out[0].code()), (GOAWAY, 3, 0));
    c.send(&headers(5, &get("/late"), true));
    assert_eq!(c.take_events().len(), 2, "stream 5 is ignored");
    assert!(!c.s.is_done());
    c.send(&frame(DATA, END_STREAM, 1, b"ping"));
    c.s.send_response(1, 200, std::iter::empty(), true).unwrap();
    c.s.send_response(3, 200, std::iter::empty(), true).unwrap();
    assert!(c.s.is_done());
}

#[test]
fn after_the_clients_goaway_the_connection_is_done_once_its_streams_are() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &get("/"), true));
    c.send(&frame(GOAWAY, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0]));
    assert_eq!(
        c.take_events().last(),
        Some(&Ev::GoAway { last: 0, code: 0 })
    );
    assert!(!c.s.is_done());
    c.s.send_response(1, 200, std::iter::empty(), true).unwrap();
    assert!(c.s.is_done());
}

#[test]
fn an_idle_connection_holds_no_heap_in_the_codec() {
    let mut c = Client::open(Config::default());
    c.out();
    assert_eq!(c.s.heap_bytes(), 0, "after the preface exchange");
    for id in (1..200).step_by(2) {
        c.send(&headers(id, &get("/some/path?q=1"), true));
        c.s.send_response(
            id,
            200,
            [(&b"content-type"[..], &b"text/html"[..])].into_iter(),
            false,
        )
        .unwrap();
        c.s.send_data(id, b"hello", true).unwrap();
        c.out();
    }
    // The dynamic table (none here: literals without indexing) is all it may keep.
    assert_eq!(c.s.heap_bytes(), 0);
    // With a stream open, the buffers are kept for it.
    c.send(&headers(201, &get("/"), false));
    assert!(c.s.heap_bytes() > 0);
    println!("one open stream: {} bytes", c.s.heap_bytes());
    assert!(
        std::mem::size_of::<Server>() <= 528,
        "{}",
        std::mem::size_of::<Server>()
    );
}

#[test]
fn the_clients_settings_shape_what_the_server_sends() {
    let mut c = Client::open(Config::default());
    c.send(&frame(
        SETTINGS,
        0,
        0,
        &[0, 5, 0, 0, 0x80, 0, 0, 1, 0, 0, 0, 0],
    ));
    c.send(&headers(1, &get("/"), true));
    c.out();
    c.s.send_response(1, 200, std::iter::empty(), false)
        .unwrap();
    assert_eq!(c.s.send_data(1, &[5; 40_000], true), Ok(40_000));
    let out = c.out();
    // HPACK: the table size the client set (0) is signalled first (RFC 7541 §4.2).
    assert_eq!(out[0].payload[0] & 0xe0, 0x20, "{:x?}", out[0].payload);
    let sizes: Vec<_> = out[1..].iter().map(|f| f.payload.len()).collect();
    assert_eq!(sizes, [32_768, 7_232], "SETTINGS_MAX_FRAME_SIZE 32,768");
}

#[test]
fn a_smaller_receive_window_holds_once_our_settings_are_acknowledged() {
    let cfg = Config {
        initial_window: 100,
        ..Config::default()
    };
    let mut c = Client::bare(cfg);
    c.send(PREFACE);
    c.send(&frame(SETTINGS, 0, 0, &[]));
    // Before the ACK the client may still count on 65,535.
    c.send(&headers(1, &post(None), false));
    c.send(&frame(DATA, 0, 1, &[0; 1000]));
    assert!(c.out().iter().all(|f| f.kind != RST_STREAM));
    c.send(&frame(SETTINGS, ACK, 0, &[]));
    c.send(&headers(3, &post(None), false));
    c.send(&frame(DATA, 0, 3, &[0; 100]));
    assert!(c.out().iter().all(|f| f.kind != RST_STREAM));
    c.send(&frame(DATA, 0, 3, &[0; 1]));
    assert_eq!(c.rst(3), 0x3);
}

#[test]
fn data_on_a_stream_zgix_reset_is_ignored_but_counted_in_the_connection_window() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &post(None), false));
    c.s.reset(1, Code::CANCEL);
    assert_eq!(c.rst(1), 0x8);
    for _ in 0..4 {
        c.send(&frame(DATA, 0, 1, &[0; 16_000]));
    }
    assert!(c.err.is_none());
    let out = c.out();
    assert!(out.iter().all(|f| f.kind != RST_STREAM), "{out:?}");
    let w: u32 = out
        .iter()
        .filter(|f| f.kind == WINDOW_UPDATE && f.id == 0)
        .map(|f| be32(&f.payload, 0))
        .sum();
    assert_eq!(w, 48_000, "given back to the connection");
    assert!(c
        .take_events()
        .iter()
        .all(|e| !matches!(e, Ev::Data { .. })));
}

#[test]
fn connect_carries_authority_alone() {
    let mut c = Client::open(Config::default());
    let mut b = Vec::new();
    lit(&mut b, b":method", b"CONNECT");
    lit(&mut b, b":authority", b"origin.example:443");
    c.send(&headers(1, &b, false));
    let ev = c.take_events();
    assert!(
        matches!(&ev[..], [Ev::Request { id: 1, method, path: None, end: false, .. }] if method == b"CONNECT"),
        "{ev:?}"
    );
    // With :path it is malformed (RFC 9113 §8.5).
    lit(&mut b, b":path", b"/");
    c.send(&headers(3, &b, false));
    assert_eq!(c.rst(3), 0x1);
}

#[test]
fn go_away_with_an_error_ends_the_connection_and_nothing_more_is_sent() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &get("/"), true));
    c.s.go_away(Code::INTERNAL_ERROR);
    let out = c.out();
    assert_eq!(
        (out[0].kind, out[0].last(), out[0].code()),
        (GOAWAY, 1, 0x2)
    );
    assert!(c.s.is_done());
    assert!(c.s.send_response(1, 200, std::iter::empty(), true).is_err());
    c.send(&headers(3, &get("/"), true));
    assert_eq!(c.err.unwrap().reason, Reason::Local);
    assert!(c.out().is_empty(), "one GOAWAY only");
}

#[test]
fn a_stream_the_client_ends_early_keeps_its_answer_going() {
    // The client's END_STREAM before the body's content-length: malformed.
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &post(Some("5")), false));
    c.send(&frame(DATA, END_STREAM, 1, b"abc"));
    assert_eq!(c.rst(1), 0x1);
    assert_eq!(
        c.take_events().last(),
        Some(&Ev::StreamError { id: 1, code: 0x1 })
    );
    // A server reset, then the client's own: nothing more on either side.
    c.send(&headers(3, &post(None), false));
    c.s.reset(3, Code::CANCEL);
    c.send(&frame(RST_STREAM, 0, 3, &8u32.to_be_bytes()));
    let out = c.out();
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(c
        .take_events()
        .iter()
        .all(|e| !matches!(e, Ev::Reset { .. })));
    assert_eq!(c.s.open_streams(), 0);
}

#[test]
fn frames_in_flight_on_many_streams_zgix_reset_are_ignored() {
    // More resets than the ring of closed streams remembers: the client's
    // DATA and trailers already on their way end nothing.
    let mut c = Client::open(Config::default());
    let ids: Vec<u32> = (0..40).map(|i| 1 + 2 * i).collect();
    for &id in &ids {
        c.send(&headers(id, &post(None), false));
    }
    for &id in &ids {
        c.s.reset(id, Code::INTERNAL_ERROR);
    }
    c.out();
    let mut t = Vec::new();
    lit(&mut t, b"x-t", b"1");
    for &id in &ids {
        c.send(&frame(DATA, 0, id, b"late"));
        c.send(&frame(HEADERS, END_HEADERS | END_STREAM, id, &t));
    }
    assert!(c.err.is_none(), "{:?}", c.err);
    let out = c.out();
    assert!(out.iter().all(|f| f.kind != RST_STREAM), "{out:?}");
    // A skipped id is still told apart: HEADERS on it is the connection's error.
    c.send(&headers(101, &get("/"), true));
    c.send(&headers(99, &get("/"), true));
    assert_eq!(c.goaway(), (101, 0x1));
}

#[test]
fn a_reset_of_a_stream_that_ended_both_ways_leaves_it_closed_as_it_was() {
    let mut c = Client::open(Config::default());
    c.send(&headers(1, &get("/"), true));
    c.s.send_response(1, 200, std::iter::empty(), true).unwrap();
    c.out();
    // The caller lets go of the stream: nothing is sent, and HEADERS on it
    // again is still STREAM_CLOSED (§5.1), not ignored as after a reset.
    c.s.reset(1, Code::CANCEL);
    assert!(c.out().iter().all(|f| f.kind != RST_STREAM));
    c.send(&headers(1, &get("/again"), true));
    assert_eq!(c.goaway(), (1, 0x5));
}
