//! The scripted origin of the harness: one thread per connection, keep-alive, its answer chosen by the request path, every request recorded.

use super::*;

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
pub(super) enum Framing {
    Length(u64),
    Chunked,
    Close,
    None,
}

/// A parsed head: start line split on spaces, and its fields.
pub(super) struct Head {
    pub(super) start: Vec<String>,
    pub(super) fields: Vec<(String, String)>,
}

impl Head {
    pub(super) fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn request_framing(&self) -> Framing {
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

pub(super) fn parse_head(raw: &[u8]) -> Head {
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
pub(super) fn read_head(r: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
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

pub(super) fn eof(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, format!("EOF inside {what}"))
}

/// Copies exactly `n` bytes, handing each piece to `raw` and `data`.
pub(super) fn copy_exact(
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
pub(super) fn read_chunked(
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

/// `/page`: an HTML page for a browser, with a script and two images it
/// fetches from the same origin (so one connection carries several streams).
pub const PAGE_HTML: &[u8] = b"<!doctype html><html><head><title>zgix</title></head><body>\
<p id=\"proto\">not run</p><script src=\"/page.js\"></script>\
<img src=\"/cl/100\"><img src=\"/cl/200\"></body></html>";
/// `/page.js`: writes the protocol the browser fetched the page and the
/// script over (Navigation and Resource Timing's `nextHopProtocol`).
pub const PAGE_JS: &[u8] = b"var nav = performance.getEntriesByType('navigation')[0];\n\
var js = performance.getEntriesByType('resource').filter(function (e) { return e.name.endsWith('/page.js'); })[0];\n\
document.getElementById('proto').textContent = 'page ' + nav.nextHopProtocol + ' script ' + (js ? js.nextHopProtocol : 'none');\n";

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
        "/page" | "/page.js" => {
            let (kind, body) = if path == "/page" {
                ("text/html", PAGE_HTML)
            } else {
                ("text/javascript", PAGE_JS)
            };
            write!(
                w,
                "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nx-origin: {name}\r\n\r\n",
                body.len()
            )?;
            if !is_head {
                w.write_all(body)?;
            }
            Ok(true)
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
