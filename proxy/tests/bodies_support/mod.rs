//! What the bulk-path tests share (`bodies.rs`, `bodies_chunked.rs`): FNV digests of the pattern bytes, an origin that sends and takes bodies by Content-Length or chunked (and reports what it got), and the waits and checks on zgix's relayed and spliced byte counters.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{
    metrics_after_tick, metrics_text, pattern, pattern_byte, series, Client, Config, Zgix,
    IO_TIMEOUT,
};

pub const MIB: u64 = 1 << 20;
/// Bytes of a body that may go the copy path before the bulk path starts:
/// what arrives with the head plus one streaming buffer.
pub const COPY_SLACK: u64 = 256 << 10;

/// FNV-1a over `bytes`, continuing from `h`.
pub fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

pub const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

/// The FNV-1a of the first `n` pattern bytes (a block of whole 26-letter
/// cycles, repeated).
pub fn pattern_fnv(n: u64) -> u64 {
    repeated_fnv(&pattern(26 * 40_960), n)
}

/// The FNV-1a of `n` bytes of `block` repeated.
pub fn repeated_fnv(block: &[u8], n: u64) -> u64 {
    let mut h = FNV0;
    let mut left = n;
    while left > 0 {
        let take = left.min(block.len() as u64) as usize;
        h = fnv(h, &block[..take]);
        left -= take as u64;
    }
    h
}

/// An origin for bodies: `GET /cl/N` sends N pattern bytes with a
/// Content-Length, `GET /chunked/N[/K]` the same chunked ([`chunked_wire`]),
/// `GET /badchunk/K` one chunk of K bytes and then bad framing; a POST
/// (Content-Length or chunked) is read whole and answered `"{length}
/// {fnv}"`, and its outcome reported on `uploads` (a chunked upload with an
/// extension or a trailer counts as broken: zgix re-encodes without them).
/// `sent` counts the response body bytes its writes handed to the kernel.
pub struct BodyOrigin {
    pub addr: SocketAddr,
    pub sent: Arc<AtomicU64>,
    pub uploads: Mutex<mpsc::Receiver<Result<u64, String>>>,
}

impl BodyOrigin {
    pub fn start() -> BodyOrigin {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let sent = Arc::new(AtomicU64::new(0));
        let s = sent.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let (s, tx) = (s.clone(), tx.clone());
                std::thread::spawn(move || {
                    let _ = serve(c, &s, &tx);
                });
            }
        });
        BodyOrigin {
            addr,
            sent,
            uploads: Mutex::new(rx),
        }
    }

    /// The outcome of the next upload to end (waits up to the I/O timeout).
    #[track_caller]
    pub fn next_upload(&self) -> Result<u64, String> {
        match self.uploads.lock().unwrap().recv_timeout(IO_TIMEOUT) {
            Ok(r) => r,
            Err(e) => panic!("no upload ended within {IO_TIMEOUT:?}: {e}"),
        }
    }
}

/// Default chunk size of `/chunked/N`: not a divisor of the pattern's cycle.
pub const CHUNK: u64 = 26 * 3_846 + 7;

/// The pieces `/chunked/{n}/{k}` writes, one write each, in order: chunks
/// of `k` pattern bytes (the last shorter) as size line, data and CRLF,
/// every other size line of the first 16 with an extension (zgix allows
/// 16 KiB of them per message), then the last chunk with a trailer. `k` is at most 1 MiB.
pub fn chunked_wire(n: u64, k: u64) -> Vec<Vec<u8>> {
    let block = pattern(26 * 40_960);
    let mut out = Vec::new();
    let mut at = 0u64;
    let mut i = 0u64;
    while at < n {
        let len = (n - at).min(k);
        out.push(if i % 2 == 1 && i < 16 {
            format!("{len:x};i={i}\r\n").into_bytes()
        } else {
            format!("{len:X}\r\n").into_bytes()
        });
        let from = (at % 26) as usize;
        out.push(block[from..from + len as usize].to_vec());
        out.push(b"\r\n".to_vec());
        at += len;
        i += 1;
    }
    out.push(b"0\r\nX-Sum: ok\r\n\r\n".to_vec());
    out
}

/// The response body of `/chunked/{n}/{k}` as framed on the wire.
pub fn chunked_bytes(n: u64, k: u64) -> Vec<u8> {
    chunked_wire(n, k).concat()
}

pub fn serve(
    c: TcpStream,
    sent: &AtomicU64,
    uploads: &mpsc::Sender<Result<u64, String>>,
) -> std::io::Result<()> {
    let mut w = c.try_clone()?;
    let mut r = BufReader::with_capacity(256 << 10, c);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = Vec::new();
            if r.read_until(b'\n', &mut line)? == 0 {
                return Ok(());
            }
            let end = line == b"\r\n";
            head.extend_from_slice(&line);
            if end {
                break;
            }
        }
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let first = text.lines().next().unwrap_or("").to_string();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        };
        if first.starts_with("post") {
            let got = if field("transfer-encoding:").is_some() {
                read_chunked(&mut r)
            } else {
                let n: u64 = field("content-length:")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                read_exact_fnv(&mut r, n)
            };
            let _ = uploads.send(got.as_ref().map(|g| g.0).map_err(|e| e.to_string()));
            let (len, h) = got?;
            let body = format!("{len} {h:016x}");
            write!(
                w,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )?;
            continue;
        }
        let path = first.split(' ').nth(1).unwrap_or("/").to_string();
        let num = |s: Option<&str>| s.and_then(|v| v.parse::<u64>().ok());
        if let Some(rest) = path.strip_prefix("/chunked/") {
            let mut it = rest.split('/');
            let n = num(it.next()).unwrap_or(0);
            let k = num(it.next()).unwrap_or(CHUNK);
            w.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")?;
            for piece in chunked_wire(n, k) {
                w.write_all(&piece)?;
                sent.fetch_add(piece.len() as u64, Ordering::Release);
            }
            continue;
        }
        if let Some(k) = num(path.strip_prefix("/badchunk/")) {
            // RFC 9112 §7.1: chunk-data is followed by CRLF; "XX" is not.
            write!(
                w,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{k:x}\r\n"
            )?;
            w.write_all(&pattern(k))?;
            w.write_all(b"XX1\r\na\r\n0\r\n\r\n")?;
            continue;
        }
        let n = num(path.strip_prefix("/cl/")).unwrap_or(0);
        write!(w, "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n")?;
        let mut at = 0u64;
        // Whole 26-letter cycles: every block starts at a cycle's first
        // byte, so one block serves the whole body (no per-byte work).
        let block = pattern(26 * 3_846);
        while at < n {
            let take = (n - at).min(block.len() as u64) as usize;
            w.write_all(&block[..take])?;
            at += take as u64;
            sent.store(at, Ordering::Release);
        }
    }
}

pub fn read_exact_fnv(r: &mut impl Read, n: u64) -> std::io::Result<(u64, u64)> {
    let mut h = FNV0;
    let mut left = n;
    let mut buf = vec![0u8; 256 << 10];
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let k = r.read(&mut buf[..want])?;
        if k == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        h = fnv(h, &buf[..k]);
        left -= k as u64;
    }
    Ok((n, h))
}

pub fn read_chunked(r: &mut impl BufRead) -> std::io::Result<(u64, u64)> {
    let (mut len, mut h) = (0u64, FNV0);
    loop {
        let mut line = String::new();
        r.read_line(&mut line)?;
        if line.contains(';') {
            return Err(std::io::Error::other(format!("a chunk-ext came: {line:?}")));
        }
        let size = u64::from_str_radix(line.trim(), 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk line {line:?}")))?;
        if size == 0 {
            let mut end = String::new();
            r.read_line(&mut end)?;
            if end != "\r\n" {
                return Err(std::io::Error::other(format!("a trailer came: {end:?}")));
            }
            return Ok((len, h));
        }
        let (_, ch) = read_exact_fnv_from(r, size, h)?;
        h = ch;
        len += size;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(std::io::Error::other(format!(
                "no CRLF after data: {crlf:?}"
            )));
        }
    }
}

pub fn read_exact_fnv_from(r: &mut impl Read, n: u64, h0: u64) -> std::io::Result<(u64, u64)> {
    let mut h = h0;
    let mut left = n;
    let mut buf = vec![0u8; 64 << 10];
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        r.read_exact(&mut buf[..want])?;
        h = fnv(h, &buf[..want]);
        left -= want as u64;
    }
    Ok((n, h))
}

/// Bytes on the bulk path so far: spliced (both drivers) plus received
/// buffers relayed as they are (uring, when the shard's pipes ran out).
pub fn bulk_bytes(zgix: &Zgix) -> u64 {
    bulk_in(&metrics_text(zgix))
}

/// Bulk-path bytes in a metrics text.
pub fn bulk_in(m: &str) -> u64 {
    (series(m, "zgix_io_spliced_bytes_total") + series(m, "zgix_io_relayed_bytes_total")) as u64
}

/// Waits (up to the I/O timeout) until the shard tick has published at
/// least `want` bulk-path bytes; returns the value seen.
#[track_caller]
pub fn wait_bulk_bytes(zgix: &Zgix, want: u64) -> u64 {
    wait_for(zgix, "bulk-path bytes", |_| {
        let v = bulk_bytes(zgix);
        (v >= want).then_some(v)
    })
}

/// Waits (up to the I/O timeout) until the shard tick has published a
/// value of the series `key` that `ok` accepts; returns it.
#[track_caller]
pub fn wait_series(zgix: &Zgix, key: &str, ok: impl Fn(f64) -> bool) -> f64 {
    wait_for(zgix, key, |m| Some(series(m, key)).filter(|&v| ok(v)))
}

/// Polls zgix's metrics until `f` returns a value (fails after the I/O timeout,
/// naming `what` and the last metrics).
#[track_caller]
pub fn wait_for<T>(zgix: &Zgix, what: &str, f: impl Fn(&str) -> Option<T>) -> T {
    let until = Instant::now() + IO_TIMEOUT;
    loop {
        let m = metrics_text(zgix);
        if let Some(v) = f(&m) {
            return v;
        }
        assert!(
            Instant::now() < until,
            "{what} never came as expected; metrics:\n{m}"
        );
        // A poll interval, not a wait for an event: the shard tick publishes
        // the counters every 100 ms, and rendering them costs both ends.
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn proxy() -> (BodyOrigin, Zgix) {
    let origin = BodyOrigin::start();
    let zgix = Zgix::start(&Config::new(&[origin.addr]).admin());
    (origin, zgix)
}

/// Reads a Content-Length body of `n` bytes, checking every byte against
/// the pattern; returns its FNV-1a. `step` bounds each read.
pub fn read_pattern_body(
    client: &mut Client,
    n: u64,
    step: usize,
    mut each: impl FnMut(u64),
) -> u64 {
    let mut h = FNV0;
    let mut got = 0u64;
    let reader = client.body_reader();
    while got < n {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) => panic!("body read after {got} of {n} bytes: {e}"),
        };
        assert!(!buf.is_empty(), "closed after {got} of {n} bytes");
        let take = buf.len().min(step).min((n - got) as usize);
        for (i, &b) in buf[..take].iter().enumerate() {
            assert_eq!(b, pattern_byte(got + i as u64), "byte {}", got + i as u64);
        }
        h = fnv(h, &buf[..take]);
        reader.consume(take);
        got += take as u64;
        each(got);
    }
    h
}

/// Received-buffer bytes one 1 MiB body on a pooled connection may relay
/// (uring) before its splices start: the buffer the head came in, one
/// more, and slack for a head split across two.
pub const RELAY_SLACK: u64 = 64 << 10;

/// An origin for bodies behind a zgix of one shard, whose tick then
/// publishes everything that shard did before it (`metrics_after_tick`).
pub fn proxy_one_shard() -> (BodyOrigin, Zgix) {
    let origin = BodyOrigin::start();
    let zgix = Zgix::start(&Config::new(&[origin.addr]).cpus(&[0]).admin());
    (origin, zgix)
}

/// The bytes relayed from received buffers and spliced so far, once the
/// shard tick has published everything done before the call.
pub fn relayed_and_spliced(zgix: &Zgix) -> (u64, u64) {
    let m = metrics_after_tick(zgix);
    (
        series(&m, "zgix_io_relayed_bytes_total") as u64,
        series(&m, "zgix_io_spliced_bytes_total") as u64,
    )
}

/// At most [`COPY_SLACK`] of the `n` bytes missed the bulk path (relayed
/// from received buffers or spliced).
pub fn assert_on_the_bulk_path(relayed: u64, spliced: u64, n: u64) {
    assert!(
        relayed + spliced >= n - COPY_SLACK,
        "{spliced} bytes of {n} spliced, {relayed} relayed"
    );
}

/// The next request on `client`'s connection gets its own answer: the
/// connection is in sync after what came before.
pub fn assert_in_sync(client: &mut Client) {
    let r = client.get("/cl/5");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"abcde");
}

/// zgix still answers a small request on a new connection.
pub fn assert_still_serves(zgix: &Zgix) {
    let r = Client::connect(zgix.addr()).get("/cl/4");
    assert_eq!(r.body, b"abcd");
}
