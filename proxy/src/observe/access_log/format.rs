//! Access-log line formats: `text` (space-separated, quoted and escaped fields) and `json` (one object per line), written into a reused buffer.

use std::io::Write as _;

use zgix_config::AccessLogFormat;

use super::{Names, Record, Target};
use crate::observe::clock::{write_rfc3339_ms, SecondCache};
use crate::observe::decimal::decimal;
use crate::observe::decision::{write_decision, Decision};

/// Worst-case growth of a byte through escaping (`\u00XX` in JSON).
pub const ESCAPE_GROWTH: usize = 6;
/// Room for everything but the request line: fixed fields, addresses, the
/// listener name (64 bytes) and a filter name (128 bytes, escaped).
pub const LINE_OVERHEAD: usize = 2048;

/// Appends one line (with its newline) for `r` to `out`.
pub fn write_line(
    out: &mut Vec<u8>,
    format: AccessLogFormat,
    query: bool,
    rt: &dyn Names,
    cache: &SecondCache,
    r: &Record,
    t: &Target<'_>,
) {
    match format {
        AccessLogFormat::Text => text(out, query, rt, cache, r, t),
        AccessLogFormat::Json => json(out, query, rt, cache, r, t),
    }
    out.push(b'\n');
}

pub(super) fn filter_name<'a>(rt: &'a dyn Names, r: &Record) -> Option<&'a str> {
    match r.decision {
        Decision::Filter(i) => rt.filter_name(r.listener, i),
        _ => None,
    }
}

/// Milliseconds with microsecond precision: `12.345`.
pub(super) fn ms(out: &mut Vec<u8>, us: u64) {
    decimal(out, us / 1000);
    let frac = (us % 1000) as u16;
    out.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

/// Combined-log style: strings in double quotes with `"`, `\` and any byte
/// outside printable ASCII escaped (`\"`, `\\`, `\xHH`), so a line is one
/// line whatever the client sent; absent values are `-`.
fn text(
    out: &mut Vec<u8>,
    query: bool,
    rt: &dyn Names,
    cache: &SecondCache,
    r: &Record,
    t: &Target<'_>,
) {
    write_rfc3339_ms(out, r.start_unix_ms, cache);
    let _ = write!(out, " {} {} ", r.client, r.peer);
    quoted(out, listener_name(rt, r).as_bytes());
    out.extend_from_slice(b" \"");
    if t.method.is_empty() {
        out.push(b'-');
    } else {
        request_text(out, query, r, t, escape_text);
    }
    out.extend_from_slice(b"\" ");
    for n in [u64::from(r.status), r.bytes_in, r.bytes_out] {
        decimal(out, n);
        out.push(b' ');
    }
    ms(out, r.duration_us);
    out.push(b' ');
    match r.upstream.and_then(|e| rt.endpoint(e)) {
        Some(ep) => {
            let _ = write!(out, "\"{ep}\"");
        }
        None => out.push(b'-'),
    }
    out.push(b' ');
    match r.upstream_us {
        Some(us) => ms(out, us),
        None => out.push(b'-'),
    }
    out.push(b' ');
    decimal(out, u64::from(r.retries));
    out.extend_from_slice(b" \"");
    let at = out.len();
    write_decision(out, r.decision, filter_name(rt, r));
    escape_tail(out, at, escape_text);
    out.push(b'"');
    // tls_version tls_cipher sni tls_resumed: `-` on a plaintext listener.
    match r.tls {
        Some(f) => {
            let _ = write!(out, " {} {} ", f.version, f.cipher);
            match t.sni {
                Some(s) => escape_text(out, s),
                None => out.push(b'-'),
            }
            out.extend_from_slice(if f.resumed { b" 1" } else { b" 0" });
        }
        None => out.extend_from_slice(b" - - - -"),
    }
    // request_id, unquoted (1 to 128 visible ASCII bytes: no space; a `"` or
    // `\` escaped all the same), `-` for none.
    out.push(b' ');
    if r.request_id.is_empty() {
        out.push(b'-');
    } else {
        escape_text(out, r.request_id.as_bytes());
    }
}

/// The request line as logged, each part through `escape`: `GET /p?q HTTP/1.1`.
pub(super) fn request_text(
    out: &mut Vec<u8>,
    query: bool,
    r: &Record,
    t: &Target<'_>,
    escape: fn(&mut Vec<u8>, &[u8]),
) {
    escape(out, t.method);
    out.push(b' ');
    escape(out, t.path);
    if let (true, Some(q)) = (query, t.query) {
        out.push(b'?');
        escape(out, q);
    }
    out.push(b' ');
    out.extend_from_slice(r.protocol().unwrap_or("-").as_bytes());
}

fn listener_name<'a>(rt: &'a dyn Names, r: &Record) -> &'a str {
    rt.listener_name(r.listener).unwrap_or("-")
}

fn quoted(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    escape_text(out, s);
    out.push(b'"');
}

pub(super) fn escape_text(out: &mut Vec<u8>, s: &[u8]) {
    for &b in s {
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            0x20..=0x7e => out.push(b),
            _ => {
                let _ = write!(out, "\\x{b:02X}");
            }
        }
    }
}

/// Escapes, in place, what was appended to `out` since `at` (a decision
/// string: at most 128 bytes of filter name plus a prefix), through a copy
/// on the stack.
pub(super) fn escape_tail(out: &mut Vec<u8>, at: usize, escape: fn(&mut Vec<u8>, &[u8])) {
    let mut tmp = [0u8; 512];
    let n = (out.len() - at).min(tmp.len());
    tmp[..n].copy_from_slice(&out[at..at + n]);
    out.truncate(at);
    escape(out, &tmp[..n]);
}

/// One JSON object; strings escaped per RFC 8259 §7. A field that is not
/// UTF-8 has its bytes above 0x7F written as `\u00XX` so the line stays JSON.
fn json(
    out: &mut Vec<u8>,
    query: bool,
    rt: &dyn Names,
    cache: &SecondCache,
    r: &Record,
    t: &Target<'_>,
) {
    out.extend_from_slice(b"{\"time\":\"");
    write_rfc3339_ms(out, r.start_unix_ms, cache);
    let _ = write!(
        out,
        "\",\"client\":\"{}\",\"peer\":\"{}\",\"listener\":",
        r.client, r.peer
    );
    json_str(out, listener_name(rt, r).as_bytes());
    out.extend_from_slice(b",\"method\":");
    json_opt(out, (!t.method.is_empty()).then_some(t.method));
    out.extend_from_slice(b",\"path\":");
    json_opt(out, (!t.method.is_empty()).then_some(t.path));
    out.extend_from_slice(b",\"query\":");
    json_opt(out, t.query.filter(|_| query));
    out.extend_from_slice(b",\"version\":");
    json_opt(out, r.protocol().map(str::as_bytes));
    out.extend_from_slice(b",\"status\":");
    decimal(out, u64::from(r.status));
    out.extend_from_slice(b",\"bytes_in\":");
    decimal(out, r.bytes_in);
    out.extend_from_slice(b",\"bytes_out\":");
    decimal(out, r.bytes_out);
    out.extend_from_slice(b",\"duration_ms\":");
    ms(out, r.duration_us);
    out.extend_from_slice(b",\"upstream\":");
    match r.upstream.and_then(|e| rt.endpoint(e)) {
        Some(ep) => {
            let _ = write!(out, "\"{ep}\"");
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"upstream_ms\":");
    match r.upstream_us {
        Some(us) => ms(out, us),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"retries\":");
    decimal(out, u64::from(r.retries));
    out.extend_from_slice(b",\"decision\":\"");
    let at = out.len();
    write_decision(out, r.decision, filter_name(rt, r));
    escape_tail(out, at, escape_json);
    out.push(b'"');
    // null on a plaintext listener, as every absent field.
    match r.tls {
        Some(f) => {
            let _ = write!(
                out,
                ",\"tls_version\":\"{}\",\"tls_cipher\":\"{}\",\"sni\":",
                f.version, f.cipher
            );
            json_opt(out, t.sni);
            let _ = write!(out, ",\"tls_resumed\":{}", f.resumed);
        }
        None => out.extend_from_slice(
            b",\"tls_version\":null,\"tls_cipher\":null,\"sni\":null,\"tls_resumed\":null",
        ),
    }
    out.extend_from_slice(b",\"request_id\":");
    json_opt(
        out,
        (!r.request_id.is_empty()).then(|| r.request_id.as_bytes()),
    );
    out.push(b'}');
}

fn json_opt(out: &mut Vec<u8>, s: Option<&[u8]>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn json_str(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    escape_json(out, s);
    out.push(b'"');
}

pub(super) fn escape_json(out: &mut Vec<u8>, s: &[u8]) {
    let utf8 = std::str::from_utf8(s).is_ok();
    for &b in s {
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            0x00..=0x1f => {
                let _ = write!(out, "\\u{b:04x}");
            }
            0x80.. if !utf8 => {
                let _ = write!(out, "\\u{b:04x}");
            }
            _ => out.push(b),
        }
    }
}
