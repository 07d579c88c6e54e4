//! Strict, allocation-free HTTP/1.1 framing (RFC 9112) for zgix: request and response heads, chunked bodies, canonical paths.

pub mod proxy_protocol;
