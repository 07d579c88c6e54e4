//! A proxied answer handed to its stream as the response parser read it: the origin's fields (names lowered in place, RFC 9113 §8.2.1) and the ones zgix adds go straight into the stream's HEADERS, without an HTTP/1.1 head written and read back (`answer.rs` reads the answers zgix makes itself).

use std::io;

use zgix_parser::{HeaderKind, ResponseBody, ResponseHead};

use super::answer::Framing;
use super::stream::StreamIo;
use crate::http::filters::{FiltersRt, Walk};
use crate::http::wire;
use crate::observe::decimal::decimal;

/// What zgix adds to a final head, besides the origin's fields.
pub(in crate::conn) struct Added<'a> {
    /// The matched `response_headers` edits.
    pub edits: Option<(&'a FiltersRt, &'a Walk)>,
    /// zgix's Via name.
    pub via: Option<&'a [u8]>,
    /// The RateLimit-Policy and RateLimit lines, or none.
    pub rate_fields: &'a [u8],
}

/// Sends the final answer `resp` (parsed from `base`, whose field names
/// it lowers) as the stream's HEADERS: the origin's fields minus the
/// hop-by-hop ones (RFC 9113 §8.2.2) and Transfer-Encoding, one
/// Content-Length when the body is delimited by one, then the fields zgix
/// adds, written into `scratch` first. The body follows through the
/// stream's writes, de-chunked when chunked.
pub(in crate::conn) fn answer_parsed(
    io: &StreamIo,
    base: &mut [u8],
    resp: &ResponseHead,
    added: Added<'_>,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    for h in &resp.headers {
        let (a, n) = (h.name.start as usize, h.name.len as usize);
        base[a..a + n].make_ascii_lowercase();
    }
    scratch.clear();
    wire::write_added_fields(scratch, resp.version, added.edits, added.via);
    scratch.extend_from_slice(added.rate_fields);
    let lines_end = scratch.len();
    // The one Content-Length value, after the added lines.
    let length = match resp.body {
        ResponseBody::None | ResponseBody::Length(_) => resp.content_length,
        ResponseBody::Chunked | ResponseBody::CloseDelimited => None,
    };
    if let Some(n) = length {
        decimal(scratch, n);
    }
    let (lines, length_text) = scratch.split_at_mut(lines_end);
    let mut length_text = length.map(|_| &*length_text);
    let base: &[u8] = base;
    let origin = resp.headers.iter().filter_map(move |h| {
        if !wire::response_forwards(base, h, true, added.edits) {
            return None;
        }
        let name = h.name.get(base);
        match h.kind {
            HeaderKind::ContentLength => length_text.take().map(|v| (name, v)),
            _ => Some((name, h.value.get(base))),
        }
    });
    let framing = match resp.body {
        ResponseBody::None => Framing::None,
        ResponseBody::Length(n) => Framing::Length(n),
        ResponseBody::Chunked => Framing::Chunked,
        ResponseBody::CloseDelimited => Framing::Close,
    };
    io.answer_parsed(resp.status, origin.chain(field_lines(lines)), framing)
}

/// The `Name: value\r\n` lines zgix wrote, as fields: names lowered in
/// place, values without the space after the colon.
fn field_lines(lines: &mut [u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    lines.split_mut(|&c| c == b'\n').filter_map(|line| {
        let end = line.len() - usize::from(line.ends_with(b"\r"));
        let line = &mut line[..end];
        let colon = memchr::memchr(b':', line)?;
        let (name, value) = line.split_at_mut(colon);
        name.make_ascii_lowercase();
        let value = &value[1..];
        let value = value.strip_prefix(b" ").unwrap_or(value);
        Some((&*name, value))
    })
}

#[cfg(test)]
mod tests {
    use super::field_lines;

    #[test]
    fn added_lines_become_lowercase_fields() {
        let mut b =
            b"Via: 1.1 zgix\r\nRateLimit-Policy: \"p\";q=5;w=1\r\nRateLimit: \"p\";r=4;t=0\r\n"
                .to_vec();
        let got: Vec<_> = field_lines(&mut b)
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        let want: Vec<(Vec<u8>, Vec<u8>)> = [
            ("via", "1.1 zgix"),
            ("ratelimit-policy", "\"p\";q=5;w=1"),
            ("ratelimit", "\"p\";r=4;t=0"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
        assert_eq!(got, want);
    }
}
