//! Tests for chunked.rs: every input whole, byte by byte and in uneven splits.
use super::*;

/// Feeds `input` in pieces of the given sizes (cycled), looping each piece until it is
/// used up or the message ends; returns the data, the bytes consumed, and done.
fn feed_split(
    max_body: u64,
    input: &[u8],
    sizes: &[usize],
) -> Result<(Vec<u8>, usize, bool), ParseError> {
    let mut dec = ChunkedDecoder::new(max_body);
    let mut data = Vec::new();
    let mut pos = 0;
    let mut fed = 0;
    let mut k = 0;
    while fed < input.len() && !dec.is_done() {
        // Bytes the caller has buffered but not yet handed over as consumed.
        fed = (fed + sizes[k % sizes.len()].max(1)).min(input.len());
        k += 1;
        loop {
            let p = dec.feed(&input[pos..fed])?;
            assert!(p.data.end <= p.consumed);
            data.extend_from_slice(&input[pos..fed][p.data.clone()]);
            pos += p.consumed;
            if p.done {
                assert!(dec.is_done());
                return Ok((data, pos, true));
            }
            assert!(p.consumed > 0 || pos == fed, "stalled at {pos}");
            if pos == fed {
                break;
            }
        }
    }
    Ok((data, pos, dec.is_done()))
}

/// Checks `input` gives the same outcome whole, byte by byte, and in uneven splits.
fn decode(max_body: u64, input: &[u8]) -> Result<(Vec<u8>, usize), ParseError> {
    let whole = feed_split(max_body, input, &[input.len()]);
    for sizes in [&[1][..], &[2], &[3, 1, 7], &[5, 11, 2, 1], &[13, 1]] {
        assert_eq!(feed_split(max_body, input, sizes), whole, "split {sizes:?}");
    }
    let (data, consumed, done) = whole?;
    assert!(
        done,
        "message not complete: {:?}",
        String::from_utf8_lossy(input)
    );
    Ok((data, consumed))
}

fn err(input: &[u8]) -> ParseError {
    decode(u64::MAX, input).expect_err(&String::from_utf8_lossy(input))
}

#[test]
fn simple_body_with_pipelined_bytes() {
    let msg = b"4\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\n\r\n";
    let mut input = msg.to_vec();
    input.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
    let (data, consumed) = decode(u64::MAX, &input).unwrap();
    assert_eq!(data, b"Wikipedia in\r\n\r\nchunks.");
    assert_eq!(consumed, msg.len());
}

#[test]
fn extensions_and_trailers() {
    let msg = b"3;name=val;q=\"a b\"\r\nabc\r\n3 ; x\r\ndef\r\n0;last\r\nX-Sum: 123\r\nY:\r\n\r\n";
    let (data, consumed) = decode(u64::MAX, msg).unwrap();
    assert_eq!(data, b"abcdef");
    assert_eq!(consumed, msg.len());
}

#[test]
fn extensions_follow_rfc9112_7_1_1() {
    for ok in [
        &b"1;a\r\nx\r\n0\r\n\r\n"[..],
        b"1;a=b\r\nx\r\n0\r\n\r\n",
        b"1 ; a = b ; c\r\nx\r\n0\r\n\r\n",
        b"1;a\t=\t\"q \\\" \\\\ \x80\"\r\nx\r\n0\r\n\r\n",
        b"1;a=\"\";b=\"c\" ;d\r\nx\r\n0\r\n\r\n",
        b"1;!#$%&'*+-.^_`|~09AZaz=!#$%&'*+-.^_`|~\r\nx\r\n0\r\n\r\n",
        b"0;last=1\r\n\r\n",
    ] {
        let (data, _) = decode(u64::MAX, ok)
            .unwrap_or_else(|e| panic!("{e:?}: {:?}", String::from_utf8_lossy(ok)));
        assert!(data.len() <= 1);
    }
    // The issue's vectors, then every other place the grammar has no room.
    for bad in [
        &b"2;\r\nab\r\n0\r\n\r\n"[..],
        b"2;a=\"b\r\nab\r\n0\r\n\r\n",
        b"2;a b\r\nab\r\n0\r\n\r\n",
        b"2;a=\xff\r\nab\r\n0\r\n\r\n",
        b"2;a=\r\nab\r\n0\r\n\r\n",
        b"2;a \r\nab\r\n0\r\n\r\n",
        b"2;a=b \r\nab\r\n0\r\n\r\n",
        b"2;a=\"b\" \r\nab\r\n0\r\n\r\n",
        b"2;a=\"b\"c\r\nab\r\n0\r\n\r\n",
        b"2;a==b\r\nab\r\n0\r\n\r\n",
        b"2;=b\r\nab\r\n0\r\n\r\n",
        b"2;;a\r\nab\r\n0\r\n\r\n",
        b"2;a=b=c\r\nab\r\n0\r\n\r\n",
        b"2;a,b\r\nab\r\n0\r\n\r\n",
        b"2;a=\"\x7f\"\r\nab\r\n0\r\n\r\n",
        b"2;a=\"\\\x00\"\r\nab\r\n0\r\n\r\n",
        b"2;a=\"b\\\"\r\nab\r\n0\r\n\r\n",
        b"2 a\r\nab\r\n0\r\n\r\n",
        b"0;\r\n\r\n",
    ] {
        assert_eq!(
            err(bad),
            ParseError::BadChunk,
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn sizes() {
    let (data, _) = decode(u64::MAX, b"00a\r\n0123456789\r\n0000\r\n\r\n").unwrap();
    assert_eq!(data, b"0123456789");
    let (data, _) = decode(u64::MAX, b"0\r\n\r\n").unwrap();
    assert!(data.is_empty());
    // 16 digits is the most; the value itself may be anything up to u64::MAX.
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let p = dec.feed(b"ffffffffffffffff\r\nab").unwrap();
    assert_eq!((p.consumed, p.data, p.done), (20, 18..20, false));
    assert_eq!(
        err(b"00000000000000001\r\na\r\n0\r\n\r\n"),
        ParseError::BadChunk
    );
    assert_eq!(err(b"fffffffffffffffff\r\n"), ParseError::BadChunk);
}

#[test]
fn bad_chunks() {
    for bad in [
        &b"\r\n"[..],
        b"g\r\n",
        b"-1\r\n",
        b"+1\r\na\r\n0\r\n\r\n",
        b"0x1\r\na\r\n0\r\n\r\n",
        b" 1\r\na\r\n0\r\n\r\n",
        b"1 \r\na\r\n0\r\n\r\n",
        b"1\na\r\n0\r\n\r\n",
        b"1\r\na\n0\r\n\r\n",
        b"1\r\nab\r\n0\r\n\r\n",
        b"1\r\na\r\r\n",
        b"1\rx",
        b"1;a\x00b\r\n",
        b"1;a\nb\r\n",
        b"0\r\n\n",
        b"0\r\n\rx",
        b"0\r\nX: y\n\r\n",
        b"0\r\n X: y\r\n\r\n",
        b"0\r\nX : y\r\n\r\n",
        b"0\r\nX\r\n\r\n",
        b"0\r\n:y\r\n\r\n",
        b"0\r\nX: a\x00\r\n\r\n",
    ] {
        assert_eq!(
            err(bad),
            ParseError::BadChunk,
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn line_and_total_limits() {
    // Size line: 1 digit + ";" + ext = MAX_CHUNK_LINE bytes fits, one more does not.
    let ext = "e".repeat(MAX_CHUNK_LINE - 2);
    let ok = format!("1;{ext}\r\na\r\n0\r\n\r\n");
    assert!(decode(u64::MAX, ok.as_bytes()).is_ok());
    let over = format!("1;{ext}e\r\na\r\n0\r\n\r\n");
    assert_eq!(err(over.as_bytes()), ParseError::BadChunk);
    // Trailer line over MAX_CHUNK_LINE.
    let long = format!("0\r\nX: {}\r\n\r\n", "v".repeat(MAX_CHUNK_LINE));
    assert_eq!(err(long.as_bytes()), ParseError::BadChunk);
    // Many small extensions add up.
    let many =
        "1;xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\na\r\n".repeat(300);
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let mut rest = many.as_bytes();
    let e = loop {
        match dec.feed(rest) {
            Ok(p) => rest = &rest[p.consumed..],
            Err(e) => break e,
        }
    };
    assert_eq!(e, ParseError::BadChunk);
    // Many trailer lines add up.
    let trailers = format!("0\r\n{}\r\n", "X-Trailer: value\r\n".repeat(1000));
    assert_eq!(err(trailers.as_bytes()), ParseError::BadChunk);
}

#[test]
fn body_limit() {
    assert!(decode(10, b"5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n").is_ok());
    assert_eq!(
        decode(9, b"5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n").unwrap_err(),
        ParseError::BodyTooLarge
    );
    // Refused when the size line completes, before any of its data arrives.
    let mut dec = ChunkedDecoder::new(9);
    assert_eq!(
        dec.feed(b"a\r"),
        Ok(Progress {
            consumed: 2,
            data: 0..0,
            done: false
        })
    );
    assert_eq!(dec.feed(b"\n"), Err(ParseError::BodyTooLarge));
    assert_eq!(
        decode(u64::MAX - 1, b"ffffffffffffffff\r\n").unwrap_err(),
        ParseError::BodyTooLarge
    );
}

#[test]
fn errors_are_sticky_and_reset_clears() {
    let mut dec = ChunkedDecoder::new(100);
    assert_eq!(dec.feed(b"z"), Err(ParseError::BadChunk));
    assert_eq!(dec.feed(b"0\r\n\r\n"), Err(ParseError::BadChunk));
    dec.reset();
    let p = dec.feed(b"0\r\n\r\n").unwrap();
    assert!(p.done);
    // Done consumes nothing more.
    assert_eq!(
        dec.feed(b"1\r\n"),
        Ok(Progress {
            consumed: 0,
            data: 0..0,
            done: true
        })
    );
}

#[test]
fn one_data_run_per_call() {
    let msg = b"2\r\nab\r\n2\r\ncd\r\n0\r\n\r\nNEXT";
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let p = dec.feed(msg).unwrap();
    // First run, then framing up to the second run.
    assert_eq!(
        p,
        Progress {
            consumed: 10,
            data: 3..5,
            done: false
        }
    );
    let p = dec.feed(&msg[10..]).unwrap();
    assert_eq!(
        p,
        Progress {
            consumed: 9,
            data: 0..2,
            done: true
        }
    );
    assert_eq!(&msg[19..], b"NEXT");
}

#[test]
fn generated_bodies_in_pseudo_random_splits() {
    // A small LCG keeps the test deterministic without a dependency.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for round in 0..20 {
        let mut msg = Vec::new();
        let mut payload = Vec::new();
        for c in 0..next(8) {
            let len = 1 + next(300) as usize;
            let chunk: Vec<u8> = (0..len).map(|i| (i as u8) ^ (c as u8) ^ round).collect();
            if next(2) == 0 {
                msg.extend_from_slice(format!("{len:x}\r\n").as_bytes());
            } else {
                msg.extend_from_slice(format!("{len:X};r={round}\r\n").as_bytes());
            }
            msg.extend_from_slice(&chunk);
            msg.extend_from_slice(b"\r\n");
            payload.extend_from_slice(&chunk);
        }
        msg.extend_from_slice(b"0\r\n");
        if next(2) == 0 {
            msg.extend_from_slice(b"X-Checksum: abc\r\n");
        }
        msg.extend_from_slice(b"\r\n");
        let end = msg.len();
        msg.extend_from_slice(b"POST /next HTTP/1.1\r\n");
        let sizes: Vec<usize> = (0..7).map(|_| 1 + next(40) as usize).collect();
        let whole = feed_split(u64::MAX, &msg, &[msg.len()]).unwrap();
        assert_eq!(whole, (payload.clone(), end, true));
        assert_eq!(
            feed_split(u64::MAX, &msg, &sizes).unwrap(),
            whole,
            "{sizes:?}"
        );
        assert_eq!(feed_split(u64::MAX, &msg, &[1]).unwrap(), whole);
    }
}

#[test]
fn partial_input_is_not_an_error() {
    let mut dec = ChunkedDecoder::new(u64::MAX);
    let p = dec.feed(b"10\r\n0123").unwrap();
    assert_eq!(
        p,
        Progress {
            consumed: 8,
            data: 4..8,
            done: false
        }
    );
    let p = dec.feed(b"").unwrap();
    assert_eq!(
        p,
        Progress {
            consumed: 0,
            data: 0..0,
            done: false
        }
    );
    assert_eq!(dec.body_len(), 16);
}

#[test]
fn data_owed_counts_down_and_skip_data_stands_for_feeding() {
    let mut dec = ChunkedDecoder::new(u64::MAX);
    assert_eq!(dec.data_owed(), 0);
    // Outside a chunk's data nothing is skipped.
    assert_eq!(dec.skip_data(5), 0);
    let p = dec.feed(b"10;x=y\r\n0123").unwrap();
    assert_eq!((p.consumed, p.data), (12, 8..12));
    assert_eq!(dec.data_owed(), 12);
    assert_eq!(dec.skip_data(5), 5);
    assert_eq!(dec.data_owed(), 7);
    // More than the chunk owes: only what it owes.
    assert_eq!(dec.skip_data(100), 7);
    assert_eq!(dec.data_owed(), 0);
    assert_eq!(dec.skip_data(1), 0);
    assert_eq!(dec.body_len(), 16);
    // The CRLF after the data, then the next chunk, fed as usual.
    let p = dec.feed(b"\r\n3\r\nabc\r\n0\r\nT: v\r\n\r\nNEXT").unwrap();
    assert_eq!((p.consumed, p.data, p.done), (21, 5..8, true));
    assert_eq!(dec.data_owed(), 0);
    assert_eq!(dec.skip_data(1), 0);
}

#[test]
fn after_skipped_data_the_strict_checks_still_hold() {
    // A bad CRLF after the skipped data.
    for bad in [&b"XX"[..], b"\n", b"\rX", b"a\r\n"] {
        let mut dec = ChunkedDecoder::new(u64::MAX);
        dec.feed(b"4\r\n").unwrap();
        assert_eq!(dec.skip_data(4), 4);
        let mut rest = bad;
        let e = loop {
            match dec.feed(rest) {
                Ok(p) if p.consumed > 0 => rest = &rest[p.consumed..],
                Ok(p) => panic!("{bad:?} accepted: {p:?}"),
                Err(e) => break e,
            }
        };
        assert_eq!(e, ParseError::BadChunk, "{bad:?}");
        // Sticky, and nothing more to skip.
        assert_eq!(dec.skip_data(1), 0);
        assert_eq!(dec.feed(b"\r\n"), Err(ParseError::BadChunk));
    }
    // The body limit counts skipped chunks like fed ones.
    let mut dec = ChunkedDecoder::new(10);
    dec.feed(b"6\r\n").unwrap();
    assert_eq!(dec.skip_data(6), 6);
    assert_eq!(dec.feed(b"\r\n5\r\n"), Err(ParseError::BodyTooLarge));
    // A size past 16 digits is refused before any data can be skipped.
    let mut dec = ChunkedDecoder::new(u64::MAX);
    assert_eq!(
        dec.feed(b"10000000000000000\r\n"),
        Err(ParseError::BadChunk)
    );
    assert_eq!(dec.data_owed(), 0);
    assert_eq!(dec.skip_data(1), 0);
}

#[test]
fn skipping_any_part_of_the_data_in_any_split_gives_the_same_message() {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for round in 0..40u8 {
        let mut msg = Vec::new();
        let mut payload = Vec::new();
        for c in 0..1 + next(6) {
            let len = 1 + next(5000) as usize;
            let chunk: Vec<u8> = (0..len).map(|i| (i as u8) ^ (c as u8) ^ round).collect();
            msg.extend_from_slice(format!("{len:x};r={round}\r\n").as_bytes());
            msg.extend_from_slice(&chunk);
            msg.extend_from_slice(b"\r\n");
            payload.extend_from_slice(&chunk);
        }
        msg.extend_from_slice(b"0\r\nX-T: 1\r\n\r\n");
        let end = msg.len();
        msg.extend_from_slice(b"GET / HTTP/1.1\r\n");
        // The caller's buffer holds `msg[pos..fed]`; whenever the scanner is in a
        // chunk's data it may move some of what is owed past the buffer (a splice)
        // and skip it.
        let mut dec = ChunkedDecoder::new(u64::MAX);
        let (mut pos, mut fed, mut data) = (0usize, 0usize, Vec::new());
        while !dec.is_done() {
            assert!(fed < msg.len(), "round {round}: ran out at {pos}");
            fed = (fed + 1 + next(700) as usize).min(msg.len()).max(pos);
            loop {
                let p = dec.feed(&msg[pos..fed]).unwrap();
                data.extend_from_slice(&msg[pos..fed][p.data.clone()]);
                pos += p.consumed;
                if p.done || pos == fed {
                    break;
                }
            }
            let owed = dec.data_owed();
            if owed > 0 && pos == fed && next(2) == 0 {
                let k = 1 + next(owed);
                assert_eq!(dec.skip_data(k), k);
                data.extend_from_slice(&msg[pos..pos + k as usize]);
                pos += k as usize;
                fed = pos;
            }
        }
        assert_eq!(pos, end, "round {round}");
        assert_eq!(data, payload, "round {round}");
    }
}
