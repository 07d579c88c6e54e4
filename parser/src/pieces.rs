//! Re-encoding a validated chunked body as a gather list: the framing zgix writes in a small buffer of its own, the chunk-data as ranges of the input, for one vectored send without copying the data.

use std::ops::Range;

use crate::chunked::ChunkedDecoder;
use crate::error::ParseError;
use crate::rechunk::Rechunked;

/// Most pieces one [`Pieces`] holds (the iovecs of one vectored send).
pub const PIECES_MAX: usize = 64;

/// Bytes of framing (and copied small data) one [`Pieces`] holds.
pub const FRAMING_MAX: usize = 2048;

/// Data runs up to this long are copied into the framing buffer rather than
/// given an iovec of their own: a gather entry costs the kernel more than
/// copying a few bytes, and many tiny chunks then stay one piece.
pub const COPY_MAX: usize = 64;

/// Room [`rechunk_pieces`] leaves for the caller after its pieces: one more
/// framing piece of up to 20 bytes (a size line of 16 hex digits and its
/// CRLF, the bulk path's; [`Pieces::push_size_line`]).
const CALLER_BYTES: usize = 2 + 16 + 2;

/// The most one step of [`rechunk_pieces`] adds: a size line, a copied data
/// run and its CRLF, the last chunk (RFC 9112 §7.1: `0` CRLF CRLF).
const STEP_BYTES: usize = 16 + 2 + COPY_MAX + 2 + 5;

/// The most pieces one step adds (size line, data, CRLF), plus the caller's one.
const STEP_PIECES: usize = 3 + 1;

/// One piece of a re-encoded body, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Bytes of [`Pieces::framing`].
    Framing(Range<usize>),
    /// Chunk-data bytes of the input the pieces were made from.
    Data(Range<usize>),
}

/// A re-encoded body's gather list, fixed capacity (no allocation after
/// [`Pieces::new`]): the framing bytes zgix writes and the pieces that
/// interleave them with ranges of the input.
pub struct Pieces {
    framing: Box<[u8; FRAMING_MAX]>,
    flen: usize,
    list: Box<[Piece; PIECES_MAX]>,
    n: usize,
    /// The last [`rechunk_pieces`] stopped for room, input left.
    full: bool,
    /// Bytes at the start of the next call's input already checked by a
    /// probe decoder (the rest of a full call's input).
    checked: usize,
}

impl Default for Pieces {
    fn default() -> Self {
        Pieces::new()
    }
}

impl Pieces {
    pub fn new() -> Pieces {
        Pieces {
            framing: Box::new([0; FRAMING_MAX]),
            flen: 0,
            list: Box::new(std::array::from_fn(|_| Piece::Framing(0..0))),
            n: 0,
            full: false,
            checked: 0,
        }
    }

    /// Forgets the pieces (what was checked of the input is kept: the next
    /// call goes on with the rest of the same input).
    pub fn clear(&mut self) {
        self.flen = 0;
        self.n = 0;
        self.full = false;
    }

    /// Forgets everything, before a new message.
    pub fn reset(&mut self) {
        self.clear();
        self.checked = 0;
    }

    /// The framing bytes the [`Piece::Framing`] ranges refer to.
    pub fn framing(&self) -> &[u8] {
        &self.framing[..self.flen]
    }

    pub fn pieces(&self) -> &[Piece] {
        &self.list[..self.n]
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Whether any piece refers to the input (else the framing buffer is
    /// the whole re-encoding: one contiguous write).
    pub fn has_data(&self) -> bool {
        self.pieces().iter().any(|p| matches!(p, Piece::Data(_)))
    }

    /// The last [`rechunk_pieces`] stopped for want of room with input
    /// left: send these pieces, then call it again on the rest.
    pub fn is_full(&self) -> bool {
        self.full
    }

    /// Appends framing bytes, joined to the last piece when that is framing.
    /// The caller keeps within [`FRAMING_MAX`] (see [`rechunk_pieces`]).
    pub fn push_framing(&mut self, bytes: &[u8]) {
        let (a, b) = (self.flen, self.flen + bytes.len());
        self.framing[a..b].copy_from_slice(bytes);
        self.flen = b;
        if let Some(Piece::Framing(r)) = self.n.checked_sub(1).map(|i| &mut self.list[i]) {
            if r.end == a {
                r.end = b;
                return;
            }
        }
        self.push(Piece::Framing(a..b));
    }

    /// Appends a size line, `size` in lower-case hex without padding and
    /// CRLF (RFC 9112 §7.1: chunk-size, no chunk-ext).
    pub fn push_size_line(&mut self, size: u64) {
        let mut line = [0u8; 18];
        let digits = (16 - size.leading_zeros() as usize / 4).max(1);
        for (i, d) in line[..digits].iter_mut().enumerate() {
            let nib = (size >> (4 * (digits - 1 - i))) & 0xf;
            *d = b"0123456789abcdef"[nib as usize];
        }
        line[digits..digits + 2].copy_from_slice(b"\r\n");
        self.push_framing(&line[..digits + 2]);
    }

    /// Appends the data `input[r]`: copied into the framing when short and
    /// there is room, else as a range of the input.
    fn push_data(&mut self, r: Range<usize>, input: &[u8]) {
        if r.len() <= COPY_MAX && self.flen + r.len() <= FRAMING_MAX {
            self.push_framing(&input[r]);
        } else {
            self.push(Piece::Data(r));
        }
    }

    fn push(&mut self, p: Piece) {
        self.list[self.n] = p;
        self.n += 1;
    }

    /// Room for one more step of [`rechunk_pieces`] and the caller's piece.
    fn has_room(&self) -> bool {
        self.n + STEP_PIECES <= PIECES_MAX && self.flen + STEP_BYTES + CALLER_BYTES <= FRAMING_MAX
    }

    /// Bytes the pieces send.
    pub fn len(&self) -> usize {
        self.pieces()
            .iter()
            .map(|p| match p {
                Piece::Framing(r) | Piece::Data(r) => r.len(),
            })
            .sum()
    }

    /// Appends the bytes the pieces stand for to `out` (`input` being what
    /// they were made from): the copying path (a TLS upstream), and tests.
    pub fn write_to(&self, input: &[u8], out: &mut Vec<u8>) {
        for p in self.pieces() {
            match p {
                Piece::Framing(r) => out.extend_from_slice(&self.framing[r.clone()]),
                Piece::Data(r) => out.extend_from_slice(&input[r.clone()]),
            }
        }
    }
}

/// [`crate::rechunk`] as a gather list: feeds `input` through `dec` (RFC 9112
/// §7.1) and appends to `out` the same re-encoding (each run of chunk-data as
/// its own chunk, no chunk-ext, no trailer section, the last chunk once the
/// message ends; see `rechunk` for why, §7.1.1 and §7.1.2), with the data
/// as ranges of `input` instead of copies, except runs of at most
/// [`COPY_MAX`] bytes, which are copied into the framing.
///
/// The same input gives the same bytes as `rechunk`, the same `consumed`,
/// `done` and errors, except that a call may stop early for room
/// ([`Pieces::is_full`]): the caller sends the pieces and calls again on
/// `input[consumed..]`, without reading more in between. Before a call
/// stops for room it checks the rest of `input` with a copy of the decoder,
/// so an error anywhere in `input` is returned before any piece of it is
/// sent (as `rechunk`, which sees all of it at once, returns it); the decoder
/// then keeps failing. `out` is cleared by the caller, not here; after an
/// error its pieces are meaningless.
pub fn rechunk_pieces(
    dec: &mut ChunkedDecoder,
    input: &[u8],
    out: &mut Pieces,
) -> Result<Rechunked, ParseError> {
    let checked = std::mem::take(&mut out.checked);
    out.full = false;
    let mut pos = 0;
    while pos < input.len() && !dec.is_done() {
        if !out.has_room() {
            out.full = true;
            break;
        }
        let p = dec.feed(&input[pos..])?;
        if !p.data.is_empty() {
            let data = pos + p.data.start..pos + p.data.end;
            out.push_size_line(data.len() as u64);
            out.push_data(data, input);
            out.push_framing(b"\r\n");
        }
        pos += p.consumed;
        if p.done {
            out.push_framing(b"0\r\n\r\n");
        }
        if p.consumed == 0 {
            break;
        }
    }
    if out.full {
        if checked < input.len() {
            probe(dec, &input[pos..])?;
        }
        out.checked = input.len() - pos;
    }
    Ok(Rechunked {
        consumed: pos,
        done: dec.is_done(),
    })
}

/// Runs `rest` through a copy of `dec` to the end of the message or of the
/// input; an error is returned, and `dec` takes the failed copy's place.
fn probe(dec: &mut ChunkedDecoder, rest: &[u8]) -> Result<(), ParseError> {
    let mut copy = dec.clone();
    let mut at = 0;
    while at < rest.len() && !copy.is_done() {
        match copy.feed(&rest[at..]) {
            Ok(p) if p.consumed == 0 => break,
            Ok(p) => at += p.consumed,
            Err(e) => {
                *dec = copy;
                return Err(e);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "pieces_tests.rs"]
mod tests;
