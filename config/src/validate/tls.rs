//! Validation of `listeners[].tls`: what can be checked without reading the files (zgix reads and checks every certificate and key at `--check`, start and reload, with the same paths).

use std::collections::HashSet;

use super::Validator;
use crate::tls::{
    ListenerTls, SessionTickets, ALPN_PROTOCOLS, MAX_CERTIFICATES, MAX_HANDSHAKE_TIMEOUT_MS,
    MIN_HANDSHAKE_TIMEOUT_MS,
};

impl Validator<'_> {
    pub(super) fn listener_tls(&mut self, path: &str, t: &ListenerTls) {
        let n = t.certificates.len();
        if n == 0 || n > MAX_CERTIFICATES {
            self.err(
                format!("{path}.certificates"),
                format!("must list between 1 and {MAX_CERTIFICATES} certificates, got {n}"),
            );
        }
        for (i, c) in t.certificates.iter().enumerate() {
            for (field, v) in [("cert", &c.cert), ("key", &c.key)] {
                self.file_path(&format!("{path}.certificates[{i}].{field}"), v);
            }
        }
        if t.alpn.is_empty() {
            self.err(
                format!("{path}.alpn"),
                "must list at least one protocol, such as [\"h2\", \"http/1.1\"]",
            );
        }
        let mut seen = HashSet::new();
        for (i, a) in t.alpn.iter().enumerate() {
            let p = format!("{path}.alpn[{i}]");
            if !ALPN_PROTOCOLS.contains(&a.as_str()) {
                self.err(
                    &p,
                    format!("unknown protocol {a:?}; zgix speaks {ALPN_PROTOCOLS:?}"),
                );
            } else if !seen.insert(a.as_str()) {
                self.err(&p, format!("{a:?} is listed twice"));
            }
        }
        self.range(
            &format!("{path}.handshake_timeout_ms"),
            t.handshake_timeout_ms,
            MIN_HANDSHAKE_TIMEOUT_MS,
            MAX_HANDSHAKE_TIMEOUT_MS,
        );
        if let SessionTickets::KeyFile(f) = &t.session_tickets {
            self.file_path(&format!("{path}.session_tickets.key_file"), f);
        }
    }

    fn file_path(&mut self, path: &str, v: &str) {
        if v.is_empty() {
            self.err(path, "must be the path of a file");
        } else if v.contains('\0') {
            self.err(path, "must not contain NUL");
        }
    }
}
