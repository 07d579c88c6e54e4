//! HTTP/2 frames (RFC 9113 §4, §6): the 9-byte frame header, frame types and flags, error codes (§7), settings (§6.5.2), and writers for the frames the server sends.

/// A stream identifier (31 bits, RFC 9113 §5.1.1).
pub type StreamId = u32;

/// The connection preface a client sends first (§3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types (§6).
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

/// Flags (§6).
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY_FLAG: u8 = 0x20;

/// Setting identifiers (§6.5.2).
pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// The largest window and window increment (§6.9.1).
pub const MAX_WINDOW: i64 = 0x7fff_ffff;
/// SETTINGS_MAX_FRAME_SIZE's initial value and lower bound, and its upper bound (§6.5.2).
pub const MIN_MAX_FRAME_SIZE: u32 = 16_384;
pub const MAX_MAX_FRAME_SIZE: u32 = 16_777_215;
/// The initial flow-control window of streams and the connection (§6.9.2).
pub const DEFAULT_WINDOW: u32 = 65_535;

/// An error code (RFC 9113 §7); unknown codes are kept as they came.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    pub const NO_ERROR: ErrorCode = ErrorCode(0x0);
    pub const PROTOCOL_ERROR: ErrorCode = ErrorCode(0x1);
    pub const INTERNAL_ERROR: ErrorCode = ErrorCode(0x2);
    pub const FLOW_CONTROL_ERROR: ErrorCode = ErrorCode(0x3);
    pub const SETTINGS_TIMEOUT: ErrorCode = ErrorCode(0x4);
    pub const STREAM_CLOSED: ErrorCode = ErrorCode(0x5);
    pub const FRAME_SIZE_ERROR: ErrorCode = ErrorCode(0x6);
    pub const REFUSED_STREAM: ErrorCode = ErrorCode(0x7);
    pub const CANCEL: ErrorCode = ErrorCode(0x8);
    pub const COMPRESSION_ERROR: ErrorCode = ErrorCode(0x9);
    pub const CONNECT_ERROR: ErrorCode = ErrorCode(0xa);
    pub const ENHANCE_YOUR_CALM: ErrorCode = ErrorCode(0xb);
    pub const INADEQUATE_SECURITY: ErrorCode = ErrorCode(0xc);
    pub const HTTP_1_1_REQUIRED: ErrorCode = ErrorCode(0xd);
}

/// A frame header (§4.1): the reserved bit of the stream id dropped.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub id: StreamId,
}

impl Head {
    /// The header at the start of `b`, when 9 bytes are there.
    #[inline]
    pub fn parse(b: &[u8]) -> Option<Head> {
        let h: &[u8; 9] = b.get(..9)?.try_into().ok()?;
        Some(Head {
            len: u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize,
            kind: h[3],
            flags: h[4],
            id: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        })
    }
}

/// Appends a frame header.
#[inline]
pub fn put_head(dst: &mut Vec<u8>, len: usize, kind: u8, flags: u8, id: StreamId) {
    let l = (len as u32).to_be_bytes();
    let i = id.to_be_bytes();
    dst.extend_from_slice(&[l[1], l[2], l[3], kind, flags, i[0], i[1], i[2], i[3]]);
}

/// Overwrites the length of the frame header at `dst[at..at + 9]`.
#[inline]
pub fn set_len(dst: &mut [u8], at: usize, len: usize) {
    let l = (len as u32).to_be_bytes();
    dst[at..at + 3].copy_from_slice(&l[1..]);
}

/// RST_STREAM (§6.4): 13 bytes.
pub fn put_rst(dst: &mut Vec<u8>, id: StreamId, code: ErrorCode) {
    put_head(dst, 4, RST_STREAM, 0, id);
    dst.extend_from_slice(&code.0.to_be_bytes());
}

/// GOAWAY (§6.8) without debug data: 17 bytes.
pub fn put_goaway(dst: &mut Vec<u8>, last: StreamId, code: ErrorCode) {
    put_head(dst, 8, GOAWAY, 0, 0);
    dst.extend_from_slice(&(last & 0x7fff_ffff).to_be_bytes());
    dst.extend_from_slice(&code.0.to_be_bytes());
}

/// WINDOW_UPDATE (§6.9): 13 bytes.
pub fn put_window_update(dst: &mut Vec<u8>, id: StreamId, inc: u32) {
    put_head(dst, 4, WINDOW_UPDATE, 0, id);
    dst.extend_from_slice(&(inc & 0x7fff_ffff).to_be_bytes());
}

/// PING (§6.7), an acknowledgement when `ack`: 17 bytes.
pub fn put_ping(dst: &mut Vec<u8>, ack: bool, payload: &[u8; 8]) {
    put_head(dst, 8, PING, if ack { ACK } else { 0 }, 0);
    dst.extend_from_slice(payload);
}

/// One SETTINGS parameter (§6.5.1): 6 bytes.
pub fn put_setting(dst: &mut Vec<u8>, id: u16, value: u32) {
    dst.extend_from_slice(&id.to_be_bytes());
    dst.extend_from_slice(&value.to_be_bytes());
}

/// A 4-byte big-endian integer at `b[at..]` (callers checked the length).
#[inline]
pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_the_reserved_bit_is_dropped() {
        let mut b = Vec::new();
        put_head(&mut b, 0x12_3456, HEADERS, END_HEADERS, 0x8000_0007);
        assert_eq!(b, [0x12, 0x34, 0x56, 1, 4, 0x80, 0, 0, 7]);
        let h = Head::parse(&b).unwrap();
        assert_eq!((h.len, h.kind, h.flags, h.id), (0x12_3456, HEADERS, 4, 7));
        assert_eq!(Head::parse(&b[..8]), None);
        set_len(&mut b, 0, 5);
        assert_eq!(Head::parse(&b).unwrap().len, 5);
    }

    #[test]
    fn control_frames_have_their_fixed_lengths() {
        let mut b = Vec::new();
        put_rst(&mut b, 3, ErrorCode::CANCEL);
        assert_eq!(b, [0, 0, 4, RST_STREAM, 0, 0, 0, 0, 3, 0, 0, 0, 8]);
        b.clear();
        put_goaway(&mut b, 5, ErrorCode::ENHANCE_YOUR_CALM);
        assert_eq!(
            b,
            [0, 0, 8, GOAWAY, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0xb]
        );
        b.clear();
        put_window_update(&mut b, 0, 1 << 20);
        assert_eq!(b, [0, 0, 4, WINDOW_UPDATE, 0, 0, 0, 0, 0, 0, 0x10, 0, 0]);
        b.clear();
        put_ping(&mut b, true, b"12345678");
        assert_eq!(&b[..9], [0, 0, 8, PING, ACK, 0, 0, 0, 0]);
        assert_eq!(be32(&b, 9), u32::from_be_bytes(*b"1234"));
    }
}
