//! Size limits for request heads and bodies, with their defaults.

/// Default [`Limits::max_request_line`]: 8 KiB, nginx's `large_client_header_buffers` line
/// size. Long enough for the longest URLs browsers and CDNs emit in practice.
pub const DEFAULT_MAX_REQUEST_LINE: usize = 8 * 1024;

/// Default [`Limits::max_header_bytes`]: 32 KiB, nginx's default total (4 x 8 KiB). Big
/// cookies fit; a client that sends more is refused 431 before it can pin more buffer.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 32 * 1024;

/// Default [`Limits::max_headers`]: 100 fields, hyper's default. Each field costs a 20-byte
/// [`crate::Header`] slot reserved up front.
pub const DEFAULT_MAX_HEADERS: usize = 100;

/// Default [`Limits::max_body`]: 1 MiB, nginx's `client_max_body_size`.
pub const DEFAULT_MAX_BODY: u64 = 1024 * 1024;

/// Hard cap on [`Limits::max_headers`]: headers are parsed into a stack array of this many
/// 32-byte `httparse::Header` slots (8 KiB of stack), so a larger configured limit is clamped.
pub const MAX_HEADERS_CAP: usize = 256;

/// Request size limits; each maps to its own status (414, 431, 413).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest request line, excluding its CRLF. Longer: 414.
    pub max_request_line: usize,
    /// Longest head, request line and final CRLFCRLF included. Longer: 431.
    /// Must be below 4 GiB (spans are `u32`).
    pub max_header_bytes: usize,
    /// Most header fields. More: 431. Clamped to [`MAX_HEADERS_CAP`].
    pub max_headers: usize,
    /// Largest body, as declared by Content-Length or summed over chunks. Larger: 413.
    pub max_body: u64,
}

impl Limits {
    /// `max_headers` clamped to what the stack array holds.
    pub(crate) fn header_slots(&self) -> usize {
        self.max_headers.min(MAX_HEADERS_CAP)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_line: DEFAULT_MAX_REQUEST_LINE,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
            max_body: DEFAULT_MAX_BODY,
        }
    }
}
