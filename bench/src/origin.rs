//! `zgix-bench origin`: a fast keep-alive HTTP/1.1 origin, one executor per CPU, every socket on zgix's own driver.
//!
//! Every executor binds the same address with SO_REUSEPORT, so the kernel
//! spreads connections over the executors and no socket is shared between
//! threads. Per request the steady state is one `recv` and one `send`:
//! responses are preformatted once at start-up, and the responses to all
//! requests found in one read (pipelining) go out in one write.
//!
//! All of an executor's sockets, its accepts and its timers (`--delay-ms`,
//! the accept back-off) are on one [`zgix::io::Driver`] (the epoll backend,
//! no busy polling, as nginx does), the same driver the proxy's shards run:
//! nothing waits on glommio's reactor, which only runs the tasks. The origin
//! usually shares a core with the load generator, and io_uring readiness
//! would have every packet a proxy on another core sends it interrupt that
//! shared core (see `zgix::io` for the measurement).
//!
//! An origin run once stopped accepting after light traffic, parked for good
//! in glommio's reactor (`Reactor::link_rings_and_sleep`) with its listen
//! queue stuck and its connections in CLOSE-WAIT (issue 19). Then the
//! `--delay-ms` mode, and any executor whose epoll set could not be made,
//! served on glommio's own sockets and timers; now nothing does, and an
//! executor without a driver is a start-up error. glommio only runs the
//! tasks: the driver task is always runnable (it yields every turn and
//! sleeps in its own `epoll_wait`), so glommio never parks in its reactor.
//! `tests/origin.rs` checks that a new connection is still accepted and
//! served after many keep-alive ones have come and gone.

use crate::args::{parse_cpu_list, Args};
use crate::executor;
use crate::http::{self, BodyKind, ChunkedDecoder, FrameError, Head};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;
use zgix::io::{Driver, Kind, Listener, Options, Sock};

pub const USAGE: &str = "\
zgix-bench origin --bind ADDR [--cpus 0,1] [--body-bytes N] [--delay-ms N] [--chunked] [--chunk-bytes N] [--echo]

  --bind ADDR       address to listen on (port 0 picks one; printed when ready)
  --cpus LIST       one executor per CPU, e.g. 0,1 or 0-3 (default 0)
  --body-bytes N    response body size (default 64)
  --delay-ms N      wait N ms before each write of responses (default 0)
  --chunked         send the body with Transfer-Encoding: chunked
  --chunk-bytes N   with --chunked, chunks of N bytes (default 0: the whole body in one)
  --echo            answer with the request body (Content-Length or chunked requests)

Prints `origin: listening on ADDR` on stdout once every executor accepts.";

/// Default response body size: small, like the static responses edge proxies
/// are usually benchmarked with, so the numbers measure per-request overhead.
pub const DEFAULT_BODY_BYTES: usize = 64;

/// Read buffer per connection: one full header block (the framing cap) plus
/// room for the start of the next pipelined request.
const READ_BUF: usize = http::MAX_HEAD_BYTES + 4096;

/// Echoed bodies are buffered whole; beyond this the request gets 413.
const MAX_ECHO_BODY: usize = 64 << 20;

/// Pending responses are flushed once they reach this size even if more
/// pipelined requests are waiting, so a deep pipeline cannot grow memory.
const FLUSH_AT: usize = 256 << 10;

/// Origin settings.
#[derive(Clone, Debug)]
pub struct OriginConfig {
    pub bind: SocketAddr,
    pub cpus: Vec<usize>,
    pub body_bytes: usize,
    pub delay: Duration,
    pub chunked: bool,
    /// With `chunked`, the size of each chunk (0: the whole body in one).
    pub chunk_bytes: usize,
    pub echo: bool,
}

impl OriginConfig {
    /// Parses the `origin` subcommand's flags.
    pub fn from_args(mut a: Args) -> Result<Self, String> {
        let bind = a
            .value("--bind")?
            .ok_or("origin needs --bind ADDR (e.g. 127.0.0.1:9000)")?;
        let bind = bind.parse().map_err(|e| format!("--bind {bind:?}: {e}"))?;
        let cpus = match a.value("--cpus")? {
            Some(s) => parse_cpu_list(&s)?,
            None => vec![0],
        };
        let cfg = OriginConfig {
            bind,
            cpus,
            body_bytes: a.parsed("--body-bytes")?.unwrap_or(DEFAULT_BODY_BYTES),
            delay: Duration::from_millis(a.parsed("--delay-ms")?.unwrap_or(0)),
            chunked: a.switch("--chunked"),
            chunk_bytes: a.parsed("--chunk-bytes")?.unwrap_or(0),
            echo: a.switch("--echo"),
        };
        a.finish()?;
        Ok(cfg)
    }
}

/// Preformatted responses, built once per executor.
struct Responses {
    keep_alive: Vec<u8>,
    close: Vec<u8>,
    head_keep_alive: Vec<u8>,
    head_close: Vec<u8>,
}

impl Responses {
    fn new(cfg: &OriginConfig) -> Self {
        let body = vec![b'x'; cfg.body_bytes];
        let chunk = cfg.chunked.then_some(cfg.chunk_bytes);
        Responses {
            keep_alive: framed(200, &body, chunk, false, false),
            close: framed(200, &body, chunk, true, false),
            head_keep_alive: framed(200, &body, chunk, false, true),
            head_close: framed(200, &body, chunk, true, true),
        }
    }

    fn pick(&self, head: &Head) -> &[u8] {
        match (head.is_head, head.close) {
            (false, false) => &self.keep_alive,
            (false, true) => &self.close,
            (true, false) => &self.head_keep_alive,
            (true, true) => &self.head_close,
        }
    }
}

/// Formats a whole response. With `head_only` the framing headers are kept
/// but the body is left out (RFC 9110 §9.3.2).
fn response(status: u16, body: &[u8], chunked: bool, close: bool, head_only: bool) -> Vec<u8> {
    framed(status, body, chunked.then_some(0), close, head_only)
}

/// [`response`] with the chunk size: `Some(k)` sends the body chunked in
/// chunks of `k` bytes (0: one chunk), `None` with a Content-Length.
fn framed(status: u16, body: &[u8], chunk: Option<usize>, close: bool, head_only: bool) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let mut out =
        format!("HTTP/1.1 {status} {reason}\r\nServer: zgix-bench\r\nContent-Type: text/plain\r\n")
            .into_bytes();
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    if let Some(k) = chunk {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
        if !head_only {
            let k = if k == 0 { body.len().max(1) } else { k };
            for piece in body.chunks(k) {
                out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                out.extend_from_slice(piece);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
        }
    } else {
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        if !head_only {
            out.extend_from_slice(body);
        }
    }
    out
}

/// A running origin: its bound address and its executor threads.
pub struct Origin {
    pub addr: SocketAddr,
    pub threads: Vec<executor::Handle<()>>,
}

/// Starts one executor per CPU. The first binds `cfg.bind` (resolving port 0);
/// the others bind the resolved address so SO_REUSEPORT groups them.
pub fn start(cfg: &OriginConfig) -> Result<Origin, String> {
    let mut addr = cfg.bind;
    let mut threads = Vec::new();
    for (i, &cpu) in cfg.cpus.iter().enumerate() {
        let (tx, rx) = mpsc::channel::<Result<SocketAddr, String>>();
        let shard_cfg = cfg.clone();
        let handle = executor::spawn(&format!("origin-{i}"), Some(cpu), move || async move {
            let (driver, listener) = match listen(addr) {
                Ok(v) => v,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let _ = tx.send(listener.local_addr().map_err(|e| e.to_string()));
            accept_loop(&driver, listener, shard_cfg).await;
        })?;
        match rx.recv() {
            Ok(Ok(bound)) => addr = bound,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(format!("origin executor {i} exited while binding")),
        }
        threads.push(handle);
    }
    Ok(Origin { addr, threads })
}

/// Runs the `origin` subcommand until killed.
pub fn run(cfg: OriginConfig) -> Result<(), String> {
    let origin = start(&cfg)?;
    println!("origin: listening on {}", origin.addr);
    for t in origin.threads {
        t.join();
    }
    Ok(())
}

/// The executor's driver, running, and its listener on `addr`.
fn listen(addr: SocketAddr) -> Result<(Rc<Driver>, Listener), String> {
    // No busy polling (spin 0): the origin shares its core with the load generator.
    let driver = Driver::new(&Options::new(Kind::Epoll))
        .map_err(|e| format!("cannot create the socket driver: {e}"))?;
    glommio::spawn_local(driver.clone().run()).detach();
    let fd = zgix::io::bind_listener(addr).map_err(|e| format!("cannot bind {addr}: {e}"))?;
    let listener = Listener::from_fd(fd, &driver)
        .map_err(|e| format!("cannot watch the listener on {addr}: {e}"))?;
    Ok((driver, listener))
}

async fn accept_loop(driver: &Rc<Driver>, listener: Listener, cfg: OriginConfig) {
    let responses = Rc::new(Responses::new(&cfg));
    let cfg = Rc::new(cfg);
    loop {
        match listener.accept().await {
            Ok((sock, _)) => {
                let _ = sock.set_nodelay(true);
                let (responses, cfg) = (responses.clone(), cfg.clone());
                // Errors while serving are the client's doing (reset,
                // garbage): closing the connection is the whole handling.
                glommio::spawn_local(async move {
                    let _ = serve(sock, &responses, &cfg).await;
                })
                .detach();
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                eprintln!("origin: accept: {e}");
                driver.sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Where the connection is in the current request.
enum State {
    Head,
    /// Content-Length body with this many bytes still to come.
    Body(Head, usize),
    Chunked(Head, ChunkedDecoder),
}

async fn serve(stream: Sock, resp: &Responses, cfg: &OriginConfig) -> std::io::Result<()> {
    let mut buf = vec![0u8; READ_BUF];
    let (mut pos, mut filled) = (0usize, 0usize);
    let mut out: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut echo_body: Vec<u8> = Vec::new();
    let mut state = State::Head;
    loop {
        // Answer every request that is complete in the buffer.
        let mut closing = false;
        loop {
            let avail = &buf[pos..filled];
            match &mut state {
                State::Head => match http::parse_request(avail) {
                    Ok(None) => break,
                    Ok(Some(head)) => {
                        pos += head.len;
                        echo_body.clear();
                        state = match head.body {
                            BodyKind::Length(0) | BodyKind::UntilClose => {
                                closing = respond(&mut out, resp, cfg, &head, &echo_body);
                                State::Head
                            }
                            BodyKind::Length(n) if cfg.echo && n > MAX_ECHO_BODY => {
                                out.extend_from_slice(&response(413, b"", false, true, false));
                                closing = true;
                                State::Head
                            }
                            BodyKind::Length(n) => State::Body(head, n),
                            BodyKind::Chunked => State::Chunked(head, ChunkedDecoder::default()),
                        };
                    }
                    Err(e) => {
                        let status = if e == FrameError::HeadTooLarge {
                            431
                        } else {
                            400
                        };
                        out.extend_from_slice(&response(status, b"", false, true, false));
                        closing = true;
                    }
                },
                State::Body(head, left) => {
                    let take = (*left).min(avail.len());
                    if take == 0 {
                        break;
                    }
                    if cfg.echo {
                        echo_body.extend_from_slice(&avail[..take]);
                    }
                    pos += take;
                    *left -= take;
                    if *left == 0 {
                        closing = respond(&mut out, resp, cfg, head, &echo_body);
                        state = State::Head;
                    }
                }
                State::Chunked(head, dec) => {
                    let sink = cfg.echo.then_some(&mut echo_body);
                    match dec.feed(avail, sink) {
                        Ok(n) => {
                            pos += n;
                            if dec.is_done() {
                                closing = respond(&mut out, resp, cfg, head, &echo_body);
                                state = State::Head;
                            } else if echo_body.len() > MAX_ECHO_BODY {
                                out.extend_from_slice(&response(413, b"", false, true, false));
                                closing = true;
                            } else if n == 0 {
                                break;
                            }
                        }
                        Err(_) => {
                            out.extend_from_slice(&response(400, b"", false, true, false));
                            closing = true;
                        }
                    }
                }
            }
            if closing || out.len() >= FLUSH_AT {
                break;
            }
        }
        if !out.is_empty() {
            if !cfg.delay.is_zero() {
                stream.driver().sleep(cfg.delay).await;
            }
            stream.write_all(&out).await?;
            out.clear();
        }
        if closing {
            return Ok(());
        }
        if pos == filled {
            pos = 0;
            filled = 0;
        } else if filled == buf.len() {
            if pos == 0 {
                // A header block that fills the whole buffer is over the cap.
                stream
                    .write_all(&response(431, b"", false, true, false))
                    .await?;
                return Ok(());
            }
            buf.copy_within(pos..filled, 0);
            filled -= pos;
            pos = 0;
        }
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Ok(());
        }
        filled += n;
    }
}

/// Appends the response to one request; returns true when the connection
/// must close after it.
fn respond(
    out: &mut Vec<u8>,
    resp: &Responses,
    cfg: &OriginConfig,
    head: &Head,
    body: &[u8],
) -> bool {
    if cfg.echo {
        out.extend_from_slice(&response(200, body, cfg.chunked, head.close, head.is_head));
    } else {
        out.extend_from_slice(resp.pick(head));
    }
    head.close
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preformatted_responses_frame_correctly() {
        let body = b"hello";
        let r = response(200, body, false, false, false);
        let h = http::parse_response(&r, false).unwrap().unwrap();
        assert_eq!(h.body, BodyKind::Length(5));
        assert_eq!(&r[h.len..], b"hello");

        let r = response(200, body, true, true, false);
        let h = http::parse_response(&r, false).unwrap().unwrap();
        assert!(h.close);
        let mut dec = ChunkedDecoder::default();
        let mut out = Vec::new();
        let n = dec.feed(&r[h.len..], Some(&mut out)).unwrap();
        assert!(dec.is_done());
        assert_eq!(n, r.len() - h.len);
        assert_eq!(out, b"hello");

        let r = response(200, b"", true, false, false);
        assert!(r.ends_with(b"\r\n\r\n0\r\n\r\n"));
        let r = response(200, body, false, false, true);
        assert!(r.ends_with(b"Content-Length: 5\r\n\r\n"));
    }

    #[test]
    fn chunk_bytes_splits_the_body() {
        let r = framed(200, b"hello", Some(2), false, false);
        let h = http::parse_response(&r, false).unwrap().unwrap();
        assert_eq!(&r[h.len..], b"2\r\nhe\r\n2\r\nll\r\n1\r\no\r\n0\r\n\r\n");
        let r = framed(200, b"hello", Some(0), false, false);
        assert!(r.ends_with(b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n"));
    }

    /// Sends raw bytes, reads until the server closes, returns everything read.
    fn exchange(addr: SocketAddr, req: &[u8]) -> Vec<u8> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(req).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn echo_pipelined_chunked_and_bad_requests() {
        let cfg = OriginConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            cpus: vec![0],
            body_bytes: 0,
            delay: Duration::ZERO,
            chunked: false,
            chunk_bytes: 0,
            echo: true,
        };
        let addr = start(&cfg).unwrap().addr;
        let out = exchange(
            addr,
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc\
              POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n1;x\r\nf\r\n0\r\n\r\n\
              GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 3, "{text}");
        assert!(text.contains("Content-Length: 3\r\n\r\nabc"), "{text}");
        assert!(text.contains("Content-Length: 3\r\n\r\ndef"), "{text}");
        assert!(
            text.ends_with("Connection: close\r\nContent-Length: 0\r\n\r\n"),
            "{text}"
        );

        let out = exchange(
            addr,
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        assert!(out.starts_with(b"HTTP/1.1 400 Bad Request\r\n"));
        // The origin still serves a clean request afterwards.
        let out = exchange(addr, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(out.starts_with(b"HTTP/1.1 200 OK\r\n"));
    }

    #[test]
    fn delay_holds_each_response_back() {
        // --delay-ms waits on the driver's timers.
        let cfg = OriginConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            cpus: vec![0],
            body_bytes: 5,
            delay: Duration::from_millis(40),
            chunked: false,
            chunk_bytes: 0,
            echo: false,
        };
        let addr = start(&cfg).unwrap().addr;
        let t0 = std::time::Instant::now();
        let out = exchange(addr, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(t0.elapsed() >= Duration::from_millis(40), "answered early");
        assert!(out.starts_with(b"HTTP/1.1 200 OK\r\n"));
        assert!(out.ends_with(b"Content-Length: 5\r\n\r\nxxxxx"));
    }
}
