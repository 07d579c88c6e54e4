//! Request size limits as the parser enforces them, and the one structural cap it imposes.
//!
//! The parser has no defaults of its own. Every limit, its default and its accepted
//! range is defined once, in `zgix-config` (`zgix_config::Limits`, whose
//! `request_limits()` builds this struct); the parser only fixes what its allocation-free
//! design needs, [`MAX_HEADERS_CAP`], and the configuration refuses a `max_headers`
//! above it instead of having it clamped here without a word.

/// Hard cap on [`Limits::max_headers`]: headers are parsed into a stack array of this many
/// 32-byte `httparse::Header` slots (8 KiB of stack). `zgix-config` refuses a larger
/// `limits.max_headers`; a caller that builds [`Limits`] by hand past it is clamped.
pub const MAX_HEADERS_CAP: usize = 256;

/// Request size limits; each maps to its own status (414, 431, 413).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest request line, excluding its CRLF. Longer: 414.
    pub max_request_line: usize,
    /// Longest head, request line and final CRLFCRLF included. Longer: 431.
    /// Must be below 4 GiB (spans are `u32`).
    pub max_header_bytes: usize,
    /// Most header fields. More: 431. At most [`MAX_HEADERS_CAP`] take effect.
    pub max_headers: usize,
    /// Largest body, as declared by Content-Length or summed over chunks. Larger: 413.
    pub max_body: u64,
}

impl Limits {
    /// The most header fields a request may have under these limits: `max_headers`,
    /// clamped to what the stack array holds.
    pub fn header_slots(&self) -> usize {
        self.max_headers.min(MAX_HEADERS_CAP)
    }
}
