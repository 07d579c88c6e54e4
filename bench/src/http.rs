//! Minimal HTTP/1.1 framing shared by the origin and the load generator (RFC 9112).
//!
//! Both sides only need to find message boundaries on a keep-alive connection:
//! the end of the header block, the body length, and whether the peer wants the
//! connection closed. Everything else in the header block is skipped.

/// Largest header block either side accepts; a larger one is a framing error.
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// Largest chunk-size line (hex digits plus extensions) accepted in a chunked body.
const MAX_CHUNK_LINE: usize = 4096;

/// Why a message could not be framed. Small and `Copy`: each maps to one status
/// (origin) or one error counter (load).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Header block over [`MAX_HEAD_BYTES`].
    HeadTooLarge,
    /// Start line or a header line is malformed.
    BadHead,
    /// Content-Length unparsable or given twice with different values (RFC 9112 §6.3 step 5).
    BadLength,
    /// Transfer-Encoding other than a final `chunked` (RFC 9112 §6.3 step 4).
    BadEncoding,
    /// Malformed chunk framing (RFC 9112 §7.1).
    BadChunk,
}

/// How the body that follows a header block is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// Exactly this many bytes (0 for no body).
    Length(usize),
    /// Chunked transfer coding, RFC 9112 §7.1.
    Chunked,
    /// Until the connection closes (responses only, RFC 9112 §6.3 step 8).
    UntilClose,
}

/// What the framing layer needs from a parsed header block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Bytes of the header block including the final CRLFCRLF.
    pub len: usize,
    /// Request: HEAD method. Response: unused.
    pub is_head: bool,
    /// Response status code (0 for requests).
    pub status: u16,
    /// The message body delimitation.
    pub body: BodyKind,
    /// The sender asked to close after this message (Connection: close, or
    /// HTTP/1.0 without keep-alive, RFC 9112 §9.3).
    pub close: bool,
}

/// Position of the first CRLFCRLF in `buf`, i.e. the header block length minus 4.
///
/// Scans for `\n` with `position` (which LLVM vectorises well enough for the
/// short header blocks a benchmark sends) and then checks the three bytes before it.
pub fn find_head_end(buf: &[u8]) -> Option<usize> {
    let mut from = 3;
    while from < buf.len() {
        let i = from + buf[from..].iter().position(|&b| b == b'\n')?;
        if i >= 3 && &buf[i - 3..=i] == b"\r\n\r\n" {
            return Some(i - 3);
        }
        from = i + 1;
    }
    None
}

/// Parses a complete request header block. `Ok(None)` means incomplete input.
pub fn parse_request(buf: &[u8]) -> Result<Option<Head>, FrameError> {
    parse(buf, false)
}

/// Parses a complete response header block. `Ok(None)` means incomplete input.
/// `request_was_head` makes the body empty whatever the headers say (RFC 9112 §6.3 step 1).
pub fn parse_response(buf: &[u8], request_was_head: bool) -> Result<Option<Head>, FrameError> {
    let mut head = parse(buf, true)?;
    if let Some(h) = head.as_mut() {
        if request_was_head || h.status < 200 || h.status == 204 || h.status == 304 {
            h.body = BodyKind::Length(0);
        }
    }
    Ok(head)
}

fn parse(buf: &[u8], response: bool) -> Result<Option<Head>, FrameError> {
    let end = match find_head_end(buf) {
        Some(e) => e,
        None if buf.len() > MAX_HEAD_BYTES => return Err(FrameError::HeadTooLarge),
        None => return Ok(None),
    };
    if end + 4 > MAX_HEAD_BYTES {
        return Err(FrameError::HeadTooLarge);
    }
    let block = &buf[..end];
    let mut lines = block.split(|&b| b == b'\n').map(trim_cr);
    let start = lines.next().ok_or(FrameError::BadHead)?;
    let mut parts = start.splitn(3, |&b| b == b' ');
    let (first, second) = (parts.next().unwrap_or(b""), parts.next());
    let third = parts.next();

    let (version, status, is_head) = if response {
        // status-line = HTTP-version SP status-code SP [ reason-phrase ] (RFC 9112 §4)
        let code = second.ok_or(FrameError::BadHead)?;
        if code.len() != 3 || !code.iter().all(u8::is_ascii_digit) {
            return Err(FrameError::BadHead);
        }
        let status = code.iter().fold(0u16, |a, &d| a * 10 + u16::from(d - b'0'));
        (first, status, false)
    } else {
        // request-line = method SP request-target SP HTTP-version (RFC 9112 §3)
        let version = third.ok_or(FrameError::BadHead)?;
        if first.is_empty() || matches!(second, None | Some([])) {
            return Err(FrameError::BadHead);
        }
        (version, 0, first == b"HEAD")
    };
    let http10 = match version {
        b"HTTP/1.1" => false,
        b"HTTP/1.0" => true,
        _ => return Err(FrameError::BadHead),
    };

    let mut length: Option<usize> = None;
    let mut chunked = false;
    let mut saw_te = false;
    let mut close = http10;
    for line in lines {
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(FrameError::BadHead)?;
        let (name, value) = (&line[..colon], trim_ows(&line[colon + 1..]));
        // No whitespace between field name and colon (RFC 9112 §5.1): a smuggling vector.
        if name.is_empty() || name.iter().any(|b| b.is_ascii_whitespace()) {
            return Err(FrameError::BadHead);
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_decimal(value).ok_or(FrameError::BadLength)?;
            if length.is_some_and(|l| l != n) {
                return Err(FrameError::BadLength);
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            saw_te = true;
            // Only a final `chunked` is framed; anything after it is unframeable (§6.3 step 4).
            chunked = value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| trim_ows(last).eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|&b| b == b',').map(trim_ows) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && http10 {
                    close = false;
                }
            }
        }
    }
    let body = if saw_te {
        // Transfer-Encoding overrides Content-Length (§6.3 step 3); a request
        // carrying both is refused outright as a smuggling attempt.
        if !chunked {
            if response {
                BodyKind::UntilClose
            } else {
                return Err(FrameError::BadEncoding);
            }
        } else if !response && length.is_some() {
            return Err(FrameError::BadEncoding);
        } else {
            BodyKind::Chunked
        }
    } else if let Some(n) = length {
        BodyKind::Length(n)
    } else if response {
        BodyKind::UntilClose
    } else {
        BodyKind::Length(0)
    };
    Ok(Some(Head {
        len: end + 4,
        is_head,
        status,
        body,
        close,
    }))
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

fn parse_decimal(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 18 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        s.iter()
            .fold(0usize, |a, &d| a * 10 + usize::from(d - b'0')),
    )
}

/// Incremental chunked-body decoder (RFC 9112 §7.1). Feed it the bytes after
/// the header block; it reports how many it consumed and copies the chunk
/// data out when asked to.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Expecting a chunk-size line.
    #[default]
    Size,
    /// Inside chunk data with this many bytes left.
    Data(usize),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// After the last-chunk: trailer lines until an empty line.
    Trailer,
    /// The whole body has been read.
    Done,
}

impl ChunkedDecoder {
    /// Consumes as much of `buf` as possible. Returns bytes consumed; chunk data
    /// is appended to `out` when given. Check [`ChunkedDecoder::is_done`] afterwards.
    pub fn feed(&mut self, buf: &[u8], mut out: Option<&mut Vec<u8>>) -> Result<usize, FrameError> {
        let mut pos = 0;
        loop {
            match self.state {
                ChunkState::Done => return Ok(pos),
                ChunkState::Size => {
                    let Some(nl) = buf[pos..].iter().position(|&b| b == b'\n') else {
                        if buf.len() - pos > MAX_CHUNK_LINE {
                            return Err(FrameError::BadChunk);
                        }
                        return Ok(pos);
                    };
                    let line = trim_cr(&buf[pos..pos + nl]);
                    // chunk-size [ chunk-ext ]: extensions after ';' are ignored.
                    let hex = trim_ows(line.split(|&b| b == b';').next().unwrap_or(b""));
                    let size = parse_hex(hex).ok_or(FrameError::BadChunk)?;
                    pos += nl + 1;
                    self.state = if size == 0 {
                        ChunkState::Trailer
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    let take = left.min(buf.len() - pos);
                    if take == 0 {
                        return Ok(pos);
                    }
                    if let Some(o) = out.as_deref_mut() {
                        o.extend_from_slice(&buf[pos..pos + take]);
                    }
                    pos += take;
                    self.state = if take == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - take)
                    };
                }
                ChunkState::DataEnd => {
                    let rest = &buf[pos..];
                    if rest.len() < 2 {
                        if rest.first().is_some_and(|&b| b != b'\r') {
                            return Err(FrameError::BadChunk);
                        }
                        return Ok(pos);
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(FrameError::BadChunk);
                    }
                    pos += 2;
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailer => {
                    let Some(nl) = buf[pos..].iter().position(|&b| b == b'\n') else {
                        if buf.len() - pos > MAX_HEAD_BYTES {
                            return Err(FrameError::BadChunk);
                        }
                        return Ok(pos);
                    };
                    let empty = trim_cr(&buf[pos..pos + nl]).is_empty();
                    pos += nl + 1;
                    if empty {
                        self.state = ChunkState::Done;
                    }
                }
            }
        }
    }

    /// True once the last-chunk and trailer section have been consumed.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }
}

fn parse_hex(s: &[u8]) -> Option<usize> {
    // 15 hex digits keeps the value below 2^60: no overflow, and no origin here
    // would ever send a chunk that large.
    if s.is_empty() || s.len() > 15 {
        return None;
    }
    s.iter().try_fold(0usize, |a, &d| {
        let v = (d as char).to_digit(16)?;
        Some(a * 16 + v as usize)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_end_found_and_partial() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\n"), Some(14));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
        assert_eq!(find_head_end(b"\r\n\r\n"), Some(0));
        assert_eq!(find_head_end(b"\n\n\r\n\r\nx"), Some(2));
    }

    #[test]
    fn request_framing() {
        let h = parse_request(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyKind::Length(0));
        assert!(!h.close);
        let h = parse_request(b"POST /x HTTP/1.1\r\ncontent-length: 12\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyKind::Length(12));
        let h = parse_request(b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyKind::Chunked);
        let h = parse_request(b"GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(h.close);
        let h = parse_request(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.close);
        assert_eq!(parse_request(b"GET / HTTP/1.1\r\n"), Ok(None));
    }

    #[test]
    fn request_smuggling_refused() {
        let both = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(parse_request(both), Err(FrameError::BadEncoding));
        let two = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n";
        assert_eq!(parse_request(two), Err(FrameError::BadLength));
        let space = b"POST / HTTP/1.1\r\nContent-Length : 3\r\n\r\n";
        assert_eq!(parse_request(space), Err(FrameError::BadHead));
        let te = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n";
        assert_eq!(parse_request(te), Err(FrameError::BadEncoding));
    }

    #[test]
    fn response_framing() {
        let h = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false)
            .unwrap()
            .unwrap();
        assert_eq!((h.status, h.body, h.len), (200, BodyKind::Length(5), 38));
        let h = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true)
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyKind::Length(0));
        let h = parse_response(b"HTTP/1.1 204 No Content\r\n\r\n", false)
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyKind::Length(0));
        let h = parse_response(b"HTTP/1.1 429 Too Many\r\nConnection: close\r\n\r\n", false)
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.status, h.body, h.close),
            (429, BodyKind::UntilClose, true)
        );
    }

    #[test]
    fn chunked_whole_and_byte_by_byte() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        let n = d.feed(body, Some(&mut out)).unwrap();
        assert!(d.is_done());
        assert_eq!(&body[n..], b"NEXT");
        assert_eq!(out, b"hello world");

        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        let mut pending = Vec::new();
        let mut consumed = 0;
        for &b in body.iter() {
            pending.push(b);
            let n = d.feed(&pending, Some(&mut out)).unwrap();
            consumed += n;
            pending.drain(..n);
            if d.is_done() {
                break;
            }
        }
        assert!(d.is_done());
        assert_eq!(&body[consumed..], b"NEXT");
        assert_eq!(out, b"hello world");
    }

    #[test]
    fn chunked_errors() {
        let mut d = ChunkedDecoder::default();
        assert_eq!(d.feed(b"zz\r\n", None), Err(FrameError::BadChunk));
        let mut d = ChunkedDecoder::default();
        assert_eq!(d.feed(b"2\r\nabXY", None), Err(FrameError::BadChunk));
    }
}
