//! Frame-level facts zgix needs beside the codec: a scanner of the frames it sends (the 9-byte header of RFC 9113 §4.1; RST_STREAM §6.4 and GOAWAY §6.8 error codes), the counts of those codes, and the GOAWAY it writes itself when the preface is wrong (§3.4).

use std::cell::Cell;

pub(super) const RST_STREAM: u8 = 0x3;
const GOAWAY: u8 = 0x7;

/// GOAWAY, last stream 0, PROTOCOL_ERROR: the answer to a connection
/// that does not start with the preface (RFC 9113 §3.4).
pub(super) const GOAWAY_PROTOCOL_ERROR: [u8; 17] =
    [0, 0, 8, GOAWAY, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// RFC 9113 §7 error codes zgix tells apart.
pub(super) const PROTOCOL_ERROR: u32 = 0x1;
pub(super) const FLOW_CONTROL_ERROR: u32 = 0x3;
pub(super) const STREAM_CLOSED: u32 = 0x5;
pub(super) const FRAME_SIZE_ERROR: u32 = 0x6;
pub(super) const REFUSED_STREAM: u32 = 0x7;
pub(super) const CANCEL: u32 = 0x8;
pub(super) const COMPRESSION_ERROR: u32 = 0x9;
pub(super) const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Error codes sent since the counters last took them.
#[derive(Default)]
pub(crate) struct SentCodes {
    /// The GOAWAY's code, when one with an error was sent.
    pub goaway: Cell<Option<u32>>,
    /// RST_STREAM(REFUSED_STREAM) frames.
    pub refused: Cell<u64>,
    /// RST_STREAM frames for a client's error (PROTOCOL_ERROR and the like;
    /// not CANCEL, NO_ERROR or INTERNAL_ERROR, which are zgix's own ends).
    pub stream_errors: Cell<u64>,
}

pub(super) const DATA: u8 = 0x0;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const PRIORITY: u8 = 0x2;
pub(super) const SETTINGS: u8 = 0x4;
pub(super) const PING: u8 = 0x6;
pub(super) const WINDOW_UPDATE: u8 = 0x8;
pub(super) const CONTINUATION: u8 = 0x9;

/// A frame header (RFC 9113 §4.1).
#[derive(Copy, Clone, Debug)]
pub(super) struct Head {
    pub kind: u8,
    pub flags: u8,
    pub len: usize,
    pub id: u32,
}

/// Where the scanner is in the byte stream of frames.
#[derive(Default)]
pub(super) struct Scanner {
    head: [u8; 9],
    head_len: usize,
    /// Payload bytes of the current frame still to pass.
    left: usize,
    /// The first payload bytes of a RST_STREAM or GOAWAY.
    body: [u8; 8],
    body_len: usize,
    keep: usize,
}

impl Scanner {
    /// Passes over the start of `b`, up to the end of a frame header at
    /// most: the bytes used, and the header when it ended.
    pub(super) fn step(&mut self, b: &[u8]) -> (usize, Option<Head>) {
        if self.head_len < 9 {
            let n = (9 - self.head_len).min(b.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&b[..n]);
            self.head_len += n;
            if self.head_len < 9 {
                return (n, None);
            }
            let h = &self.head;
            self.left = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
            let head = Head {
                kind: h[3],
                flags: h[4],
                len: self.left,
                id: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
            };
            if self.left == 0 {
                self.head_len = 0;
            }
            return (n, Some(head));
        }
        let n = self.left.min(b.len());
        self.left -= n;
        if self.left == 0 {
            self.head_len = 0;
        }
        (n, None)
    }

    /// Whether the next byte starts a frame.
    pub(super) fn at_frame_start(&self) -> bool {
        self.head_len == 0
    }

    /// The type and flags of the frame whose payload the next byte is in.
    pub(super) fn in_payload(&self) -> Option<(u8, u8)> {
        (self.head_len == 9).then_some((self.head[3], self.head[4]))
    }

    pub fn feed(&mut self, mut b: &[u8], codes: &SentCodes) {
        while !b.is_empty() {
            if self.head_len < 9 {
                let n = (9 - self.head_len).min(b.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&b[..n]);
                self.head_len += n;
                b = &b[n..];
                if self.head_len == 9 {
                    let h = &self.head;
                    self.left = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                    self.keep = match h[3] {
                        RST_STREAM => 4,
                        GOAWAY => 8,
                        _ => 0,
                    }
                    .min(self.left);
                    self.body_len = 0;
                    if self.left == 0 {
                        self.head_len = 0;
                    }
                }
                continue;
            }
            let n = self.left.min(b.len());
            let want = self.keep.saturating_sub(self.body_len).min(n);
            self.body[self.body_len..self.body_len + want].copy_from_slice(&b[..want]);
            self.body_len += want;
            self.left -= n;
            b = &b[n..];
            if self.left == 0 {
                self.frame_done(codes);
                self.head_len = 0;
            }
        }
    }

    fn frame_done(&self, codes: &SentCodes) {
        let code = |at: usize| {
            u32::from_be_bytes([
                self.body[at],
                self.body[at + 1],
                self.body[at + 2],
                self.body[at + 3],
            ])
        };
        match self.head[3] {
            RST_STREAM if self.body_len == 4 => match code(0) {
                REFUSED_STREAM => codes.refused.set(codes.refused.get() + 1),
                0 | 0x2 | CANCEL => {}
                _ => codes.stream_errors.set(codes.stream_errors.get() + 1),
            },
            GOAWAY if self.body_len == 8 => {
                let c = code(4);
                if c != 0 {
                    codes.goaway.set(Some(c));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_found_across_split_writes() {
        let mut out = Vec::new();
        // SETTINGS (empty), a DATA of 5, RST_STREAM REFUSED, RST_STREAM
        // PROTOCOL_ERROR, RST_STREAM CANCEL, GOAWAY ENHANCE_YOUR_CALM.
        out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&[0, 0, 5, 0, 1, 0, 0, 0, 1, b'h', b'e', b'l', b'l', b'o']);
        out.extend_from_slice(&[0, 0, 4, 3, 0, 0, 0, 0, 3, 0, 0, 0, 7]);
        out.extend_from_slice(&[0, 0, 4, 3, 0, 0, 0, 0, 5, 0, 0, 0, 1]);
        out.extend_from_slice(&[0, 0, 4, 3, 0, 0, 0, 0, 7, 0, 0, 0, 8]);
        out.extend_from_slice(&[0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0xb]);
        for step in [1, 2, 3, 7, out.len()] {
            let codes = SentCodes::default();
            let mut s = Scanner::default();
            for c in out.chunks(step) {
                s.feed(c, &codes);
            }
            assert_eq!(codes.refused.get(), 1, "step {step}");
            assert_eq!(codes.stream_errors.get(), 1, "step {step}");
            assert_eq!(codes.goaway.get(), Some(ENHANCE_YOUR_CALM), "step {step}");
        }
    }
}
