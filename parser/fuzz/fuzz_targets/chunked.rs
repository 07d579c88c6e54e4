//! The chunked decoder: the same outcome whole, byte by byte, in the split the first byte picks and with data skipped (`skip_data`, as a splice does); rechunk() carries the same data in clean framing within its slack, and rechunk_pieces() gives rechunk()'s bytes as a gather list.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zgix_parser::{rechunk, rechunk_pieces, ChunkedDecoder, ParseError, Pieces, RECHUNK_SLACK};

/// Feeds `input` `step` bytes at a time (keeping unconsumed bytes), looping each piece.
fn decode(input: &[u8], step: usize) -> Result<(Vec<u8>, usize, bool), ParseError> {
    let mut dec = ChunkedDecoder::new(1 << 20);
    let (mut data, mut pos, mut end) = (Vec::new(), 0, 0);
    while end < input.len() && !dec.is_done() {
        end = (end + step).min(input.len());
        while pos < end {
            let p = dec.feed(&input[pos..end])?;
            assert!(p.data.end <= p.consumed && p.consumed <= end - pos);
            data.extend_from_slice(&input[pos..end][p.data.clone()]);
            pos += p.consumed;
            if p.done || p.consumed == 0 {
                break;
            }
        }
    }
    Ok((data, pos, dec.is_done()))
}

/// Like [`decode`], but whenever the decoder owes data and the piece is used up, part of
/// what it owes (as much as `input` still holds, times `frac`/8, at least 1) is moved
/// past it with `skip_data` instead of fed: a splice.
fn decode_skipping(
    input: &[u8],
    step: usize,
    frac: u64,
) -> Result<(Vec<u8>, usize, bool), ParseError> {
    let mut dec = ChunkedDecoder::new(1 << 20);
    let (mut data, mut pos, mut end) = (Vec::new(), 0, 0);
    while end < input.len() && !dec.is_done() {
        end = (end + step).min(input.len()).max(pos);
        while pos < end {
            let p = dec.feed(&input[pos..end])?;
            data.extend_from_slice(&input[pos..end][p.data.clone()]);
            pos += p.consumed;
            if p.done || p.consumed == 0 {
                break;
            }
        }
        let owed = dec.data_owed().min((input.len() - pos) as u64);
        if pos == end && owed > 0 {
            let k = (owed * frac / 8).max(1);
            assert_eq!(dec.skip_data(k), k);
            data.extend_from_slice(&input[pos..pos + k as usize]);
            pos += k as usize;
            end = pos;
        }
    }
    Ok((data, pos, dec.is_done()))
}

/// rechunk() fed `step` bytes at a time.
fn reencode(input: &[u8], step: usize) -> Result<(Vec<u8>, usize, bool), ParseError> {
    let mut dec = ChunkedDecoder::new(1 << 20);
    let (mut out, mut pos, mut end) = (Vec::new(), 0, 0);
    while end < input.len() && !dec.is_done() {
        end = (end + step).min(input.len());
        let before = out.len();
        let r = rechunk(&mut dec, &input[pos..end], &mut out)?;
        assert!(
            out.len() - before <= r.consumed + RECHUNK_SLACK,
            "slack exceeded"
        );
        pos += r.consumed;
    }
    Ok((out, pos, dec.is_done()))
}

/// rechunk_pieces() fed `step` bytes at a time, called again on the rest of
/// the same bytes while a call stops for room (as `conn/rechunk_up.rs` does),
/// the pieces written out in order.
fn reencode_pieces(input: &[u8], step: usize) -> Result<(Vec<u8>, usize, bool), ParseError> {
    let mut dec = ChunkedDecoder::new(1 << 20);
    let mut pieces = Pieces::new();
    let (mut out, mut pos, mut end) = (Vec::new(), 0, 0);
    while end < input.len() && !dec.is_done() {
        end = (end + step).min(input.len());
        loop {
            pieces.clear();
            let r = rechunk_pieces(&mut dec, &input[pos..end], &mut pieces)?;
            pieces.write_to(&input[pos..end], &mut out);
            pos += r.consumed;
            if !pieces.is_full() || r.done {
                break;
            }
            assert!(r.consumed > 0, "a call that stopped for room took nothing");
        }
    }
    Ok((out, pos, dec.is_done()))
}

/// `out` is `*( 1*HEXDIG CRLF data CRLF ) "0" CRLF CRLF`: sizes only, no extension, no
/// trailer, no zero-size chunk before the last.
fn assert_clean(mut out: &[u8]) {
    loop {
        let line = out.iter().position(|&b| b == b'\r').expect("size line");
        let size = std::str::from_utf8(&out[..line]).expect("ascii size");
        assert!(
            !size.is_empty() && size.bytes().all(|b| b.is_ascii_hexdigit()),
            "size line {size:?}"
        );
        let n = usize::from_str_radix(size, 16).expect("size");
        out = &out[line + 2..];
        if n == 0 {
            assert_eq!(out, b"\r\n", "trailers or bytes after the last chunk");
            return;
        }
        assert_eq!(&out[n..n + 2], b"\r\n");
        out = &out[n + 2..];
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&s, input)) = input.split_first() else {
        return;
    };
    let whole = decode(input, input.len().max(1));
    assert_eq!(decode(input, 1), whole, "byte by byte");
    assert_eq!(
        decode(input, 1 + usize::from(s % 17)),
        whole,
        "split {}",
        s % 17
    );
    assert_eq!(
        decode_skipping(input, 1 + usize::from(s % 7), u64::from(s >> 5) + 1),
        whole,
        "skipping, split {}",
        s % 7
    );
    let re = reencode(input, 1 + usize::from(s % 13));
    assert_eq!(
        reencode_pieces(input, 1 + usize::from(s % 13)),
        re,
        "rechunk_pieces and rechunk, split {}",
        s % 13
    );
    match (&whole, &re) {
        (Ok((data, consumed, done)), Ok((out, re_consumed, re_done))) => {
            assert_eq!((consumed, done), (re_consumed, re_done));
            if *done {
                // The re-encoded body is valid chunked framing with the same data, no
                // extensions and no trailers, and decodes the same however it is split.
                let (again, used, fin) = decode(out, out.len()).expect("re-encoding is valid");
                assert!(fin && used == out.len());
                assert_eq!(&again, data);
                assert_clean(out);
            }
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("rechunk and feed disagree: {whole:?} vs {re:?}"),
    }
});
