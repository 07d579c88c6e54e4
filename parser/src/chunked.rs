//! Streaming chunked transfer coding scanner (RFC 9112 §7.1) with size limits.

use std::ops::Range;

use crate::error::ParseError;
use crate::syntax::{hex_value, is_field_vchar, is_tchar};

/// Longest chunk-size line (size, extensions, CRLF excluded) or trailer field line. RFC 9112
/// §7.1.1 lets a server bound extension length; 4 KiB is ample for any real extension and
/// keeps a hostile peer from streaming framing with no data in it.
pub const MAX_CHUNK_LINE: usize = 4096;

/// Most chunk-extension bytes over one message. Without it a client could send 4 KiB of
/// extensions per 1-byte chunk, 4096x the body limit in framing. hyper uses the same 16 KiB.
pub const MAX_CHUNK_EXT_TOTAL: u64 = 16 * 1024;

/// Most trailer-section bytes (field lines with their CRLFs) per message: trailers are
/// forwarded, so they are bounded like a header section, not left to stream forever.
pub const MAX_TRAILER_BYTES: u64 = 16 * 1024;

/// At most 16 hex digits: any u64 size fits, and leading zeros cannot pad a line forever.
const MAX_SIZE_DIGITS: u8 = 16;

/// Where the scanner is within the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// In `chunk-size`; `digits` so far.
    Size,
    /// BWS after the size: only more whitespace or ";" may follow.
    SizeBws,
    /// In chunk extensions, up to the CR.
    Ext,
    /// The CR of the size line is in; LF must follow.
    SizeLf,
    /// `remaining` bytes of chunk-data to go.
    Data,
    /// Chunk-data is done; CR must follow.
    DataCr,
    /// LF after chunk-data.
    DataLf,
    /// At the start of a trailer field line or of the final CRLF.
    TrailerStart,
    /// In a trailer field name.
    TrailerName,
    /// In a trailer field value, up to the CR.
    TrailerValue,
    /// LF ending a trailer field line.
    TrailerLf,
    /// LF of the final CRLF.
    FinalLf,
    /// The whole message has been consumed.
    Done,
    /// An error was returned; every later feed returns it again.
    Failed(ParseError),
}

/// Validating scanner for a chunked body, fed the bytes as they arrive.
///
/// It checks the framing byte by byte, so the proxy can forward the raw bytes it consumed
/// (or only the data ranges) knowing they form a valid message that ends exactly where zgix
/// thinks it does. Strictness choices, each a place where lenient parsers have disagreed and
/// been used for request smuggling:
/// - every line ends in CRLF; a bare LF (or a CR not followed by LF) is BadChunk;
/// - chunk-size is 1 to 16 hex digits; whitespace after it is allowed only before a ";"
///   (BWS in the chunk-ext grammar, RFC 9112 §7.1.1);
/// - extension bytes must be field-value characters, lines are at most [`MAX_CHUNK_LINE`]
///   and extensions at most [`MAX_CHUNK_EXT_TOTAL`] per message;
/// - trailer lines (RFC 9112 §7.1.2) must be `token ":" value` with no obs-fold, at most
///   [`MAX_CHUNK_LINE`] each and [`MAX_TRAILER_BYTES`] together;
/// - the sum of chunk sizes over the message is checked against `max_body` when each size
///   line completes, before its data is read (BodyTooLarge).
#[derive(Clone, Debug)]
pub struct ChunkedDecoder {
    state: State,
    max_body: u64,
    /// Value of the size being read.
    size: u64,
    /// Hex digits read for `size`.
    digits: u8,
    /// Data bytes left in the current chunk.
    remaining: u64,
    /// Sum of chunk sizes so far.
    total: u64,
    /// Bytes of the current size or trailer line.
    line: usize,
    /// Extension bytes over the message.
    ext_total: u64,
    /// Trailer bytes over the message.
    trailer_total: u64,
}

/// What one [`ChunkedDecoder::feed`] call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of the input consumed (framing and data); the rest is for the next call, or,
    /// once `done`, belongs to whatever follows the message.
    pub consumed: usize,
    /// The chunk-data bytes within `input[..consumed]`; empty when none were consumed.
    pub data: Range<usize>,
    /// The last chunk, trailer section and final CRLF have all been consumed.
    pub done: bool,
}

impl ChunkedDecoder {
    /// A decoder that refuses more than `max_body` bytes of chunk data (`u64::MAX` for
    /// responses, which zgix streams unbounded).
    pub fn new(max_body: u64) -> Self {
        ChunkedDecoder {
            state: State::Size,
            max_body,
            size: 0,
            digits: 0,
            remaining: 0,
            total: 0,
            line: 0,
            ext_total: 0,
            trailer_total: 0,
        }
    }

    /// Forgets the current message so the decoder can scan the next one; keeps `max_body`.
    pub fn reset(&mut self) {
        *self = ChunkedDecoder::new(self.max_body);
    }

    /// Whether the whole message has been consumed.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Chunk-data bytes declared so far (the sizes of every chunk begun).
    pub fn body_len(&self) -> u64 {
        self.total
    }

    /// Consumes a prefix of `input`.
    ///
    /// Framing is consumed as far as possible, but at most one contiguous run of chunk-data
    /// is returned per call: when a second run would start, the call returns before it, so
    /// callers loop until the input is used up (a call with data left never returns
    /// `consumed == 0` unless `done`). Never consumes past the end of the message. After an
    /// error, every later call returns the same error.
    pub fn feed(&mut self, input: &[u8]) -> Result<Progress, ParseError> {
        let mut i = 0;
        let mut data = 0..0;
        while i < input.len() {
            let b = input[i];
            let next = match self.state {
                State::Done => break,
                State::Failed(e) => return Err(e),
                State::Data => {
                    if !data.is_empty() {
                        // One data run per call.
                        break;
                    }
                    let avail = (input.len() - i) as u64;
                    let take = self.remaining.min(avail) as usize;
                    data = i..i + take;
                    self.remaining -= take as u64;
                    i += take;
                    if self.remaining == 0 {
                        self.state = State::DataCr;
                    }
                    continue;
                }
                state => self.step(state, b),
            };
            i += 1;
            match next {
                Ok(State::Done) => {
                    self.state = State::Done;
                    break;
                }
                Ok(state) => self.state = state,
                Err(e) => {
                    self.state = State::Failed(e);
                    return Err(e);
                }
            }
        }
        if let State::Failed(e) = self.state {
            return Err(e);
        }
        Ok(Progress {
            consumed: i,
            data,
            done: self.state == State::Done,
        })
    }

    /// One framing byte (any state but Data, Done and Failed).
    fn step(&mut self, state: State, b: u8) -> Result<State, ParseError> {
        match state {
            // chunk = chunk-size [ chunk-ext ] CRLF chunk-data CRLF; chunk-size = 1*HEXDIG.
            State::Size => {
                if let Some(d) = hex_value(b) {
                    if self.digits == MAX_SIZE_DIGITS {
                        return Err(ParseError::BadChunk);
                    }
                    self.digits += 1;
                    self.size = (self.size << 4) | u64::from(d);
                    return self.size_line_byte(State::Size);
                }
                if self.digits == 0 {
                    return Err(ParseError::BadChunk);
                }
                match b {
                    b'\r' => Ok(State::SizeLf),
                    b';' => self.ext_byte(),
                    b' ' | b'\t' => self.ext_byte().map(|_| State::SizeBws),
                    _ => Err(ParseError::BadChunk),
                }
            }
            // chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] ):
            // whitespace after the size must lead to a ";".
            State::SizeBws => match b {
                b' ' | b'\t' => self.ext_byte().map(|_| State::SizeBws),
                b';' => self.ext_byte(),
                _ => Err(ParseError::BadChunk),
            },
            // Extension names and values are tokens or quoted strings; zgix does not
            // interpret them, it only bounds them and refuses control bytes.
            State::Ext => match b {
                b'\r' => Ok(State::SizeLf),
                _ if is_field_vchar(b) => self.ext_byte(),
                _ => Err(ParseError::BadChunk),
            },
            State::SizeLf => {
                if b != b'\n' {
                    return Err(ParseError::BadChunk);
                }
                let size = self.size;
                self.size = 0;
                self.digits = 0;
                self.line = 0;
                if size == 0 {
                    // last-chunk: the trailer section follows (RFC 9112 §7.1).
                    return Ok(State::TrailerStart);
                }
                self.total = match self.total.checked_add(size) {
                    Some(t) if t <= self.max_body => t,
                    _ => return Err(ParseError::BodyTooLarge),
                };
                self.remaining = size;
                Ok(State::Data)
            }
            State::DataCr => expect(b, b'\r', State::DataLf),
            State::DataLf => expect(b, b'\n', State::Size),
            // trailer-section = *( field-line CRLF ) (RFC 9112 §7.1.2); an empty line ends it.
            State::TrailerStart => match b {
                b'\r' => Ok(State::FinalLf),
                // A line starting with whitespace would be obs-fold, refused like in heads.
                _ if is_tchar(b) => self.trailer_byte(State::TrailerName),
                _ => Err(ParseError::BadChunk),
            },
            // field-line = field-name ":" OWS field-value OWS, no space before the colon.
            State::TrailerName => match b {
                b':' => self.trailer_byte(State::TrailerValue),
                _ if is_tchar(b) => self.trailer_byte(State::TrailerName),
                _ => Err(ParseError::BadChunk),
            },
            State::TrailerValue => match b {
                b'\r' => self.trailer_byte(State::TrailerLf),
                _ if is_field_vchar(b) => self.trailer_byte(State::TrailerValue),
                _ => Err(ParseError::BadChunk),
            },
            State::TrailerLf => {
                self.line = 0;
                if b != b'\n' {
                    return Err(ParseError::BadChunk);
                }
                self.trailer_total += 1;
                Ok(State::TrailerStart)
            }
            State::FinalLf => expect(b, b'\n', State::Done),
            State::Data | State::Done | State::Failed(_) => Ok(state),
        }
    }

    /// Counts one byte of the size line.
    fn size_line_byte(&mut self, next: State) -> Result<State, ParseError> {
        self.line += 1;
        if self.line > MAX_CHUNK_LINE {
            return Err(ParseError::BadChunk);
        }
        Ok(next)
    }

    /// Counts one extension byte (and moves to or stays in [`State::Ext`]).
    fn ext_byte(&mut self) -> Result<State, ParseError> {
        self.ext_total += 1;
        if self.ext_total > MAX_CHUNK_EXT_TOTAL {
            return Err(ParseError::BadChunk);
        }
        self.size_line_byte(State::Ext)
    }

    /// Counts one trailer byte.
    fn trailer_byte(&mut self, next: State) -> Result<State, ParseError> {
        self.line += 1;
        self.trailer_total += 1;
        if self.line > MAX_CHUNK_LINE || self.trailer_total > MAX_TRAILER_BYTES {
            return Err(ParseError::BadChunk);
        }
        Ok(next)
    }
}

fn expect(b: u8, want: u8, next: State) -> Result<State, ParseError> {
    if b == want {
        Ok(next)
    } else {
        Err(ParseError::BadChunk)
    }
}

#[cfg(test)]
mod tests {
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
        let msg =
            b"3;name=val;q=\"a b\"\r\nabc\r\n3 ; x\r\ndef\r\n0;last\r\nX-Sum: 123\r\nY:\r\n\r\n";
        let (data, consumed) = decode(u64::MAX, msg).unwrap();
        assert_eq!(data, b"abcdef");
        assert_eq!(consumed, msg.len());
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
}
