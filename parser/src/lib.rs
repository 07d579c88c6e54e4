//! Strict, allocation-free HTTP/1.1 framing (RFC 9112) for zgix: request and response heads, chunked bodies, canonical paths.
//!
//! Every parse works on the caller's read buffer and records [`Span`]s (offsets) into it, never
//! references, so a head can be kept while the buffer is reused. Incomplete input is
//! [`Status::Partial`], not an error; each [`ParseError`] names the status the proxy answers.
//!
//! The request side is deliberately stricter than RFC 9112 requires of a generic recipient:
//! zgix is an edge proxy, and every leniency the RFC permits (bare LF, obs-fold, several
//! Content-Length fields, unknown transfer codings) is a request-smuggling surface between it
//! and the origin. Section numbers in comments refer to RFC 9112 (HTTP/1.1), RFC 9110 (HTTP
//! semantics) and RFC 3986 (URI).
//!
//! Neither [`RequestParser::parse`], [`ResponseParser::parse`] nor [`ChunkedDecoder::feed`]
//! allocates: headers are parsed into a stack array and copied into vectors whose capacity
//! was reserved by [`RequestHead::new`] / [`ResponseHead::new`].

mod chunked;
mod error;
mod fields;
mod limits;
mod message;
mod path;
mod pieces;
mod rechunk;
mod request;
mod response;
mod span;
mod syntax;
mod target;

pub mod proxy_protocol;

pub use chunked::{
    ChunkedDecoder, Progress, MAX_CHUNK_EXT_TOTAL, MAX_CHUNK_LINE, MAX_TRAILER_BYTES,
};
pub use error::ParseError;
pub use fields::{Header, HeaderKind};
pub use limits::{Limits, MAX_HEADERS_CAP};
pub use message::{Method, Version};
pub use path::canonicalize_path;
pub use pieces::{rechunk_pieces, Piece, Pieces, COPY_MAX, FRAMING_MAX, PIECES_MAX};
pub use rechunk::{rechunk, Rechunked, RECHUNK_SLACK};
pub use request::{BodyKind, RequestHead, RequestParser};
pub use response::{ResponseBody, ResponseHead, ResponseParser};
pub use span::{Span, Status};
pub use syntax::{is_field_vchar, is_token};
