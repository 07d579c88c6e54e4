//! Re-encoding a validated chunked body for the next hop: the decoder's data in fresh chunks, no extensions, no trailers.

use std::io::Write as _;

use crate::chunked::ChunkedDecoder;
use crate::error::ParseError;

/// Most bytes [`rechunk`] may write beyond the input it consumed in one call. A call's
/// output frames the same data as its input, except that a data run continuing a chunk
/// begun in an earlier input gets a size line of its own (at most 16 hex digits + CRLF)
/// and a run cut by the end of the input gets its closing CRLF at once: 20 bytes. The
/// last chunk and final CRLF (5 bytes) are never longer than the input's own (`0` CRLF,
/// trailers, CRLF), except when a call is fed only the tail of them; 64 covers either.
pub const RECHUNK_SLACK: usize = 64;

/// What one [`rechunk`] call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rechunked {
    /// Bytes of the input consumed; the rest waits for more input, or (once `done`)
    /// belongs to whatever follows the message.
    pub consumed: usize,
    /// The message is complete, and its last chunk has been written.
    pub done: bool,
}

/// Feeds `input` through `dec` (which validates the framing, RFC 9112 §7.1) and appends
/// the same body to `out` re-encoded: each run of chunk-data as its own chunk,
/// `size CRLF data CRLF` with the size in lower-case hex and no chunk-ext, and once the
/// message ends the last chunk `0 CRLF CRLF`.
///
/// - Extensions are dropped: zgix interprets none (RFC 9112 §7.1.1 lets a recipient
///   ignore unrecognized ones), and an origin that never sees one cannot parse one
///   differently from zgix.
/// - The trailer section is dropped (validated by the decoder, never forwarded): RFC 9112
///   §7.1.2 lets a recipient that removes the chunked coding discard trailer fields, and
///   zgix already strips the `Trailer` field that would announce them (it is hop-by-hop
///   in zgix's table). A trailer must not be a way to send framing fields (Content-Length,
///   Transfer-Encoding, Host) past the head's checks to an origin that merges trailers.
/// - Chunk boundaries may differ from the client's (a chunk split across reads becomes two
///   chunks); the bytes of the body are the same.
///
/// Stops at the end of the message; on error nothing useful is in `out` past its old
/// length and the decoder keeps failing. Appends at most `consumed + RECHUNK_SLACK` bytes,
/// so an `out` with that much spare capacity never grows (no allocation).
pub fn rechunk(
    dec: &mut ChunkedDecoder,
    input: &[u8],
    out: &mut Vec<u8>,
) -> Result<Rechunked, ParseError> {
    let mut pos = 0;
    while pos < input.len() && !dec.is_done() {
        let p = dec.feed(&input[pos..])?;
        if !p.data.is_empty() {
            let data = &input[pos..][p.data];
            let _ = write!(out, "{:x}\r\n", data.len());
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
        }
        pos += p.consumed;
        if p.done {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        if p.consumed == 0 {
            break;
        }
    }
    Ok(Rechunked {
        consumed: pos,
        done: dec.is_done(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Re-encodes `input` fed in pieces of `step` bytes (the caller keeps unconsumed
    /// bytes and adds the next piece), checking the slack bound on every call.
    fn reencode(input: &[u8], step: usize) -> Result<(Vec<u8>, usize), ParseError> {
        let mut dec = ChunkedDecoder::new(u64::MAX);
        let mut out = Vec::new();
        let mut pos = 0;
        let mut end = 0;
        while !dec.is_done() && end < input.len() {
            end = (end + step).min(input.len());
            let before = out.len();
            let r = rechunk(&mut dec, &input[pos..end], &mut out)?;
            assert!(out.len() - before <= r.consumed + RECHUNK_SLACK);
            pos += r.consumed;
            assert_eq!(r.done, dec.is_done());
        }
        assert!(
            dec.is_done(),
            "incomplete: {:?}",
            String::from_utf8_lossy(input)
        );
        Ok((out, pos))
    }

    /// The data a chunked message carries.
    fn data_of(msg: &[u8]) -> Vec<u8> {
        let mut dec = ChunkedDecoder::new(u64::MAX);
        let mut data = Vec::new();
        let mut rest = msg;
        while !dec.is_done() {
            let p = dec.feed(rest).unwrap();
            data.extend_from_slice(&rest[p.data.clone()]);
            rest = &rest[p.consumed..];
        }
        data
    }

    #[test]
    fn extensions_and_trailers_are_dropped() {
        let msg = b"3;name=val;q=\"a b\"\r\nabc\r\n3 ; x\r\ndef\r\n0;last\r\nX-Sum: 123\r\nContent-Length: 9\r\n\r\nNEXT";
        let (out, consumed) = reencode(msg, msg.len()).unwrap();
        assert_eq!(out, b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n");
        assert_eq!(&msg[consumed..], b"NEXT");
    }

    #[test]
    fn sizes_are_rewritten_without_padding() {
        let (out, _) = reencode(b"00A\r\n0123456789\r\n000\r\n\r\n", 64).unwrap();
        assert_eq!(out, b"a\r\n0123456789\r\n0\r\n\r\n");
        let (out, _) = reencode(b"0\r\n\r\n", 64).unwrap();
        assert_eq!(out, b"0\r\n\r\n");
    }

    #[test]
    fn every_split_carries_the_same_body() {
        let msg = b"10;a=b\r\n0123456789abcdef\r\n1\r\nx\r\n0\r\nT: v\r\n\r\n";
        for step in 1..=msg.len() {
            let (out, consumed) = reencode(msg, step).unwrap();
            assert_eq!(consumed, msg.len());
            assert_eq!(data_of(&out), b"0123456789abcdefx", "step {step}");
            assert!(!out.contains(&b';'));
        }
        // Whole, the chunks are the client's.
        assert_eq!(
            reencode(msg, msg.len()).unwrap().0,
            b"10\r\n0123456789abcdef\r\n1\r\nx\r\n0\r\n\r\n"
        );
    }

    #[test]
    fn errors_pass_through() {
        assert_eq!(
            reencode(b"2;a b\r\nab\r\n0\r\n\r\n", 64),
            Err(ParseError::BadChunk)
        );
        let mut dec = ChunkedDecoder::new(3);
        let mut out = Vec::new();
        assert_eq!(
            rechunk(&mut dec, b"4\r\nabcd\r\n", &mut out),
            Err(ParseError::BodyTooLarge)
        );
    }

    #[test]
    fn partial_input_waits() {
        let mut dec = ChunkedDecoder::new(u64::MAX);
        let mut out = Vec::new();
        let r = rechunk(&mut dec, b"5;x\r\nhe", &mut out).unwrap();
        assert_eq!(
            r,
            Rechunked {
                consumed: 7,
                done: false
            }
        );
        assert_eq!(out, b"2\r\nhe\r\n");
        out.clear();
        let r = rechunk(&mut dec, b"llo\r\n0\r\n\r", &mut out).unwrap();
        assert_eq!(
            r,
            Rechunked {
                consumed: 9,
                done: false
            }
        );
        assert_eq!(out, b"3\r\nllo\r\n");
        out.clear();
        let r = rechunk(&mut dec, b"\nGET", &mut out).unwrap();
        assert_eq!(
            r,
            Rechunked {
                consumed: 1,
                done: true
            }
        );
        assert_eq!(out, b"0\r\n\r\n");
    }
}
