//! Raw-byte clients of the harness: a transcript-keeping HTTP/1.1 client, connects from chosen source addresses, and refusal and health checks.

use super::*;

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
