//! Validation of `listeners[].http2`: the bounds of each setting, and `prior_knowledge` only where there is no TLS (a TLS listener negotiates `h2` with ALPN, RFC 9113 §3.2).

use super::Validator;
use crate::http2::{
    Http2, MAX_CONCURRENT_STREAMS_LIMIT, MAX_INITIAL_WINDOW_BYTES, MAX_MAX_HEADER_LIST_BYTES,
    MIN_INITIAL_WINDOW_BYTES, MIN_MAX_HEADER_LIST_BYTES,
};

impl Validator<'_> {
    pub(super) fn listener_http2(&mut self, path: &str, h: &Http2, tls: bool) {
        self.range(
            &format!("{path}.max_concurrent_streams"),
            h.max_concurrent_streams,
            1,
            MAX_CONCURRENT_STREAMS_LIMIT,
        );
        self.range(
            &format!("{path}.initial_window_bytes"),
            h.initial_window_bytes,
            MIN_INITIAL_WINDOW_BYTES,
            MAX_INITIAL_WINDOW_BYTES,
        );
        self.range(
            &format!("{path}.max_header_list_bytes"),
            h.max_header_list_bytes,
            MIN_MAX_HEADER_LIST_BYTES,
            MAX_MAX_HEADER_LIST_BYTES,
        );
        if h.prior_knowledge && tls {
            self.err(
                format!("{path}.prior_knowledge"),
                "is for a plain listener; a TLS listener speaks h2 when \"h2\" is in tls.alpn",
            );
        }
    }
}
