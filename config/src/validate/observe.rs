//! Validation of the observability settings: the admin endpoint, access log, `Server` header, listener names.

use std::collections::HashMap;

use super::Validator;
use crate::observe::{
    AccessLogField, Admin, ServerHeader, MAX_ACCESS_LOG_BUFFER_BYTES, MAX_ACCESS_LOG_FIELDS,
    MAX_ACCESS_LOG_HEADER_FIELDS, MAX_ADMIN_MAX_CONNECTIONS, MAX_ADMIN_TIMEOUT_MS,
    MAX_ADMIN_TOKEN_BYTES, MAX_LISTENER_NAME_BYTES, MIN_ACCESS_LOG_BUFFER_BYTES,
    MIN_ADMIN_TIMEOUT_MS, MIN_ADMIN_TOKEN_BYTES,
};

/// Longest `server_header` value; a product token and version, not a banner.
const MAX_SERVER_HEADER_BYTES: usize = 128;

impl Validator<'_> {
    /// `admin.*`: the token's shape, the connection cap, the timeouts.
    pub(super) fn admin(&mut self, a: &Admin) {
        if let Some(t) = &a.token {
            // RFC 6750 §2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
            let b64 = |b: u8| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b);
            if t.len() < MIN_ADMIN_TOKEN_BYTES || t.len() > MAX_ADMIN_TOKEN_BYTES {
                self.err(
                    "admin.token",
                    format!(
                        "must be between {MIN_ADMIN_TOKEN_BYTES} and {MAX_ADMIN_TOKEN_BYTES} bytes long, got {}",
                        t.len()
                    ),
                );
            } else if !t.bytes().all(b64) {
                self.err(
                    "admin.token",
                    "must be letters, digits and -._~+/= only (an RFC 6750 bearer token)",
                );
            }
        }
        self.range(
            "admin.max_connections",
            a.max_connections,
            1,
            MAX_ADMIN_MAX_CONNECTIONS,
        );
        for (key, v) in [
            ("admin.header_timeout_ms", a.header_timeout_ms),
            ("admin.idle_timeout_ms", a.idle_timeout_ms),
        ] {
            self.range(key, v, MIN_ADMIN_TIMEOUT_MS, MAX_ADMIN_TIMEOUT_MS);
        }
    }

    /// `access_log.fields`: known names, header names that are tokens, no
    /// duplicates, within the caps; every entry's error reported.
    fn access_log_fields(&mut self, fields: &[String]) {
        if fields.is_empty() || fields.len() > MAX_ACCESS_LOG_FIELDS {
            self.err(
                "access_log.fields",
                format!(
                    "must name 1 to {MAX_ACCESS_LOG_FIELDS} fields, got {}; omit it for the default line",
                    fields.len()
                ),
            );
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut headers = 0;
        for (i, f) in fields.iter().enumerate() {
            let path = format!("access_log.fields[{i}]");
            match AccessLogField::parse(f) {
                Err(e) => self.err(&path, e),
                Ok(field) => {
                    if matches!(field, AccessLogField::Header { .. }) {
                        headers += 1;
                        if headers == MAX_ACCESS_LOG_HEADER_FIELDS + 1 {
                            self.err(
                                &path,
                                format!("more than {MAX_ACCESS_LOG_HEADER_FIELDS} header fields (host, user_agent, referer, header:NAME)"),
                            );
                        }
                    }
                    if let Some(j) = seen.get(field.key()) {
                        self.err(
                            &path,
                            format!("\"{}\" is already at access_log.fields[{j}]", field.key()),
                        );
                    } else {
                        seen.insert(field.key().to_owned(), i);
                    }
                }
            }
        }
    }

    pub(super) fn observability(&mut self) {
        let config = self.config;
        if let Some(log) = &config.access_log {
            if log.path.is_empty() {
                self.err("access_log.path", "must not be empty; use \"-\" for stdout");
            } else if log.path.contains('\0') {
                self.err("access_log.path", "must not contain NUL");
            }
            self.range(
                "access_log.buffer_bytes",
                log.buffer_bytes,
                MIN_ACCESS_LOG_BUFFER_BYTES,
                MAX_ACCESS_LOG_BUFFER_BYTES,
            );
            if let Some(fields) = &log.fields {
                self.access_log_fields(fields);
            }
        }
        if let Some(ServerHeader::Name(n)) = &config.server_header {
            // RFC 9110 §10.2.4: product tokens and comments, visible ASCII and spaces.
            if n.is_empty() || n.len() > MAX_SERVER_HEADER_BYTES {
                self.err(
                    "server_header",
                    format!(
                        "must be between 1 and {MAX_SERVER_HEADER_BYTES} bytes long, got {}; use false for no Server field",
                        n.len()
                    ),
                );
            } else if !n.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
                || n.starts_with(' ')
                || n.ends_with(' ')
            {
                self.err(
                    "server_header",
                    "must be visible ASCII and inner spaces only, such as \"zgix/1.0\"",
                );
            }
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, l) in config.listeners.iter().enumerate() {
            let Some(name) = &l.name else { continue };
            let path = format!("listeners[{i}].name");
            if name.is_empty() || name.len() > MAX_LISTENER_NAME_BYTES {
                self.err(
                    &path,
                    format!(
                        "must be between 1 and {MAX_LISTENER_NAME_BYTES} bytes long, got {}",
                        name.len()
                    ),
                );
            } else if !name
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
            {
                self.err(
                    &path,
                    "must be visible ASCII without spaces, quotes or backslashes (it is a metric label and a log field)",
                );
            }
            if let Some(&first) = seen.get(name.as_str()) {
                self.err(
                    &path,
                    format!("{name:?} is already listeners[{first}].name"),
                );
            } else {
                seen.insert(name, i);
            }
        }
        // An unnamed listener is named by its bind address: a name equal to
        // another listener's address would make two series one.
        for (i, l) in config.listeners.iter().enumerate() {
            if l.name.is_some() {
                continue;
            }
            let bind = l.bind.to_string();
            if let Some(&j) = seen.get(bind.as_str()) {
                self.err(
                    format!("listeners[{j}].name"),
                    format!("{bind:?} is the default name of listeners[{i}] (its bind address)"),
                );
            }
        }
    }
}
