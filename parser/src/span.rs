//! Offset spans into a read buffer, and the Complete/Partial parse status.

/// Outcome of a parse on input that is not (yet) invalid.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Status<T> {
    /// A whole message head (or whatever the call parses) was found.
    Complete(T),
    /// Everything seen so far is a valid prefix; read more bytes and call again with the
    /// same buffer extended. Parsers restart from the first byte, so the result depends only
    /// on the bytes.
    Partial,
}

impl<T> Status<T> {
    /// Whether this is [`Status::Complete`].
    pub fn is_complete(&self) -> bool {
        matches!(self, Status::Complete(_))
    }

    /// Whether this is [`Status::Partial`].
    pub fn is_partial(&self) -> bool {
        matches!(self, Status::Partial)
    }
}

/// A byte range `start..start + len` of the buffer a head was parsed from.
///
/// `u32` keeps [`crate::Header`] at 20 bytes; heads are bounded by
/// [`crate::Limits::max_header_bytes`], far below 4 GiB.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Span {
    /// Offset of the first byte.
    pub start: u32,
    /// Number of bytes.
    pub len: u32,
}

impl Span {
    /// The spanned bytes of `buf`, which must be the buffer (or a buffer starting with the
    /// same bytes) the span was parsed from.
    ///
    /// # Panics
    /// If the span runs past the end of `buf`.
    pub fn get<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        let start = self.start as usize;
        &buf[start..start + self.len as usize]
    }

    /// Whether the span covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.start as usize + self.len as usize
    }

    /// The span of `part`, which must be a subslice of `buf`.
    pub(crate) fn of(buf: &[u8], part: &[u8]) -> Span {
        let start = part.as_ptr() as usize - buf.as_ptr() as usize;
        debug_assert!(start + part.len() <= buf.len());
        Span::at(start, part.len())
    }

    /// The span `start..start + len`.
    pub(crate) fn at(start: usize, len: usize) -> Span {
        Span {
            start: start as u32,
            len: len as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_and_of_round_trip() {
        let buf = b"GET /x HTTP/1.1";
        let span = Span::of(buf, &buf[4..6]);
        assert_eq!(span, Span { start: 4, len: 2 });
        assert_eq!(span.get(buf), b"/x");
        assert_eq!(span.end(), 6);
        assert!(!span.is_empty());
        assert!(Span::default().is_empty());
        assert_eq!(Span::default().get(buf), b"");
    }
}
