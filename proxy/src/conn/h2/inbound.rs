//! What zgix checks in the frames a client sends before the codec sees them: PING and SETTINGS floods (CVE-2019-9512, CVE-2019-9515), frames of a wrong fixed length (RFC 9113 §6.3–§6.9: `FRAME_SIZE_ERROR`), an initial window over 2^31-1 (§6.5.2: `FLOW_CONTROL_ERROR`), DATA or HEADERS on a stream the client already ended (§5.1: `STREAM_CLOSED`), and header blocks ([`super::hpack_scan`]: `COMPRESSION_ERROR`, and forbidden field names made a stream error); the codec (h2 0.4) answers all but the floods with `PROTOCOL_ERROR` on the connection.

use std::time::{Duration, Instant};

use super::frames::{
    Head, Scanner, COMPRESSION_ERROR, CONTINUATION, DATA, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR,
    HEADERS, PING, PRIORITY, RST_STREAM, SETTINGS, STREAM_CLOSED, WINDOW_UPDATE,
};
use super::hpack_scan::{HpackScan, Undecodable};

/// PING or SETTINGS frames (not acknowledgements) a client may send within
/// one second; more is a flood, answered with GOAWAY `ENHANCE_YOUR_CALM`.
pub const FLOOD_FRAMES: u32 = 100;

/// Streams the client ended that are remembered, the latest ones: a frame
/// on an older one is the codec's to judge.
const ENDED_KEPT: usize = 16;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;
const MAX_FRAME: usize = 16_384;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

/// Which flood a client's frames were.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Flood {
    Settings,
    Ping,
}

/// Why the connection ends on what the client sent.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Flood(Flood),
    /// A connection error with this code (RFC 9113 §7).
    Malformed(u32),
}

/// The client's frames so far, as far as the checks need them.
pub(crate) struct Inbound {
    /// Bytes of the preface still to pass (they are not a frame).
    preface: usize,
    scan: Scanner,
    window: Option<Instant>,
    pings: u32,
    settings: u32,
    /// The SETTINGS parameter being read (6 bytes each, §6.5.1).
    param: [u8; 6],
    param_len: usize,
    /// Streams the client ended (END_STREAM or RST_STREAM), a ring.
    ended: [u32; ENDED_KEPT],
    next: usize,
    /// The highest stream the client opened: HEADERS on one not above it
    /// are trailers.
    opened: u32,
    hpack: HpackScan,
    frag: Frag,
    /// Streams whose header block was malformed (RFC 9113 §8.1.1), for the
    /// connection to reset; taken after each `feed`.
    pub marked: Vec<u32>,
}

/// Where the current HEADERS or CONTINUATION payload is (§6.2, §6.10).
#[derive(Default)]
struct Frag {
    /// A header block is being followed.
    on: bool,
    id: u32,
    /// The Pad Length byte is still to come, then `prio` bytes of priority.
    pad_pending: bool,
    prio: u8,
    pad: usize,
    /// Payload bytes of the frame still to come.
    left: usize,
    /// The frame has END_HEADERS.
    end: bool,
}

impl Default for Inbound {
    fn default() -> Self {
        Inbound {
            preface: 24,
            scan: Scanner::default(),
            window: None,
            pings: 0,
            settings: 0,
            param: [0; 6],
            param_len: 0,
            ended: [0; ENDED_KEPT],
            next: 0,
            opened: 0,
            hpack: HpackScan::default(),
            frag: Frag::default(),
            marked: Vec::new(),
        }
    }
}

impl Inbound {
    /// Scans bytes the client sent, at `now`. A verdict comes with how many
    /// of the bytes the codec may still have: none of a refused frame.
    pub fn feed(&mut self, b: &mut [u8], now: Instant) -> Option<(Verdict, usize)> {
        let skip = self.preface.min(b.len());
        self.preface -= skip;
        let mut at = skip;
        // Where the current frame starts in `b` (0 when before it).
        let mut start = 0;
        let mut found = None;
        while at < b.len() {
            if self.scan.at_frame_start() {
                start = at;
            }
            let payload = self.scan.in_payload();
            let (used, head) = self.scan.step(&b[at..]);
            if let Some((SETTINGS, flags)) = payload {
                if flags & ACK == 0 && self.settings_params(&b[at..at + used]) {
                    return Some((Verdict::Malformed(FLOW_CONTROL_ERROR), start));
                }
            }
            if let (Some((HEADERS | CONTINUATION, _)), true) = (payload, self.frag.on) {
                if self.block_bytes(&mut b[at..at + used]).is_err() {
                    return Some((Verdict::Malformed(COMPRESSION_ERROR), start));
                }
            }
            at += used;
            let Some(h) = head else { continue };
            if let Some(code) = self.judge(h) {
                return Some((Verdict::Malformed(code), start));
            }
            if self.block_start(h).is_err() {
                return Some((Verdict::Malformed(COMPRESSION_ERROR), start));
            }
            if let Some(f) = self.count(h, now) {
                found = Some((Verdict::Flood(f), b.len()));
            }
        }
        found
    }

    /// A frame header: a HEADERS starts a header block, a CONTINUATION of
    /// it goes on with it; any other frame leaves it to the codec.
    fn block_start(&mut self, h: Head) -> Result<(), Undecodable> {
        let f = &mut self.frag;
        match h.kind {
            // Over SETTINGS_MAX_FRAME_SIZE (zgix keeps the default, RFC 9113
            // §6.5.2): the codec's FRAME_SIZE_ERROR, not a block to read.
            _ if h.len > MAX_FRAME => f.on = false,
            HEADERS if h.id % 2 == 1 => {
                let trailers = h.id <= self.opened;
                self.opened = self.opened.max(h.id);
                self.hpack.start_block(trailers);
                *f = Frag {
                    on: true,
                    id: h.id,
                    pad_pending: h.flags & PADDED != 0,
                    prio: if h.flags & PRIORITY_FLAG != 0 { 5 } else { 0 },
                    pad: 0,
                    left: h.len,
                    end: h.flags & END_HEADERS != 0,
                };
            }
            // No padding or priority in a CONTINUATION (§6.10).
            CONTINUATION if f.on && !f.end && h.id == f.id => {
                *f = Frag {
                    on: true,
                    id: h.id,
                    left: h.len,
                    end: h.flags & END_HEADERS != 0,
                    ..Frag::default()
                };
            }
            // Out of place or on a stream the codec refuses: its error.
            _ => f.on = false,
        }
        if self.frag.on && h.len == 0 {
            return self.block_bytes(&mut []);
        }
        Ok(())
    }

    /// Payload bytes of the frame in `frag`, the last of them when it ends.
    fn block_bytes(&mut self, b: &mut [u8]) -> Result<(), Undecodable> {
        let f = &mut self.frag;
        let mut i = 0;
        if f.pad_pending && !b.is_empty() {
            f.pad = usize::from(b[0]);
            f.pad_pending = false;
            i = 1;
        }
        let p = usize::from(f.prio).min(b.len() - i);
        f.prio -= p as u8;
        i += p;
        // Of the payload from `b[i]` on, the last `pad` bytes are padding.
        let block = (f.left - i).saturating_sub(f.pad).min(b.len() - i);
        f.left -= b.len();
        let (done, id) = (f.left == 0 && f.end, f.id);
        if f.left == 0 {
            f.on = !f.end;
        }
        self.hpack.feed(&mut b[i..i + block])?;
        if done && self.hpack.end_block()? {
            self.marked.push(id);
        }
        Ok(())
    }

    /// Reads SETTINGS parameters; whether one sets the initial window over
    /// 2^31-1 (§6.5.2).
    fn settings_params(&mut self, mut b: &[u8]) -> bool {
        while !b.is_empty() {
            let n = (6 - self.param_len).min(b.len());
            self.param[self.param_len..self.param_len + n].copy_from_slice(&b[..n]);
            self.param_len += n;
            b = &b[n..];
            if self.param_len == 6 {
                self.param_len = 0;
                let p = &self.param;
                let id = u16::from_be_bytes([p[0], p[1]]);
                let v = u32::from_be_bytes([p[2], p[3], p[4], p[5]]);
                if id == SETTINGS_INITIAL_WINDOW_SIZE && v > 0x7fff_ffff {
                    return true;
                }
            }
        }
        false
    }

    /// A connection error's code for a frame header, if it is one.
    fn judge(&mut self, h: Head) -> Option<u32> {
        let fixed = match h.kind {
            PING => Some(8),
            RST_STREAM | WINDOW_UPDATE => Some(4),
            PRIORITY => Some(5),
            SETTINGS if h.flags & ACK != 0 => Some(0),
            _ => None,
        };
        if fixed.is_some_and(|n| n != h.len) || (h.kind == SETTINGS && !h.len.is_multiple_of(6)) {
            return Some(FRAME_SIZE_ERROR);
        }
        self.param_len = 0;
        match h.kind {
            DATA | HEADERS if h.id != 0 && h.id % 2 == 1 => self.stream_frame(h),
            RST_STREAM => {
                self.ended(h.id);
                None
            }
            _ => None,
        }
    }

    /// DATA or HEADERS on stream `h.id`: `STREAM_CLOSED` when the client
    /// already ended it (END_STREAM or RST_STREAM, §5.1).
    fn stream_frame(&mut self, h: Head) -> Option<u32> {
        if self.ended.contains(&h.id) {
            return Some(STREAM_CLOSED);
        }
        if h.flags & END_STREAM != 0 {
            self.ended(h.id);
        }
        None
    }

    fn ended(&mut self, id: u32) {
        if id != 0 && !self.ended.contains(&id) {
            self.ended[self.next] = id;
            self.next = (self.next + 1) % ENDED_KEPT;
        }
    }

    /// Counts PING and SETTINGS frames in the current second; a flood once
    /// past the limit.
    fn count(&mut self, h: Head, now: Instant) -> Option<Flood> {
        if h.flags & ACK != 0 || (h.kind != PING && h.kind != SETTINGS) {
            return None;
        }
        let w = *self.window.get_or_insert(now);
        if now.saturating_duration_since(w) >= Duration::from_secs(1) {
            self.window = Some(now);
            self.pings = 0;
            self.settings = 0;
        }
        let (n, what) = if h.kind == PING {
            (&mut self.pings, Flood::Ping)
        } else {
            (&mut self.settings, Flood::Settings)
        };
        *n += 1;
        (*n > FLOOD_FRAMES).then_some(what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(i: &mut Inbound, b: &[u8], t: Instant) -> Option<(Verdict, usize)> {
        i.feed(&mut b.to_vec(), t)
    }

    #[test]
    fn a_ping_flood_is_seen_past_the_limit_and_acks_are_not_counted() {
        let t = std::time::Instant::now();
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend_from_slice(&[0, 0, 0, SETTINGS, 0, 0, 0, 0, 0]);
        for _ in 0..FLOOD_FRAMES * 2 {
            // PING acknowledgements: not a flood.
            bytes.extend_from_slice(&[0, 0, 8, PING, 1, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        }
        let mut i = Inbound::default();
        assert_eq!(feed(&mut i, &bytes, t), None);
        let ping = [0, 0, 8, PING, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        for k in 0..FLOOD_FRAMES {
            assert_eq!(feed(&mut i, &ping[..5], t), None, "ping {k}");
            assert_eq!(feed(&mut i, &ping[5..], t), None, "ping {k}");
        }
        assert_eq!(
            feed(&mut i, &ping, t),
            Some((Verdict::Flood(Flood::Ping), 17))
        );
        // A second later the count starts again.
        let later = t + std::time::Duration::from_secs(1);
        assert_eq!(feed(&mut i, &ping, later), None);
    }

    #[test]
    fn a_refused_frame_is_cut_from_what_the_codec_gets() {
        let t = Instant::now();
        let good = [0, 0, 8, PING, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let mut b = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        b.extend_from_slice(&good);
        let cut = b.len();
        b.extend_from_slice(&[0, 0, 6, PING, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6]);
        let mut i = Inbound::default();
        let want = Some((Verdict::Malformed(FRAME_SIZE_ERROR), cut));
        assert_eq!(feed(&mut i, &b, t), want);
        // SETTINGS_INITIAL_WINDOW_SIZE of 2^31 split across reads: the
        // frame's bytes in the read that completes it are cut.
        let mut i = Inbound::default();
        assert_eq!(feed(&mut i, &b[..24], t), None);
        let s = [0, 0, 6, SETTINGS, 0, 0, 0, 0, 0, 0, 4, 0x80, 0, 0, 0];
        assert_eq!(feed(&mut i, &s[..11], t), None);
        let want = Some((Verdict::Malformed(FLOW_CONTROL_ERROR), 0));
        assert_eq!(feed(&mut i, &s[11..], t), want);
        // DATA on a stream the client ended, then not on an open one.
        let mut i = Inbound::default();
        assert_eq!(feed(&mut i, &b[..24], t), None);
        let ended = [0, 0, 0, HEADERS, 0x5, 0, 0, 0, 1];
        let open = [0, 0, 0, HEADERS, 0x4, 0, 0, 0, 3];
        assert_eq!(feed(&mut i, &[ended, open].concat(), t), None);
        assert_eq!(feed(&mut i, &[0, 0, 0, DATA, 0, 0, 0, 0, 3], t), None);
        let want = Some((Verdict::Malformed(STREAM_CLOSED), 0));
        assert_eq!(feed(&mut i, &[0, 0, 0, DATA, 0, 0, 0, 0, 1], t), want);
    }

    #[test]
    fn header_blocks_are_followed_through_padding_priority_and_continuation() {
        let t = Instant::now();
        let mut i = Inbound::default();
        assert_eq!(feed(&mut i, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", t), None);
        // HEADERS, PADDED | PRIORITY, 2 bytes of padding: `:method GET`;
        // CONTINUATION: a literal named `X-Up`, END_HEADERS.
        let block = [2, 0, 0, 0, 0, 16, 0x82, 0, 0];
        let mut frames = vec![0, 0, block.len() as u8, HEADERS, 0x8 | 0x20, 0, 0, 0, 1];
        frames.extend_from_slice(&block);
        let rest = [0, 4, b'X', b'-', b'U', b'p', 1, b'1'];
        frames.extend_from_slice(&[0, 0, 8, CONTINUATION, 0x4, 0, 0, 0, 1]);
        frames.extend_from_slice(&rest);
        let mut b = frames.clone();
        assert_eq!(i.feed(&mut b, t), None);
        assert_eq!(i.marked, [1], "the name was whole in this read");
        assert!(
            b.ends_with(&[0, 4, b'a', b'a', b'a', b'a', 1, b'1']),
            "{b:?}"
        );
        // The same name split across two reads: the codec's, not marked.
        let mut i = Inbound::default();
        let mut b = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        b.extend_from_slice(&frames);
        let (a, c) = b.split_at_mut(24 + 9 + block.len() + 9 + 3);
        assert_eq!(i.feed(a, t), None);
        assert_eq!(i.feed(c, t), None);
        assert!(i.marked.is_empty());
        // A block cut inside an integer: COMPRESSION_ERROR, the frame cut.
        let cut = [0, 0, 2, HEADERS, 0x5, 0, 0, 0, 3, 0xff, 0xff];
        assert_eq!(
            feed(&mut i, &cut, t),
            Some((Verdict::Malformed(COMPRESSION_ERROR), 0))
        );
    }
}
