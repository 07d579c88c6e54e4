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
    /// BWS after the size or an extension value: only more whitespace or ";" may follow.
    SizeBws,
    /// After a ";": BWS, then the first byte of a `chunk-ext-name`.
    ExtNameStart,
    /// In a `chunk-ext-name` (a token).
    ExtName,
    /// BWS after a name: only "=" or ";" may follow.
    ExtNameBws,
    /// After "=": BWS, then a token or a quoted-string.
    ExtValueStart,
    /// In a token `chunk-ext-val`.
    ExtToken,
    /// Inside a quoted-string `chunk-ext-val`.
    ExtQuoted,
    /// After a "\\" in a quoted-string: one quoted-pair byte.
    ExtQuotedPair,
    /// After a quoted-string's closing quote.
    ExtQuotedEnd,
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
/// - extensions must match RFC 9112 §7.1.1 exactly:
///   `*( BWS ";" BWS token [ BWS "=" BWS ( token / quoted-string ) ] )`, so `1;` (no name),
///   `1;a b`, `1;a=` and an unterminated quoted-string are BadChunk; zgix interprets none
///   and forwards none (see [`crate::rechunk`]), but an origin parsing what a lenient proxy
///   let through is a desync. Lines are at most [`MAX_CHUNK_LINE`] and extensions at most
///   [`MAX_CHUNK_EXT_TOTAL`] per message;
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

    /// Chunk-data bytes the current chunk still owes: non-zero only while the scanner is
    /// inside a chunk's data (its size line passed every check, including `max_body`).
    /// RFC 9112 §7.1: the chunk-size alone frames those bytes, so a caller may move them
    /// without looking at them (splice them socket to socket) and then [`Self::skip_data`].
    pub fn data_owed(&self) -> u64 {
        match self.state {
            State::Data => self.remaining,
            _ => 0,
        }
    }

    /// Accounts for `n` bytes of the current chunk's data that the caller moved without
    /// feeding them, as if [`Self::feed`] had consumed them: at most [`Self::data_owed`]
    /// bytes are skipped, and how many is returned (0 outside a chunk's data, and after
    /// an error). Once the chunk's data is all skipped, the next feed must begin with the
    /// CRLF that closes it: the checks after data are the same as when it is fed.
    pub fn skip_data(&mut self, n: u64) -> u64 {
        let take = n.min(self.data_owed());
        self.remaining -= take;
        if take > 0 && self.remaining == 0 {
            self.state = State::DataCr;
        }
        take
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
                    b';' => self.ext_byte(State::ExtNameStart),
                    b' ' | b'\t' => self.ext_byte(State::SizeBws),
                    _ => Err(ParseError::BadChunk),
                }
            }
            State::SizeBws
            | State::ExtNameStart
            | State::ExtName
            | State::ExtNameBws
            | State::ExtValueStart
            | State::ExtToken
            | State::ExtQuoted
            | State::ExtQuotedPair
            | State::ExtQuotedEnd => self.ext_step(state, b),
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

    /// One byte of `chunk-ext`, RFC 9112 §7.1.1:
    ///
    /// ```text
    /// chunk-ext      = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )
    /// chunk-ext-name = token
    /// chunk-ext-val  = token / quoted-string
    /// ```
    ///
    /// Whitespace is allowed only where BWS is, so after a name it must lead to "=" or
    /// ";", after a value to ";"; the line ends only after a name or a value.
    fn ext_step(&mut self, state: State, b: u8) -> Result<State, ParseError> {
        use State::*;
        let ws = b == b' ' || b == b'\t';
        let next = match (state, b) {
            (SizeBws | ExtNameStart | ExtValueStart, _) if ws => state,
            (SizeBws, b';') => ExtNameStart,
            (ExtNameStart | ExtName, _) if is_tchar(b) => ExtName,
            (ExtName | ExtNameBws, _) if ws => ExtNameBws,
            (ExtName | ExtNameBws, b'=') => ExtValueStart,
            (ExtName | ExtNameBws | ExtToken | ExtQuotedEnd, b';') => ExtNameStart,
            (ExtValueStart, b'"') => ExtQuoted,
            (ExtValueStart | ExtToken, _) if is_tchar(b) => ExtToken,
            (ExtToken | ExtQuotedEnd, _) if ws => SizeBws,
            // quoted-string = DQUOTE *( qdtext / quoted-pair ) DQUOTE, and
            // quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text ) (RFC 9110 §5.6.4).
            (ExtQuoted, b'"') => ExtQuotedEnd,
            (ExtQuoted, b'\\') => ExtQuotedPair,
            (ExtQuoted, _) if is_field_vchar(b) => ExtQuoted,
            (ExtQuotedPair, _) if is_field_vchar(b) => ExtQuoted,
            (ExtName | ExtToken | ExtQuotedEnd, b'\r') => return Ok(SizeLf),
            _ => return Err(ParseError::BadChunk),
        };
        self.ext_byte(next)
    }

    /// Counts one extension byte and moves to `next`.
    fn ext_byte(&mut self, next: State) -> Result<State, ParseError> {
        self.ext_total += 1;
        if self.ext_total > MAX_CHUNK_EXT_TOTAL {
            return Err(ParseError::BadChunk);
        }
        self.size_line_byte(next)
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
mod tests;
