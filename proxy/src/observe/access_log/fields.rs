//! `access_log.fields`: the chosen fields, compiled once at load into [`Fields`]; the request headers they ask for, captured into the pooled [`Captured`]; and the line they make in either format.

use std::fmt::Display;
use std::io::Write as _;

use zgix_config::{
    AccessLogField, AccessLogFormat, ACCESS_LOG_HEADER_VALUE_CAP, MAX_ACCESS_LOG_HEADER_FIELDS,
};

use super::format::{escape_json, escape_tail, escape_text, filter_name, ms, request_text};
use super::{Names, Record, Target};
use crate::observe::clock::{write_rfc3339_ms, SecondCache};
use crate::observe::decision::write_decision;

/// One compiled field; `Header(i)` is the `i`th captured header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Time,
    Client,
    Peer,
    Listener,
    Request,
    Method,
    Path,
    Query,
    Protocol,
    Status,
    BytesIn,
    BytesOut,
    DurationMs,
    UpstreamAddr,
    UpstreamStatus,
    UpstreamMs,
    Retries,
    Decision,
    TlsVersion,
    TlsCipher,
    Sni,
    TlsResumed,
    RequestId,
    Header(u8),
}

impl Field {
    fn named(n: &str) -> Option<Field> {
        use Field::*;
        Some(match n {
            "time" => Time,
            "client" => Client,
            "peer" => Peer,
            "listener" => Listener,
            "request" => Request,
            "method" => Method,
            "path" => Path,
            "query" => Query,
            "protocol" => Protocol,
            "status" => Status,
            "bytes_in" => BytesIn,
            "bytes_out" => BytesOut,
            "duration_ms" => DurationMs,
            "upstream_addr" => UpstreamAddr,
            "upstream_status" => UpstreamStatus,
            "upstream_ms" => UpstreamMs,
            "retries" => Retries,
            "decision" => Decision,
            "tls_version" => TlsVersion,
            "tls_cipher" => TlsCipher,
            "sni" => Sni,
            "tls_resumed" => TlsResumed,
            "request_id" => RequestId,
            _ => return None,
        })
    }
}

/// `access_log.fields` compiled: the fields in order, each with its JSON
/// key, and the (lowercase) names of the headers they capture.
#[derive(Debug)]
pub struct Fields {
    list: Vec<(Field, Box<str>)>,
    headers: Vec<Box<[u8]>>,
}

impl Fields {
    /// Compiles a validated `access_log.fields`.
    pub fn compile(names: &[String]) -> Result<Fields, String> {
        let mut f = Fields {
            list: Vec::with_capacity(names.len()),
            headers: Vec::new(),
        };
        for (i, n) in names.iter().enumerate() {
            let parsed =
                AccessLogField::parse(n).map_err(|e| format!("access_log.fields[{i}]: {e}"))?;
            let key: Box<str> = parsed.key().into();
            let field = match parsed {
                AccessLogField::Named(n) => Field::named(n)
                    .ok_or_else(|| format!("access_log.fields[{i}]: \"{n}\" is not compiled"))?,
                AccessLogField::Header { name, .. } => {
                    if f.headers.len() == MAX_ACCESS_LOG_HEADER_FIELDS {
                        return Err(format!("access_log.fields[{i}]: too many header fields"));
                    }
                    f.headers.push(name.into_bytes().into());
                    Field::Header((f.headers.len() - 1) as u8)
                }
            };
            f.list.push((field, key));
        }
        Ok(f)
    }

    /// The header names to capture, lowercase, in field order.
    pub fn headers(&self) -> &[Box<[u8]>] {
        &self.headers
    }

    /// Line-buffer room the captured values need beyond a default line.
    pub fn room(&self) -> usize {
        self.headers.len() * (ACCESS_LOG_HEADER_VALUE_CAP * super::ESCAPE_GROWTH + 32)
    }
}

/// The request-header values a line asks for, kept in the connection's
/// pooled request state: one buffer reserved once, reused by every request.
#[derive(Debug)]
pub struct Captured {
    pub(super) buf: Vec<u8>,
    spans: [(u32, u32); MAX_ACCESS_LOG_HEADER_FIELDS],
    set: u32,
}

impl Default for Captured {
    fn default() -> Captured {
        Captured::new()
    }
}

impl Captured {
    /// Nothing captured, no buffer yet.
    pub const fn new() -> Captured {
        Captured {
            buf: Vec::new(),
            spans: [(0, 0); MAX_ACCESS_LOG_HEADER_FIELDS],
            set: 0,
        }
    }

    /// Forgets the previous request's values.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.set = 0;
    }

    /// Keeps the first value of each header in `names` (at most
    /// [`ACCESS_LOG_HEADER_VALUE_CAP`] bytes of it) from `headers`.
    /// Nothing when no field asks for a header; the buffer is reserved on
    /// first use for every value at its cap, so it never grows after.
    pub fn capture<'a>(
        &mut self,
        names: &[Box<[u8]>],
        headers: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    ) {
        self.clear();
        if names.is_empty() {
            return;
        }
        let room = names.len() * ACCESS_LOG_HEADER_VALUE_CAP;
        if self.buf.capacity() < room {
            self.buf.reserve_exact(room);
        }
        for (name, value) in headers {
            for (i, want) in names.iter().enumerate() {
                if self.set & (1 << i) == 0 && name.eq_ignore_ascii_case(want) {
                    let v = &value[..value.len().min(ACCESS_LOG_HEADER_VALUE_CAP)];
                    self.spans[i] = (self.buf.len() as u32, v.len() as u32);
                    self.buf.extend_from_slice(v);
                    self.set |= 1 << i;
                }
            }
        }
    }

    /// Captured header `i`, if the request had it.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        (self.set & (1 << i) != 0).then(|| {
            let (at, n) = self.spans[i];
            &self.buf[at as usize..(at + n) as usize]
        })
    }
}

/// How one value is written: text quotes and escapes strings (`-` when
/// absent); JSON writes strings escaped, numbers bare, `null` when absent.
enum Val<'a> {
    /// From the client or the config: quoted in text.
    Str(Option<&'a [u8]>),
    /// A token zgix made (an address, a TLS name): bare in text.
    Token(Option<&'a dyn Display>),
    Num(Option<u64>),
    Ms(Option<u64>),
    Bool(Option<bool>),
}

fn put(out: &mut Vec<u8>, json: bool, v: Val<'_>) {
    let absent: &[u8] = if json { b"null" } else { b"-" };
    match v {
        Val::Str(Some(s)) => {
            out.push(b'"');
            if json {
                escape_json(out, s)
            } else {
                escape_text(out, s)
            }
            out.push(b'"');
        }
        Val::Token(Some(d)) if json => {
            let _ = write!(out, "\"{d}\"");
        }
        Val::Token(Some(d)) => {
            let _ = write!(out, "{d}");
        }
        Val::Num(Some(n)) => {
            let _ = write!(out, "{n}");
        }
        Val::Ms(Some(us)) => ms(out, us),
        Val::Bool(Some(b)) => out.extend_from_slice(match (json, b) {
            (true, true) => b"true",
            (true, false) => b"false",
            (false, true) => b"1",
            (false, false) => b"0",
        }),
        _ => out.extend_from_slice(absent),
    }
}

/// Appends one line of `fields` (with its newline) for `r` to `out`.
pub fn write_fields(
    out: &mut Vec<u8>,
    format: AccessLogFormat,
    query: bool,
    fields: &Fields,
    rt: &dyn Names,
    cache: &SecondCache,
    (r, t, c): (&Record, &Target<'_>, &Captured),
) {
    let json = format == AccessLogFormat::Json;
    if json {
        out.push(b'{');
    }
    for (i, (f, key)) in fields.list.iter().enumerate() {
        if json {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'"');
            escape_json(out, key.as_bytes());
            out.extend_from_slice(b"\":");
        } else if i > 0 {
            out.push(b' ');
        }
        one(out, json, query, *f, rt, cache, (r, t, c));
    }
    if json {
        out.push(b'}');
    }
    out.push(b'\n');
}

fn one(
    out: &mut Vec<u8>,
    json: bool,
    query: bool,
    f: Field,
    rt: &dyn Names,
    cache: &SecondCache,
    (r, t, c): (&Record, &Target<'_>, &Captured),
) {
    let parsed = !t.method.is_empty();
    let tls = r.tls;
    let escape = if json { escape_json } else { escape_text };
    let v = match f {
        Field::Time => {
            out.extend_from_slice(if json { b"\"" } else { b"" });
            write_rfc3339_ms(out, r.start_unix_ms, cache);
            out.extend_from_slice(if json { b"\"" } else { b"" });
            return;
        }
        Field::Client => Val::Token(Some(&r.client)),
        Field::Peer => Val::Token(Some(&r.peer)),
        Field::Listener => Val::Str(Some(rt.listener_name(r.listener).unwrap_or("-").as_bytes())),
        Field::Request if !parsed => Val::Str(None),
        Field::Request => {
            out.push(b'"');
            request_text(out, query, r, t, escape);
            out.push(b'"');
            return;
        }
        Field::Decision => {
            // Written raw, then escaped in place (at most 512 bytes).
            out.push(b'"');
            let at = out.len();
            write_decision(out, r.decision, filter_name(rt, r));
            escape_tail(out, at, escape);
            out.push(b'"');
            return;
        }
        Field::Method => Val::Str(parsed.then_some(t.method)),
        Field::Path => Val::Str(parsed.then_some(t.path)),
        Field::Query => Val::Str(t.query.filter(|_| query && parsed)),
        Field::Protocol => Val::Str(r.protocol().map(str::as_bytes)),
        Field::Status => Val::Num(Some(r.status.into())),
        Field::BytesIn => Val::Num(Some(r.bytes_in)),
        Field::BytesOut => Val::Num(Some(r.bytes_out)),
        Field::DurationMs => Val::Ms(Some(r.duration_us)),
        Field::UpstreamAddr => {
            let ep = r.upstream.and_then(|e| rt.endpoint(e));
            return put(
                out,
                json,
                Val::Token(ep.as_ref().map(|e| e as &dyn Display)),
            );
        }
        // The origin's status is relayed as it came: known once its head was read.
        Field::UpstreamStatus => Val::Num(r.upstream_us.map(|_| r.status.into())),
        Field::UpstreamMs => Val::Ms(r.upstream_us),
        Field::Retries => Val::Num(Some(r.retries.into())),
        Field::TlsVersion => Val::Str(tls.map(|f| f.version.as_bytes())),
        Field::TlsCipher => Val::Str(tls.map(|f| f.cipher.as_bytes())),
        Field::Sni => Val::Str(t.sni),
        Field::TlsResumed => Val::Bool(tls.map(|f| f.resumed)),
        Field::RequestId => Val::Str((!r.request_id.is_empty()).then(|| r.request_id.as_bytes())),
        Field::Header(i) => Val::Str(c.get(i.into())),
    };
    put(out, json, v);
}
