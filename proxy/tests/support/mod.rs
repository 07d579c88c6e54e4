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

/// One request as the origin received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Request line and header fields through the blank line, byte for byte.
    pub head: Vec<u8>,
    /// Raw body bytes as framed on the wire (chunk sizes included), first `RECORD_CAP` bytes.
    pub body: Vec<u8>,
    /// Raw body length on the wire.
    pub body_len: u64,
}

struct OriginState {
    name: String,
    accepted: AtomicUsize,
    requests: Mutex<Vec<Recorded>>,
    stopped: AtomicBool,
}

/// An HTTP/1.1 origin on 127.0.0.1, one thread per connection, keep-alive,
/// whose behaviour is chosen by the request path:
///
/// | path | answer |
/// |---|---|
/// | `/cl/N` | 200, `N` pattern bytes with content-length |
/// | `/chunked` | 200, chunked [`CHUNKED_BODY_RAW`] |
/// | `/close` | 200, close-delimited body, then close |
/// | `/once` | 200 like `/`, then a silent close (no `Connection: close`) |
/// | `/slow` | 200 `slow\n` after [`SLOW_DELAY`] |
/// | `/status/N` | `N Origin Reason`, empty body |
/// | `/garbage` | non-HTTP bytes, then close |
/// | `/reset` | close without answering |
/// | `/hang` | never answers (until the origin is dropped) |
/// | `/echo` | 200 with the decoded request body |
/// | `/sink` | 200 with the decoded body length in decimal |
/// | `/source/N` | 200, `N` pattern bytes streamed with content-length |
/// | `/hop` | 200 carrying every hop-by-hop response field |
/// | anything else | 200 [`OK_BODY`] |
///
/// Every answer the origin writes itself carries `x-origin: {name}`.
pub struct Origin {
    addr: SocketAddr,
    state: Arc<OriginState>,
}

impl Origin {
    /// An origin named `o`.
    pub fn start() -> Origin {
        Origin::named("o")
    }

    /// An origin whose answers carry `x-origin: {name}`.
    pub fn named(name: &str) -> Origin {
        Origin::named_at(name, "127.0.0.1:0".parse().unwrap())
    }

    /// An origin named `name` listening on `addr` (a port a test freed).
    pub fn named_at(name: &str, addr: SocketAddr) -> Origin {
        let listener = TcpListener::bind(addr).expect("bind origin");
        let addr = listener.local_addr().expect("origin addr");
        let state = Arc::new(OriginState {
            name: name.to_string(),
            accepted: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
        });
        let accept_state = state.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                if accept_state.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = conn else { continue };
                accept_state.accepted.fetch_add(1, Ordering::SeqCst);
                let conn_state = accept_state.clone();
                thread::spawn(move || serve(stream, &conn_state));
            }
        });
        Origin { addr, state }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Every request fully received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Waits (bounded) until at least `n` requests were received and returns them.
    #[track_caller]
    pub fn wait_requests(&self, n: usize) -> Vec<Recorded> {
        let deadline = Instant::now() + IO_TIMEOUT;
        loop {
            let got = self.requests();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "origin received {} requests, expected {n}",
                got.len()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The single request received, asserting there was exactly one.
    #[track_caller]
    pub fn only_request(&self) -> Recorded {
        let got = self.wait_requests(1);
        assert_eq!(got.len(), 1, "origin received {} requests", got.len());
        got.into_iter().next().unwrap()
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag and exits.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// How a message body is delimited (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    Close,
    None,
}

/// A parsed head: start line split on spaces, and its fields.
struct Head {
    start: Vec<String>,
    fields: Vec<(String, String)>,
}

impl Head {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn request_framing(&self) -> Framing {
        if self
            .field("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
        {
            Framing::Chunked
        } else if let Some(cl) = self.field("content-length") {
            Framing::Length(cl.trim().parse().unwrap_or(0))
        } else {
            Framing::None
        }
    }
}

fn parse_head(raw: &[u8]) -> Head {
    let text = String::from_utf8_lossy(raw);
    let mut lines = text.split("\r\n");
    let start = lines
        .next()
        .unwrap_or("")
        .splitn(3, ' ')
        .map(str::to_string)
        .collect();
    let fields = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            Some((n.to_string(), v.trim().to_string()))
        })
        .collect();
    Head { start, fields }
}

/// Reads one head through its blank line. `Ok(None)` on a clean EOF before any byte.
fn read_head(r: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        let n = r.read_until(b'\n', &mut head)?;
        if n == 0 {
            if head.is_empty() {
                return Ok(None);
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("EOF inside head: \"{}\"", escape(&head)),
            ));
        }
        let line = &head[before..];
        if line == b"\r\n" || line == b"\n" {
            return Ok(Some(head));
        }
        if head.len() > MAX_HEAD {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too long"));
        }
    }
}

fn eof(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, format!("EOF inside {what}"))
}

/// Copies exactly `n` bytes, handing each piece to `raw` and `data`.
fn copy_exact(
    r: &mut impl BufRead,
    mut n: u64,
    raw: &mut dyn FnMut(&[u8]),
    data: &mut dyn FnMut(&[u8]),
) -> io::Result<()> {
    while n > 0 {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Err(eof("body"));
        }
        let take = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
        raw(&buf[..take]);
        data(&buf[..take]);
        r.consume(take);
        n -= take as u64;
    }
    Ok(())
}

/// Decodes a chunked body (RFC 9112 §7.1): `raw` sees every wire byte incl.
/// extensions and trailers, `data` only the payload.
fn read_chunked(
    r: &mut impl BufRead,
    raw: &mut dyn FnMut(&[u8]),
    data: &mut dyn FnMut(&[u8]),
) -> io::Result<()> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    loop {
        let mut line = Vec::new();
        r.read_until(b'\n', &mut line)?;
        if !line.ends_with(b"\n") {
            return Err(eof("chunk size"));
        }
        raw(&line);
        let text = String::from_utf8_lossy(&line);
        let digits = text.split([';', '\r', '\n']).next().unwrap_or("").trim();
        let size = u64::from_str_radix(digits, 16).map_err(|_| bad("chunk size"))?;
        if size == 0 {
            loop {
                line.clear();
                r.read_until(b'\n', &mut line)?;
                if !line.ends_with(b"\n") {
                    return Err(eof("trailers"));
                }
                raw(&line);
                if line == b"\r\n" || line == b"\n" {
                    return Ok(());
                }
            }
        }
        copy_exact(r, size, raw, data)?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
        raw(&crlf);
        if crlf != *b"\r\n" {
            return Err(bad("no CRLF after chunk data"));
        }
    }
}

/// Serves one origin connection until EOF, an error, or a closing behaviour.
fn serve(stream: TcpStream, state: &OriginState) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
    let _ = stream.set_nodelay(true);
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::with_capacity(64 * 1024, read_half);
    let mut writer = stream;
    while let Ok(Some(raw_head)) = read_head(&mut reader) {
        let head = parse_head(&raw_head);
        let target = head.start.get(1).cloned().unwrap_or_default();
        let path = target.split('?').next().unwrap_or("").to_string();
        let mut raw_body = Vec::new();
        let mut raw_len = 0u64;
        let mut decoded = Vec::new();
        let mut decoded_len = 0u64;
        let keep_decoded = path == "/echo";
        let result = {
            let mut on_raw = |b: &[u8]| {
                raw_len += b.len() as u64;
                if raw_body.len() < RECORD_CAP {
                    let room = RECORD_CAP - raw_body.len();
                    raw_body.extend_from_slice(&b[..b.len().min(room)]);
                }
            };
            let mut on_data = |b: &[u8]| {
                decoded_len += b.len() as u64;
                if keep_decoded {
                    decoded.extend_from_slice(b);
                }
            };
            match head.request_framing() {
                Framing::Chunked => read_chunked(&mut reader, &mut on_raw, &mut on_data),
                Framing::Length(n) => copy_exact(&mut reader, n, &mut on_raw, &mut on_data),
                Framing::Close | Framing::None => Ok(()),
            }
        };
        if result.is_err() {
            return;
        }
        state.requests.lock().unwrap().push(Recorded {
            head: raw_head,
            body: raw_body,
            body_len: raw_len,
        });
        let is_head = head.start.first().is_some_and(|m| m == "HEAD");
        match respond(&mut writer, state, &path, is_head, &decoded, decoded_len) {
            Ok(true) => {}
            Ok(false) | Err(_) => return,
        }
    }
}

fn simple(name: &str, code: u16, reason: &str, body: &[u8], is_head: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-length: {}\r\nx-origin: {name}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !is_head {
        out.extend_from_slice(body);
    }
    out
}

/// Writes the answer for `path`; `Ok(false)` means the connection must close.
fn respond(
    w: &mut TcpStream,
    state: &OriginState,
    path: &str,
    is_head: bool,
    decoded: &[u8],
    decoded_len: u64,
) -> io::Result<bool> {
    let name = state.name.as_str();
    let arg = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|n| n.parse::<u64>().ok())
    };
    if let Some(n) = arg("/cl/") {
        w.write_all(&simple(name, 200, "OK", &pattern(n), is_head))?;
        return Ok(true);
    }
    if let Some(n) = arg("/source/") {
        write!(
            w,
            "HTTP/1.1 200 OK\r\ncontent-length: {n}\r\nx-origin: {name}\r\n\r\n"
        )?;
        // 26 × 2521 bytes: a whole number of pattern cycles, so every write starts at 'a'.
        let block = pattern(26 * 2521);
        let mut left = n;
        while left > 0 {
            let take = block.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            w.write_all(&block[..take])?;
            left -= take as u64;
        }
        return Ok(true);
    }
    if let Some(code) = arg("/status/") {
        let code = u16::try_from(code).unwrap_or(500);
        let mut out = format!("HTTP/1.1 {code} Origin Reason\r\nx-origin: {name}\r\n").into_bytes();
        if code != 204 && code != 304 {
            out.extend_from_slice(b"content-length: 0\r\n");
        }
        out.extend_from_slice(b"\r\n");
        w.write_all(&out)?;
        return Ok(true);
    }
    match path {
        "/chunked" => {
            write!(
                w,
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-origin: {name}\r\n\r\n"
            )?;
            if !is_head {
                w.write_all(CHUNKED_BODY_RAW)?;
            }
            Ok(true)
        }
        "/close" => {
            write!(
                w,
                "HTTP/1.1 200 OK\r\nx-origin: {name}\r\n\r\nclose-delimited\n"
            )?;
            Ok(false)
        }
        "/once" => {
            w.write_all(&simple(name, 200, "OK", OK_BODY, is_head))?;
            Ok(false)
        }
        "/slow" => {
            thread::sleep(SLOW_DELAY);
            w.write_all(&simple(name, 200, "OK", b"slow\n", is_head))?;
            Ok(true)
        }
        "/garbage" => {
            w.write_all(b"\x00\x01\x02 this is not HTTP at all\r\n\r\n")?;
            Ok(false)
        }
        "/reset" => Ok(false),
        "/hang" => {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !state.stopped.load(Ordering::SeqCst) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            Ok(false)
        }
        "/echo" => {
            w.write_all(&simple(name, 200, "OK", decoded, is_head))?;
            Ok(true)
        }
        "/sink" => {
            let body = decoded_len.to_string();
            w.write_all(&simple(name, 200, "OK", body.as_bytes(), is_head))?;
            Ok(true)
        }
        "/hop" => {
            write!(
                w,
                "HTTP/1.1 200 OK\r\n\
                 Connection: keep-alive, X-Hop\r\n\
                 X-Hop: secret\r\n\
                 Keep-Alive: timeout=5\r\n\
                 Proxy-Connection: keep-alive\r\n\
                 Upgrade: h2c\r\n\
                 TE: trailers\r\n\
                 Trailer: X-Never\r\n\
                 X-End: Kept  As-Is\r\n\
                 content-length: 3\r\n\
                 x-origin: {name}\r\n\r\nok\n"
            )?;
            Ok(true)
        }
        _ => {
            w.write_all(&simple(name, 200, "OK", OK_BODY, is_head))?;
            Ok(true)
        }
    }
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// Keeps up to this many received bytes per connection for failure messages.
const TRANSCRIPT_CAP: usize = 64 * 1024;

/// A `Read` that remembers what it read, so a failed parse can show the bytes.
struct Tee {
    stream: TcpStream,
    seen: Vec<u8>,
}

impl Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.stream.read(buf)?;
        if self.seen.len() < TRANSCRIPT_CAP {
            let room = TRANSCRIPT_CAP - self.seen.len();
            self.seen.extend_from_slice(&buf[..n.min(room)]);
        }
        Ok(n)
    }
}

/// One response as the client received it.
#[derive(Clone, Debug)]
pub struct Response {
    /// Every byte of the response: head and body as framed on the wire.
    pub raw: Vec<u8>,
    /// Status line and fields through the blank line.
    pub head: Vec<u8>,
    pub version: String,
    pub status: u16,
    pub reason: String,
    pub fields: Vec<(String, String)>,
    /// Payload after removing chunked framing.
    pub body: Vec<u8>,
    /// Body bytes exactly as framed on the wire (chunk sizes, extensions, trailers).
    pub raw_body: Vec<u8>,
}

impl Response {
    /// First field named `name` (case-insensitive).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every field named `name` (case-insensitive), in order.
    pub fn fields_named(&self, name: &str) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The response's head and body escaped, for messages.
    pub fn show(&self) -> String {
        escape(&self.raw)
    }

    /// The head as text.
    pub fn head_text(&self) -> String {
        String::from_utf8_lossy(&self.head).into_owned()
    }
}

/// A raw HTTP/1.x client connection with timeouts and a response reader that
/// understands content-length, chunked and close-delimited bodies.
pub struct Client {
    reader: BufReader<Tee>,
    writer: TcpStream,
}

/// A TCP connection to `addr` with [`IO_TIMEOUT`] on connect, reads and writes.
#[track_caller]
pub fn connect(addr: SocketAddr) -> TcpStream {
    let stream = match TcpStream::connect_timeout(&addr, IO_TIMEOUT) {
        Ok(stream) => stream,
        Err(e) => panic!("connect to {addr}: {e}"),
    };
    set_timeouts(&stream);
    stream
}

fn set_timeouts(stream: &TcpStream) {
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let _ = stream.set_nodelay(true);
}

/// A TCP connection to `dest` whose local address is `source` (any 127/8
/// address works on Linux loopback). std cannot bind before connecting, so this
/// calls the C library std already links.
pub fn connect_from(source: Ipv4Addr, dest: SocketAddrV4) -> io::Result<TcpStream> {
    #[repr(C)]
    struct SockaddrIn {
        sin_family: u16,
        sin_port: u16,
        sin_addr: u32,
        sin_zero: [u8; 8],
    }
    extern "C" {
        fn socket(domain: i32, ty: i32, protocol: i32) -> i32;
        fn bind(fd: i32, addr: *const SockaddrIn, len: u32) -> i32;
        fn connect(fd: i32, addr: *const SockaddrIn, len: u32) -> i32;
    }
    const AF_INET: i32 = 2;
    const SOCK_STREAM: i32 = 1;
    const SOCK_CLOEXEC: i32 = 0o2_000_000;
    let sockaddr = |a: SocketAddrV4| SockaddrIn {
        sin_family: AF_INET as u16,
        sin_port: a.port().to_be(),
        sin_addr: u32::from(*a.ip()).to_be(),
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<SockaddrIn>() as u32;
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe { socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nobody else owns; the stream closes it on every path.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let local = sockaddr(SocketAddrV4::new(source, 0));
    // SAFETY: `local` is a valid sockaddr_in of `len` bytes that outlives the call.
    if unsafe { bind(fd, &local, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let remote = sockaddr(dest);
    // SAFETY: as above; a blocking connect on loopback completes or fails at once.
    if unsafe { connect(fd, &remote, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    set_timeouts(&stream);
    Ok(stream)
}

impl Client {
    #[track_caller]
    pub fn connect(addr: SocketAddr) -> Client {
        Client::from_stream(connect(addr))
    }

    pub fn from_stream(stream: TcpStream) -> Client {
        set_timeouts(&stream);
        let writer = stream.try_clone().expect("clone client socket");
        Client {
            reader: BufReader::with_capacity(
                64 * 1024,
                Tee {
                    stream,
                    seen: Vec::new(),
                },
            ),
            writer,
        }
    }

    /// Writes `bytes` in one write call sequence.
    #[track_caller]
    /// A second handle on the socket for writing from another thread.
    pub fn writer(&self) -> TcpStream {
        self.writer.try_clone().expect("clone client socket")
    }

    /// Reads exactly `buf.len()` bytes (after a head: tunnel payload).
    #[track_caller]
    pub fn read_exact(&mut self, buf: &mut [u8]) {
        if let Err(e) = self.reader.read_exact(buf) {
            panic!(
                "reading {} bytes: {e}; received: \"{}\"",
                buf.len(),
                self.transcript()
            );
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        if let Err(e) = self.writer.write_all(bytes) {
            panic!("client write: {e}; received: \"{}\"", self.transcript());
        }
    }

    /// Like `send` but reports the error, for writes the proxy may refuse.
    pub fn try_send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes)
    }

    pub fn stream(&self) -> &TcpStream {
        &self.writer
    }

    /// Everything received so far (first 64 KiB), escaped.
    pub fn transcript(&self) -> String {
        escape(&self.reader.get_ref().seen)
    }

    /// Reads one response; `head_request` says the request was HEAD (no body).
    pub fn try_read_response(&mut self, head_request: bool) -> io::Result<Response> {
        let head = read_head(&mut self.reader)?.ok_or_else(|| eof("response (closed)"))?;
        let parsed = parse_head(&head);
        let version = parsed.start.first().cloned().unwrap_or_default();
        let status: u16 = parsed
            .start
            .get(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad status line in \"{}\"", escape(&head)),
                )
            })?;
        let reason = parsed.start.get(2).cloned().unwrap_or_default();
        let framing =
            if head_request || (100..200).contains(&status) || status == 204 || status == 304 {
                Framing::None
            } else if parsed
                .field("transfer-encoding")
                .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
            {
                Framing::Chunked
            } else if let Some(cl) = parsed.field("content-length") {
                Framing::Length(cl.trim().parse().map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, "bad content-length")
                })?)
            } else {
                Framing::Close
            };
        let mut raw_body = Vec::new();
        let mut body = Vec::new();
        {
            let mut on_raw = |b: &[u8]| raw_body.extend_from_slice(b);
            let mut on_data = |b: &[u8]| body.extend_from_slice(b);
            match framing {
                Framing::None => {}
                Framing::Length(n) => copy_exact(&mut self.reader, n, &mut on_raw, &mut on_data)?,
                Framing::Chunked => read_chunked(&mut self.reader, &mut on_raw, &mut on_data)?,
                Framing::Close => {
                    let mut rest = Vec::new();
                    self.reader.read_to_end(&mut rest)?;
                    on_raw(&rest);
                    on_data(&rest);
                }
            }
        }
        let mut raw = head.clone();
        raw.extend_from_slice(&raw_body);
        Ok(Response {
            raw,
            head,
            version,
            status,
            reason,
            fields: parsed.fields,
            body,
            raw_body,
        })
    }

    /// Reads only a response head (the body stays unread; see [`Client::body_reader`]).
    #[track_caller]
    pub fn read_response_head(&mut self) -> Response {
        let head = match read_head(&mut self.reader) {
            Ok(Some(head)) => head,
            Ok(None) => panic!("connection closed before a response head"),
            Err(e) => panic!("reading head: {e}; received: \"{}\"", self.transcript()),
        };
        let parsed = parse_head(&head);
        Response {
            raw: head.clone(),
            version: parsed.start.first().cloned().unwrap_or_default(),
            status: parsed
                .start
                .get(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            reason: parsed.start.get(2).cloned().unwrap_or_default(),
            head,
            fields: parsed.fields,
            body: Vec::new(),
            raw_body: Vec::new(),
        }
    }

    /// The buffered reader, for streaming a large body.
    pub fn body_reader(&mut self) -> &mut impl BufRead {
        &mut self.reader
    }

    /// Reads one response or panics with what arrived.
    #[track_caller]
    pub fn read_response(&mut self) -> Response {
        match self.try_read_response(false) {
            Ok(resp) => resp,
            Err(e) => panic!("reading response: {e}; received: \"{}\"", self.transcript()),
        }
    }

    /// Reads the response to a HEAD request.
    #[track_caller]
    pub fn read_head_response(&mut self) -> Response {
        match self.try_read_response(true) {
            Ok(resp) => resp,
            Err(e) => panic!("reading response: {e}; received: \"{}\"", self.transcript()),
        }
    }

    /// Sends `request` and reads its response.
    #[track_caller]
    pub fn request(&mut self, request: &[u8]) -> Response {
        self.send(request);
        self.read_response()
    }

    /// Sends a keep-alive `GET {path}` and reads the response.
    #[track_caller]
    pub fn get(&mut self, path: &str) -> Response {
        self.request(format!("GET {path} HTTP/1.1\r\nHost: test.local\r\n\r\n").as_bytes())
    }

    /// Whether the peer has closed: true on EOF or reset, false if nothing
    /// arrived within [`IO_TIMEOUT`]; panics if unexpected bytes arrive.
    #[track_caller]
    pub fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.reader.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => panic!(
                "expected the connection to close, got more bytes: \"{}\"",
                self.transcript()
            ),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                ) =>
            {
                true
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                false
            }
            Err(e) => panic!("waiting for close: {e}"),
        }
    }

    /// Asserts the proxy closes this connection (bounded by [`IO_TIMEOUT`]).
    #[track_caller]
    pub fn expect_closed(&mut self) {
        assert!(
            self.is_closed(),
            "connection still open after {IO_TIMEOUT:?}; received: \"{}\"",
            self.transcript()
        );
    }
}

/// Sends `request` on a fresh connection and returns the raw bytes of the
/// first full response (or, if the connection closes first, whatever came).
#[track_caller]
pub fn raw_request(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut client = Client::connect(addr);
    client.send(request);
    let is_head = request.starts_with(b"HEAD ");
    match client.try_read_response(is_head) {
        Ok(resp) => resp.raw,
        Err(_) => client.reader.get_ref().seen.clone(),
    }
}

/// Sends `request` on a fresh connection and asserts zgix answers with its own
/// `code reason` response, byte for byte, then closes the connection.
#[track_caller]
pub fn assert_refusal(addr: SocketAddr, request: &[u8], code: u16, reason: &str) {
    let mut client = Client::connect(addr);
    // A proxy that answers early may reset before the whole request is written;
    // the answer still has to be readable, so the write error alone is no failure.
    let _ = client.try_send(request);
    let resp = match client.try_read_response(false) {
        Ok(resp) => resp,
        Err(e) => panic!(
            "expected {code} {reason}, reading failed: {e}; received: \"{}\"",
            client.transcript()
        ),
    };
    assert_bytes(&unstamped(&resp.raw), &generated(code, reason));
    client.expect_closed();
}

/// A clean `GET /` on a fresh connection must get 200 `ok\n`: the proxy
/// survived whatever the test did before.
#[track_caller]
pub fn health_check(addr: SocketAddr) {
    let mut client = Client::connect(addr);
    let resp = client.request(b"GET / HTTP/1.1\r\nHost: health.test\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200, "health check got: \"{}\"", resp.show());
    assert_bytes(&resp.body, OK_BODY);
}

// ---------------------------------------------------------------------------
// Config and process
// ---------------------------------------------------------------------------

/// A zgix config document, built up in tests and rendered to JSON.
#[derive(Clone, Debug)]
pub struct Config {
    pub cpus: Option<Vec<u32>>,
    pub admin: bool,
    /// `(bind, cluster)` per listener.
    pub listeners: Vec<(String, String)>,
    /// `(name, endpoints, lb)` per cluster.
    pub clusters: Vec<(String, Vec<String>, String)>,
    pub limits: Vec<(String, u64)>,
}

impl Config {
    /// One listener on 127.0.0.1:0 forwarding to cluster `api` = `endpoints`, round robin.
    pub fn new(endpoints: &[SocketAddr]) -> Config {
        Config {
            cpus: None,
            admin: false,
            listeners: vec![("127.0.0.1:0".into(), "api".into())],
            clusters: vec![(
                "api".into(),
                endpoints.iter().map(|e| e.to_string()).collect(),
                "round_robin".into(),
            )],
            limits: Vec::new(),
        }
    }

    pub fn cpus(mut self, cpus: &[u32]) -> Config {
        self.cpus = Some(cpus.to_vec());
        self
    }

    pub fn admin(mut self) -> Config {
        self.admin = true;
        self
    }

    pub fn lb(mut self, lb: &str) -> Config {
        self.clusters[0].2 = lb.into();
        self
    }

    pub fn limit(mut self, name: &str, value: u64) -> Config {
        self.limits.push((name.into(), value));
        self
    }

    /// Adds cluster `name` and a listener on 127.0.0.1:0 forwarding to it.
    pub fn listener_for(mut self, name: &str, endpoints: &[SocketAddr]) -> Config {
        self.clusters.push((
            name.into(),
            endpoints.iter().map(|e| e.to_string()).collect(),
            "round_robin".into(),
        ));
        self.listeners.push(("127.0.0.1:0".into(), name.into()));
        self
    }

    pub fn to_json(&self) -> String {
        let quoted = |items: &[String]| {
            items
                .iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut out = String::from("{");
        if let Some(cpus) = &self.cpus {
            let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
            let _ = write!(out, "\"cpus\":[{}],", list.join(","));
        }
        if self.admin {
            out.push_str("\"admin\":{\"bind\":\"127.0.0.1:0\"},");
        }
        let listeners: Vec<String> = self
            .listeners
            .iter()
            .map(|(bind, cluster)| {
                format!("{{\"bind\":\"{bind}\",\"http\":{{\"cluster\":\"{cluster}\"}}}}")
            })
            .collect();
        let _ = write!(out, "\"listeners\":[{}],", listeners.join(","));
        let clusters: Vec<String> = self
            .clusters
            .iter()
            .map(|(name, endpoints, lb)| {
                format!(
                    "\"{name}\":{{\"endpoints\":[{}],\"lb\":\"{lb}\"}}",
                    quoted(endpoints)
                )
            })
            .collect();
        let _ = write!(out, "\"clusters\":{{{}}}", clusters.join(","));
        if !self.limits.is_empty() {
            let limits: Vec<String> = self
                .limits
                .iter()
                .map(|(k, v)| format!("\"{k}\":{v}"))
                .collect();
            let _ = write!(out, ",\"limits\":{{{}}}", limits.join(","));
        }
        out.push('}');
        out
    }
}

/// Splits an error-log line `<RFC 3339 ms> <level> <component>: <message>`
/// into level, component and message; `None` if the line has another shape.
pub fn log_message(line: &str) -> Option<(&str, &str, &str)> {
    let (ts, rest) = line.split_once(' ')?;
    let (level, rest) = rest.split_once(' ')?;
    let (component, msg) = rest.split_once(": ")?;
    let t = ts.as_bytes();
    let ts_ok = t.len() == 24
        && t[4] == b'-'
        && t[7] == b'-'
        && t[10] == b'T'
        && t[13] == b':'
        && t[16] == b':'
        && t[19] == b'.'
        && t[23] == b'Z'
        && [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 22]
            .iter()
            .all(|&i| t[i].is_ascii_digit());
    let level_ok = ["error", "warn", "info", "debug"].contains(&level);
    let component_ok = !component.is_empty()
        && component
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_');
    (ts_ok && level_ok && component_ok).then_some((level, component, msg))
}

/// Path of the zgix binary cargo built for these tests.
pub fn zgix_bin() -> &'static str {
    env!("CARGO_BIN_EXE_zgix")
}

/// A config file in the temp dir, removed on drop.
pub struct TempConfig {
    pub path: PathBuf,
}

impl TempConfig {
    pub fn new(contents: &str) -> TempConfig {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "zgix-test-{}-{}-{nanos}.json",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&path, contents).expect("write config");
        TempConfig { path }
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Output of a short zgix invocation.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs zgix with `args` to completion (bounded by [`IO_TIMEOUT`]).
pub fn run_zgix(args: &[&str]) -> Run {
    run_zgix_env(args, &[])
}

/// [`run_zgix`] with extra environment variables.
pub fn run_zgix_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut child = Command::new(zgix_bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn zgix");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut out = Vec::new();
            let _ = pipe.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let status = wait_timeout(&mut child, IO_TIMEOUT).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("zgix {args:?} did not exit within {IO_TIMEOUT:?}");
    });
    Run {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// A running zgix process. Dropping it sends SIGTERM, waits, then SIGKILLs.
pub struct Zgix {
    child: Child,
    exited: Option<ExitStatus>,
    /// Listener addresses by index, from the `listener N on ADDR` lines.
    pub listeners: Vec<SocketAddr>,
    pub admin: Option<SocketAddr>,
    /// N from `ready (N shards)`.
    pub shards: usize,
    log: Arc<Mutex<String>>,
    _config: TempConfig,
}

impl Zgix {
    /// Starts zgix on `config` and waits for its `ready` line.
    #[track_caller]
    pub fn start(config: &Config) -> Zgix {
        Zgix::start_json(&config.to_json())
    }

    /// Starts zgix on a raw JSON document and waits for its `ready` line.
    #[track_caller]
    pub fn start_json(json: &str) -> Zgix {
        let json = &with_test_defaults(json);
        let config = TempConfig::new(json);
        let mut child = Command::new(zgix_bin())
            .arg("--config")
            .arg(&config.path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn zgix");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        let thread_log = log.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(stderr);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line).into_owned();
                        thread_log.lock().unwrap().push_str(&text);
                        let _ = tx.send(text.trim_end().to_string());
                    }
                }
            }
        });
        let mut listeners: Vec<(usize, SocketAddr)> = Vec::new();
        let mut admin = None;
        let deadline = Instant::now() + START_TIMEOUT;
        let shards = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(e) => {
                    let _ = child.kill();
                    let status = child.wait().ok();
                    panic!(
                        "zgix did not get ready ({e:?}, exit status {status:?}); config:\n{json}\nstderr:\n{}",
                        log.lock().unwrap()
                    );
                }
            };
            let msg = log_message(&line).map_or("", |(_, _, m)| m);
            if let Some(rest) = msg.strip_prefix("listener ") {
                if let Some((n, addr)) = rest.split_once(" on ") {
                    let addr = addr.split(' ').next().unwrap_or("");
                    if let (Ok(n), Ok(addr)) = (n.parse(), addr.parse()) {
                        listeners.push((n, addr));
                    }
                }
            } else if let Some(addr) = msg.strip_prefix("admin on ") {
                admin = addr.trim().parse().ok();
            } else if let Some(rest) = msg.strip_prefix("ready (") {
                // "zgix: ready (N shards, DRIVER)"
                let driver = rest
                    .split(", ")
                    .nth(1)
                    .map(|d| d.trim_end_matches(')').to_string())
                    .unwrap_or_default();
                if let Ok(want) = std::env::var("ZGIX_TEST_DRIVER") {
                    assert_eq!(
                        driver,
                        want,
                        "zgix runs on {driver}, the suite asked for {want}:\n{}",
                        log.lock().unwrap()
                    );
                }
                break rest
                    .split(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
        };
        listeners.sort_by_key(|(n, _)| *n);
        Zgix {
            child,
            exited: None,
            listeners: listeners.into_iter().map(|(_, a)| a).collect(),
            admin,
            shards,
            log,
            _config: config,
        }
    }

    /// The first listener's address.
    #[track_caller]
    pub fn addr(&self) -> SocketAddr {
        *self
            .listeners
            .first()
            .unwrap_or_else(|| panic!("no listener line in stderr:\n{}", self.stderr()))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything zgix wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends a signal by name (`TERM`, `KILL`, ...) with kill(1).
    pub fn signal(&self, name: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = wait_timeout(&mut self.child, timeout);
        }
        self.exited
    }

    /// Peak resident set size (`VmHWM`) in KiB.
    #[track_caller]
    pub fn vm_hwm_kib(&self) -> u64 {
        let path = Path::new("/proc")
            .join(self.pid().to_string())
            .join("status");
        let status = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmHWM in {}", path.display()))
    }
}

impl Drop for Zgix {
    fn drop(&mut self) {
        if self.exited.is_some() {
            return;
        }
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        self.signal("TERM");
        if wait_timeout(&mut self.child, Duration::from_secs(5)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What every config of the suite gets unless it says otherwise:
/// - `"via": false`, so the many tests that compare forwarded heads byte for
///   byte see only what they are about (the Via tests set `via` themselves);
/// - `"request_id": false` on every listener's `http`, for the same reason
///   (proxy/tests/request_id.rs sets it);
/// - the socket driver `ZGIX_TEST_DRIVER` (`uring` or `epoll`, as CI sets it);
///   unset, zgix's default applies.
pub fn with_test_defaults(json: &str) -> String {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(json) else {
        return json.to_string();
    };
    let driver = std::env::var("ZGIX_TEST_DRIVER").ok();
    if let Some(obj) = v.as_object_mut() {
        obj.entry("via").or_insert(serde_json::Value::Bool(false));
        // Like Via, the request ID (a random X-Request-ID by default) is off
        // unless a test asks for it, so exact heads stay exact.
        if let Some(ls) = obj.get_mut("listeners").and_then(|l| l.as_array_mut()) {
            for http in ls
                .iter_mut()
                .filter_map(|l| l.get_mut("http")?.as_object_mut())
            {
                http.entry("request_id")
                    .or_insert(serde_json::Value::Bool(false));
            }
        }
        if let Some(driver) = driver {
            let io = obj
                .entry("io")
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            if let Some(io) = io.as_object_mut() {
                io.entry("driver")
                    .or_insert(serde_json::Value::String(driver));
            }
        }
    }
    v.to_string()
}

/// zgix's `/metrics` text (started with an admin endpoint).
#[track_caller]
pub fn metrics_text(zgix: &Zgix) -> String {
    let admin = zgix.admin.expect("zgix started without admin");
    let mut c = Client::connect(admin);
    let resp = c.request(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200, "metrics: {}", resp.show());
    String::from_utf8(resp.body).expect("/metrics is UTF-8")
}

/// The value of the series `key` (name and labels, exactly) in `text`.
#[track_caller]
pub fn series(text: &str, key: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in metrics:\n{text}"))
}

/// The value of an unlabelled series in zgix's `/metrics`.
#[track_caller]
pub fn metric(zgix: &Zgix, name: &str) -> f64 {
    series(&metrics_text(zgix), name)
}

/// Shard 0's heap allocations so far (`zgix_heap_allocations_total`).
pub fn heap_allocations(zgix: &Zgix) -> u64 {
    let admin = zgix.admin.expect("admin configured");
    let mut client = Client::connect(admin);
    let resp = client.request(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200);
    let text = String::from_utf8(resp.body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("zgix_heap_allocations_total{shard=\"0\"} "))
        .unwrap_or_else(|| panic!("no allocation counter in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Allocations of shard 0 over a window in which `requests` requests
/// (`request(i)`) are sent on the warm connection, and how long the requests took. The window always
/// contains exactly one /metrics scrape (which does allocate) and lasts at
/// least `at_least` plus fixed margins, so two windows of the same length
/// differ only by the requests: glommio's timer wheel allocates a little
/// each time its loop fires timers, which is per unit of time, not per
/// request.
pub fn allocation_window(
    zgix: &Zgix,
    client: &mut Client,
    requests: usize,
    at_least: Duration,
    request: impl Fn(usize) -> String,
) -> (u64, Duration) {
    // Let the 100 ms tick publish everything before the window opens.
    thread::sleep(Duration::from_millis(350));
    let before = heap_allocations(zgix);
    let start = Instant::now();
    for i in 0..requests {
        let resp = client.request(request(i).as_bytes());
        assert_eq!(resp.status, 200, "{}", resp.show());
    }
    let took = start.elapsed();
    if let Some(rest) = at_least.checked_sub(took) {
        thread::sleep(rest);
    }
    thread::sleep(Duration::from_millis(350));
    (heap_allocations(zgix) - before, took)
}
