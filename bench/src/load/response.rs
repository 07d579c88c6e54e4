//! Reading one HTTP/1.1 response at a time off a load-generator connection: the head, then the body by its framing (length, chunked, until close).

use super::tls::Conn;
use super::Failure;
use crate::http::{self, BodyKind, ChunkedDecoder, FrameError};
use futures_lite::AsyncReadExt;
use std::io;

/// Reads responses off one connection, keeping any bytes past the end of a
/// response for the next one.
pub(super) struct ResponseReader {
    buf: Vec<u8>,
    pos: usize,
    filled: usize,
}

impl ResponseReader {
    pub(super) fn new() -> Self {
        ResponseReader {
            buf: vec![0; http::MAX_HEAD_BYTES + 4096],
            pos: 0,
            filled: 0,
        }
    }

    pub(super) fn reset(&mut self) {
        self.pos = 0;
        self.filled = 0;
    }

    /// Reads more bytes; EOF is an error because a response is still due.
    async fn fill(&mut self, s: &mut Conn) -> Result<usize, Failure> {
        if self.pos == self.filled {
            self.pos = 0;
            self.filled = 0;
        } else if self.filled == self.buf.len() {
            if self.pos == 0 {
                return Err(Failure::Parse);
            }
            self.buf.copy_within(self.pos..self.filled, 0);
            self.filled -= self.pos;
            self.pos = 0;
        }
        let n = s
            .read(&mut self.buf[self.filled..])
            .await
            .map_err(Failure::Read)?;
        self.filled += n;
        Ok(n)
    }

    pub(super) async fn read_response(
        &mut self,
        s: &mut Conn,
    ) -> Result<(u16, bool, u64), Failure> {
        let mut bytes = 0u64;
        let head = loop {
            match http::parse_response(&self.buf[self.pos..self.filled], false) {
                Ok(Some(h)) => break h,
                Ok(None) => {}
                Err(FrameError::HeadTooLarge | FrameError::BadHead)
                | Err(FrameError::BadLength | FrameError::BadEncoding | FrameError::BadChunk) => {
                    return Err(Failure::Parse)
                }
            }
            let n = self.fill(s).await?;
            if n == 0 {
                return Err(Failure::Read(io::ErrorKind::UnexpectedEof.into()));
            }
            bytes += n as u64;
        };
        self.pos += head.len;
        match head.body {
            BodyKind::Length(mut left) => loop {
                let take = left.min(self.filled - self.pos);
                self.pos += take;
                left -= take;
                if left == 0 {
                    break;
                }
                let n = self.fill(s).await?;
                if n == 0 {
                    return Err(Failure::Read(io::ErrorKind::UnexpectedEof.into()));
                }
                bytes += n as u64;
            },
            BodyKind::Chunked => {
                let mut dec = ChunkedDecoder::default();
                loop {
                    let n = dec
                        .feed(&self.buf[self.pos..self.filled], None)
                        .map_err(|_| Failure::Parse)?;
                    self.pos += n;
                    if dec.is_done() {
                        break;
                    }
                    let n = self.fill(s).await?;
                    if n == 0 {
                        return Err(Failure::Read(io::ErrorKind::UnexpectedEof.into()));
                    }
                    bytes += n as u64;
                }
            }
            BodyKind::UntilClose => loop {
                self.pos = self.filled;
                if self.fill(s).await? == 0 {
                    return Ok((head.status, true, bytes));
                }
                bytes = bytes.saturating_add((self.filled - self.pos) as u64);
            },
        }
        Ok((head.status, head.close, bytes))
    }
}
