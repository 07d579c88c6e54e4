//! [`rechunk_pieces`] against [`rechunk`]: the same bytes, `consumed`, `done` and errors for the same input and splits, within the fixed capacities, and an error anywhere in an input found before any of its pieces go.

use super::*;
use crate::rechunk::rechunk;

/// What a whole re-encoding of `input` fed in pieces of `step` bytes gave.
#[derive(Debug, PartialEq, Eq)]
struct Out {
    bytes: Vec<u8>,
    consumed: usize,
    /// `(consumed, done)` of every call that was given new input.
    calls: Vec<(usize, bool)>,
}

/// The reference: `rechunk` over each step's input (the caller keeps the
/// unconsumed bytes and adds the next step).
fn by_rechunk(input: &[u8], step: usize, max_body: u64) -> Result<Out, ParseError> {
    let mut dec = ChunkedDecoder::new(max_body);
    let (mut bytes, mut calls) = (Vec::new(), Vec::new());
    let (mut pos, mut end) = (0, 0);
    while !dec.is_done() && end < input.len() {
        end = (end + step).min(input.len());
        let r = rechunk(&mut dec, &input[pos..end], &mut bytes)?;
        calls.push((r.consumed, r.done));
        pos += r.consumed;
    }
    Ok(Out {
        bytes,
        consumed: pos,
        calls,
    })
}

/// The same through `rechunk_pieces`, calling again on the rest while a
/// call stops for room; also checks every call's bounds and that a call
/// that stopped for room was not the one that saw the error.
fn by_pieces(input: &[u8], step: usize, max_body: u64) -> Result<(Out, usize), ParseError> {
    let mut dec = ChunkedDecoder::new(max_body);
    let mut out = Pieces::new();
    let (mut bytes, mut calls) = (Vec::new(), Vec::new());
    let (mut pos, mut end, mut most) = (0, 0, 0);
    while !dec.is_done() && end < input.len() {
        end = (end + step).min(input.len());
        let mut total = (0, false);
        loop {
            out.clear();
            let r = rechunk_pieces(&mut dec, &input[pos..end], &mut out)?;
            assert!(out.pieces().len() < PIECES_MAX);
            assert!(out.framing().len() + CALLER_BYTES <= FRAMING_MAX);
            assert_eq!(out.len(), {
                let mut v = Vec::new();
                out.write_to(&input[pos..end], &mut v);
                v.len()
            });
            for p in out.pieces() {
                if let Piece::Data(r) = p {
                    assert!(r.len() > COPY_MAX || out.framing().len() + r.len() > FRAMING_MAX);
                }
            }
            most = most.max(out.pieces().len());
            out.write_to(&input[pos..end], &mut bytes);
            pos += r.consumed;
            total = (total.0 + r.consumed, r.done);
            if !out.is_full() {
                break;
            }
            assert!(!r.done && pos < end, "stopped for room with nothing left");
        }
        calls.push(total);
    }
    Ok((
        Out {
            bytes,
            consumed: pos,
            calls,
        },
        most,
    ))
}

/// Both ways agree on `input` at every split in `steps`; returns the most
/// pieces a call held.
#[track_caller]
fn agree(input: &[u8], steps: impl IntoIterator<Item = usize>, max_body: u64) -> usize {
    let mut most = 0;
    for step in steps {
        let want = by_rechunk(input, step, max_body);
        let got = by_pieces(input, step, max_body);
        match (want, got) {
            (Ok(w), Ok((g, m))) => {
                assert_eq!(g, w, "step {step}");
                most = most.max(m);
            }
            (Err(w), Err(g)) => assert_eq!(g, w, "step {step}"),
            (w, g) => panic!("step {step}: rechunk {w:?}, pieces {:?}", g.map(|g| g.0)),
        }
    }
    most
}

/// `count` chunks of `len` bytes (pattern data), extensions on every third
/// of the first 30 size lines, then a last chunk with a trailer and `tail`.
fn message(count: usize, len: usize, tail: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    for i in 0..count {
        if i % 3 == 0 && i < 30 {
            m.extend_from_slice(format!("{len:X};i={i};q=\"a b\"\r\n").as_bytes());
        } else {
            m.extend_from_slice(format!("{len:x}\r\n").as_bytes());
        }
        m.extend((0..len).map(|k| b'a' + ((i + k) % 26) as u8));
        m.extend_from_slice(b"\r\n");
    }
    m.extend_from_slice(b"0;last\r\nX-Sum: 123\r\n\r\n");
    m.extend_from_slice(tail);
    m
}

#[test]
fn the_same_bytes_as_rechunk_at_every_split() {
    let msg = b"10;a=b\r\n0123456789abcdef\r\n1\r\nx\r\n0\r\nT: v\r\n\r\nNEXT";
    agree(msg, 1..=msg.len(), u64::MAX);
    let msg = message(12, 100, b"GET / HTTP/1.1\r\n");
    agree(&msg, (1..40).chain([97, 500, msg.len()]), u64::MAX);
    agree(b"00A\r\n0123456789\r\n000\r\n\r\n", 1..30, u64::MAX);
}

#[test]
fn many_tiny_chunks_are_copied_into_the_framing_and_stay_bounded() {
    let msg = message(3000, 1, b"");
    let most = agree(&msg, [msg.len(), 4096, 16 << 10, 1000, 7], u64::MAX);
    assert!(most <= PIECES_MAX);
    // Whole, a few calls: each one framing piece of copied chunks.
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let mut out = Pieces::new();
    let r = rechunk_pieces(&mut dec, &msg, &mut out).unwrap();
    assert!(out.is_full() && !r.done);
    assert_eq!(out.pieces().len(), 1, "{:?}", out.pieces());
    assert!(!out.has_data());
}

#[test]
fn more_runs_than_iovecs_take_several_calls_of_data_ranges() {
    let msg = message(200, 1000, b"");
    let most = agree(&msg, [msg.len(), 16 << 10, 4099], u64::MAX);
    assert!(most > PIECES_MAX / 2, "{most}");
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let mut out = Pieces::new();
    let r = rechunk_pieces(&mut dec, &msg, &mut out).unwrap();
    assert!(out.is_full() && r.consumed < msg.len());
    // Data pieces are ranges of the input, framing the size lines between.
    let data: Vec<_> = out
        .pieces()
        .iter()
        .filter_map(|p| match p {
            Piece::Data(r) => Some(&msg[r.clone()]),
            Piece::Framing(_) => None,
        })
        .collect();
    assert!(data.len() > 20);
    assert!(data.iter().all(|d| d.len() == 1000));
    assert!(out.framing().starts_with(b"3e8\r\n"));
}

#[test]
fn extensions_and_trailers_are_dropped_as_by_rechunk() {
    let msg = b"3;name=val;q=\"a b\"\r\nabc\r\n3 ; x\r\ndef\r\n0;last\r\nX-Sum: 123\r\nContent-Length: 9\r\n\r\nNEXT";
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let mut out = Pieces::new();
    let r = rechunk_pieces(&mut dec, msg, &mut out).unwrap();
    assert!(r.done && !out.is_full());
    assert_eq!(&msg[r.consumed..], b"NEXT");
    let mut v = Vec::new();
    out.write_to(msg, &mut v);
    assert_eq!(v, b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n");
    assert_eq!(out.pieces(), &[Piece::Framing(0..v.len())]);
}

#[test]
fn errors_and_limits_are_rechunks() {
    agree(b"2;a b\r\nab\r\n0\r\n\r\n", [1, 3, 64], u64::MAX);
    agree(b"4\r\nabcd\r\n", [1, 64], 3);
    let msg = message(100, 200, b"");
    agree(&msg, [msg.len(), 1000], 100 * 200 - 1);
    let mut bad = message(100, 200, b"");
    // The CRLF after the last chunk's data (the trailer part is 22 bytes).
    let at = bad.len() - 24;
    bad[at..at + 2].copy_from_slice(b"\n\n");
    agree(&bad, [bad.len(), 5000, 33], u64::MAX);
}

#[test]
fn an_error_past_the_first_call_is_found_before_its_pieces_go() {
    // Far more runs than one call holds, and a bad CRLF in the last chunk.
    let mut msg = message(200, 100, b"");
    let end = msg.len();
    msg[end - 22 - 2] = b'X';
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let mut out = Pieces::new();
    assert_eq!(
        rechunk_pieces(&mut dec, &msg, &mut out),
        Err(ParseError::BadChunk)
    );
    // And the decoder keeps failing, as after `rechunk`'s error.
    out.clear();
    assert_eq!(
        rechunk_pieces(&mut dec, b"0\r\n\r\n", &mut out),
        Err(ParseError::BadChunk)
    );
    // The same body whole goes in several calls, its rest checked once.
    let msg = message(200, 100, b"");
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let (mut pos, mut calls) = (0, 0);
    loop {
        out.clear();
        let r = rechunk_pieces(&mut dec, &msg[pos..], &mut out).unwrap();
        pos += r.consumed;
        calls += 1;
        if r.done {
            break;
        }
        assert!(out.is_full());
        assert_eq!(out.checked, msg.len() - pos);
    }
    assert!(calls > 2, "{calls}");
    assert_eq!(pos, msg.len());
}

#[test]
fn size_lines_are_lower_case_hex_without_padding() {
    let mut p = Pieces::new();
    for n in [0u64, 1, 0xf, 0x10, 0xabc, 256 << 10, u64::MAX] {
        p.clear();
        p.push_size_line(n);
        assert_eq!(p.framing(), format!("{n:x}\r\n").as_bytes());
    }
    // Framing pushed by the caller joins the pieces around it.
    p.clear();
    p.push_framing(b"\r\n");
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let input = b"5\r\nhel";
    let r = rechunk_pieces(&mut dec, input, &mut p).unwrap();
    assert_eq!(r.consumed, input.len());
    p.push_size_line(dec.data_owed());
    let mut v = Vec::new();
    p.write_to(input, &mut v);
    assert_eq!(v, b"\r\n3\r\nhel\r\n2\r\n");
    assert_eq!(p.pieces().len(), 1);
}
