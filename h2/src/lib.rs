//! zgix's own HTTP/2 codec, sans-I/O and server side only: bytes in, events out, frames written into a buffer the caller drains.

pub mod hpack;
