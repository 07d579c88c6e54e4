//! The rest of h2spec's `http2` cases for `http2_conformance.rs`: closed streams (§5.1), the concurrency limit (§5.1.2), priority (§5.3), connection error handling (§5.4.1), extensions (§5.5), PING acknowledgements (§6.7), windows (§6.9), CONTINUATION order (§6.10) and unknown error codes (§7).

use super::*;

/// HEADERS with the PRIORITY flag: `block` on stream `id`, depending on `dep`.
fn prioritized(id: u32, dep: u32, block: &[u8]) -> Vec<u8> {
    let mut p = dep.to_be_bytes().to_vec();
    p.push(16);
    p.extend_from_slice(block);
    f(HEADERS, EH | ES | 0x20, id, &p)
}

/// §5.1 closed streams, §5.1.2, §5.3, §5.4.1, §5.5.
pub(crate) fn streams(k: &Kit) -> Vec<Case> {
    let hang = || hdr(1, &req("/hang"), EH);
    let done = || hdr(1, &req("/"), EH | ES);
    let rst = || f(RST_STREAM, 0, 1, &CANCEL.to_be_bytes());
    let mut many: Vec<Vec<u8>> = (0..129)
        .map(|i| hdr(1 + 2 * i, &req("/hang"), EH | ES))
        .collect();
    many.insert(0, f(SETTINGS, 0, 0, &[]));
    vec![
        (
            "5.1/8 DATA after RST_STREAM",
            vec![hang(), rst(), f(DATA, 0, 1, b"x")],
            Want::Stream(1, &[STREAM_CLOSED]),
        ),
        (
            "5.1/9 HEADERS after RST_STREAM",
            vec![hang(), rst(), hdr(1, &req("/"), EH | ES)],
            Want::Stream(1, &[STREAM_CLOSED]),
        ),
        (
            "5.1/10 CONTINUATION after RST_STREAM",
            vec![hang(), rst(), f(CONTINUATION, EH, 1, &req("/"))],
            Want::Conn(&[PROTOCOL_ERROR, STREAM_CLOSED]),
        ),
        (
            "5.1/11 DATA after END_STREAM",
            vec![done(), f(DATA, 0, 1, b"x")],
            Want::Stream(1, &[STREAM_CLOSED]),
        ),
        (
            "5.1/12 HEADERS after END_STREAM",
            vec![done(), hdr(1, &req("/"), EH | ES)],
            Want::Stream(1, &[STREAM_CLOSED]),
        ),
        (
            "5.1/13 CONTINUATION after END_STREAM",
            vec![done(), f(CONTINUATION, EH, 1, &req("/"))],
            Want::Conn(&[PROTOCOL_ERROR, STREAM_CLOSED]),
        ),
        (
            "5.1.2/1 one stream over SETTINGS_MAX_CONCURRENT_STREAMS",
            many,
            Want::Stream(257, &[REFUSED_STREAM, PROTOCOL_ERROR]),
        ),
        (
            "5.3.1/1 HEADERS depending on its own stream",
            vec![prioritized(1, 1, &req("/"))],
            Want::Stream(1, &[PROTOCOL_ERROR]),
        ),
        (
            "5.3.1/2 PRIORITY depending on its own stream",
            vec![f(PRIORITY, 0, 1, &[0, 0, 0, 1, 16])],
            Want::Stream(1, &[PROTOCOL_ERROR]),
        ),
        (
            "5.3/1 HEADERS with a priority is answered",
            vec![prioritized(1, 0, &req("/"))],
            Want::Answer(1),
        ),
        (
            "5.3/2 PRIORITY on an idle stream is accepted",
            vec![f(PRIORITY, 0, 3, &[0, 0, 0, 0, 16]), k.ping.clone()],
            Want::PingAck,
        ),
        (
            "5.4.1/1 an invalid PING ends the connection",
            vec![f(PING, 0, 0, b"h2spec!!!")],
            Want::Conn(&[FRAME_SIZE_ERROR]),
        ),
        (
            "5.5/1 an unknown extension frame is ignored",
            vec![f(0xfe, 0xff, 1, b"extension"), k.ping.clone()],
            Want::PingAck,
        ),
    ]
}

/// §6.1, §6.4, §6.7, §6.9, §6.10 and §7 cases beyond the first ones.
pub(crate) fn frames(k: &Kit) -> Vec<Case> {
    let part = &k.continuation;
    let mut window_one = vec![f(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 1])];
    window_one.push(hdr(1, &req("/cl/100"), EH | ES));
    vec![
        (
            "6.1/3 DATA on a half-closed (remote) stream",
            vec![hdr(1, &req("/cl/100000"), EH | ES), f(DATA, ES, 1, b"x")],
            Want::Stream(1, &[STREAM_CLOSED]),
        ),
        (
            "6.4/3 RST_STREAM on an idle stream",
            vec![f(RST_STREAM, 0, 3, &CANCEL.to_be_bytes())],
            Want::Conn(&[PROTOCOL_ERROR]),
        ),
        (
            "6.7/4 a PING acknowledgement is not answered",
            vec![f(PING, 1, 0, b"ackackac"), k.ping.clone()],
            Want::PingAck,
        ),
        (
            "6.9.1/4 SETTINGS_INITIAL_WINDOW_SIZE of 1 sends DATA of 1",
            window_one,
            Want::Data(1, 1),
        ),
        (
            "6.9.2/1 SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1 after a stream",
            vec![
                hdr(1, &req("/hang"), EH | ES),
                f(SETTINGS, 0, 0, &[0, 4, 0x80, 0, 0, 0]),
            ],
            Want::Conn(&[FLOW_CONTROL_ERROR]),
        ),
        (
            "6.10/5 HEADERS without END_HEADERS, then DATA",
            vec![hdr(1, &part.0, 0), f(DATA, ES, 1, b"x")],
            Want::Conn(&[PROTOCOL_ERROR]),
        ),
        (
            "6.10/6 CONTINUATION after DATA",
            vec![
                hdr(1, &post(None), EH),
                f(DATA, 0, 1, b"x"),
                f(CONTINUATION, EH, 1, &req("/")),
            ],
            Want::Conn(&[PROTOCOL_ERROR]),
        ),
        (
            "7/1 GOAWAY with an unknown error code",
            vec![
                f(GOAWAY, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0xff]),
                k.ping.clone(),
            ],
            Want::PingAckOrClose,
        ),
        (
            "7/2 RST_STREAM with an unknown error code",
            vec![
                hdr(1, &req("/hang"), EH | ES),
                f(RST_STREAM, 0, 1, &[0, 0, 0, 0xff]),
                k.ping.clone(),
            ],
            Want::PingAck,
        ),
    ]
}
