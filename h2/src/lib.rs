//! zgix's own HTTP/2 server codec, sans-I/O: bytes in, events out, frames written into a buffer the caller drains (RFC 9113 framing, streams and flow control in [`frame`] and [`server`]; HPACK, RFC 7541, in [`hpack`]).

pub mod frame;
pub mod hpack;
pub mod server;
