//! Shared end-to-end harness: a scripted std::net origin, a `zgix` process handle and raw-byte clients.
//!
//! Everything here is bounded: every socket has read and write timeouts, every
//! wait has a deadline, so a broken proxy fails a test instead of hanging it.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Read/write timeout on every test socket, and the longest any single wait may take.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `Zgix::start` waits for the `ready` line.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `/slow` makes the origin wait before answering.
pub const SLOW_DELAY: Duration = Duration::from_millis(700);
/// Request bodies the origin keeps for assertions; longer ones are only counted.
const RECORD_CAP: usize = 1 << 20;
/// Longest head either side of the harness accepts, to bound a garbage stream.
const MAX_HEAD: usize = 1 << 20;

/// The body every plain `GET /` answer carries.
pub const OK_BODY: &[u8] = b"ok\n";

/// Raw bytes `/chunked` sends after its head: an extension and a trailer, so
/// "forwarded verbatim" is observable.
pub const CHUNKED_BODY_RAW: &[u8] =
    b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-trailer: done\r\n\r\n";
/// `CHUNKED_BODY_RAW` decoded.
pub const CHUNKED_BODY: &[u8] = b"hello, world";

/// Body byte `i` of `/cl/N` and `/source/N`: a 26-letter cycle, so a shifted or
/// reordered stream shows up at any offset.
pub fn pattern_byte(i: u64) -> u8 {
    b'a' + (i % 26) as u8
}

/// `n` pattern bytes from offset 0.
pub fn pattern(n: u64) -> Vec<u8> {
    (0..n).map(pattern_byte).collect()
}

/// Bytes escaped for readable assertion messages.
pub fn escape(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// Asserts byte equality and shows both sides escaped on a mismatch.
#[track_caller]
pub fn assert_bytes(actual: &[u8], expected: &[u8]) {
    assert!(
        actual == expected,
        "bytes differ\n  actual:   \"{}\"\n  expected: \"{}\"",
        escape(actual),
        escape(expected)
    );
}

/// The exact response zgix generates itself for `code`.
pub fn generated(code: u16, reason: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reason}\n",
        reason.len() + 1
    )
    .into_bytes()
}

/// A response zgix wrote itself without the `date` and `server` fields it
/// stamps right after the status line; panics unless both are there, the
/// date an IMF-fixdate (RFC 9110 §5.6.7) and the server `zgix`.
#[track_caller]
pub fn unstamped(raw: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(raw);
    let status_end = text.find("\r\n").map_or(0, |i| i + 2);
    let rest = &text[status_end..];
    let date = rest
        .strip_prefix("date: ")
        .and_then(|r| r.split_once("\r\n"))
        .map(|(d, _)| d)
        .unwrap_or_else(|| panic!("no date field after the status line: \"{}\"", escape(raw)));
    assert!(
        is_imf_fixdate(date),
        "date {date:?} is not an IMF-fixdate: \"{}\"",
        escape(raw)
    );
    let after_date = status_end + "date: ".len() + date.len() + 2;
    let server = b"server: zgix\r\n";
    assert!(
        raw[after_date..].starts_with(server),
        "no `server: zgix` after the date: \"{}\"",
        escape(raw)
    );
    [&raw[..status_end], &raw[after_date + server.len()..]].concat()
}

/// Has the shape of `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn is_imf_fixdate(d: &str) -> bool {
    let b = d.as_bytes();
    let shape = b.len() == 29
        && ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"].contains(&&d[..3])
        && &d[3..5] == ", "
        && d.ends_with(" GMT")
        && [5, 6, 12, 13, 14, 15, 17, 18, 20, 21, 23, 24]
            .iter()
            .all(|&i| b[i].is_ascii_digit());
    shape
}

// ---------------------------------------------------------------------------
// Origin
// ---------------------------------------------------------------------------

pub mod browser;
mod client;
mod origin;
mod zgix;

pub use client::*;
pub use origin::*;
pub use zgix::*;
