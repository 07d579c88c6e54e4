//! The bulk path (issue 21) end to end: 64 MiB down and up through zgix byte for byte on the bulk path (received buffers sent as they are on uring, splice on epoll), a 16 MiB echo through a tunnel, the data of big chunks spliced both ways and small chunks on the copy path, malformed framing after a spliced chunk, downloads past a shard's pipes relayed without one, a slow reader that keeps zgix's bytes in flight bounded, and a TLS listener that falls back to copying.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use support::{
    metrics_after_tick, metrics_text, pattern, pattern_byte, series, Client, Config, Zgix,
    IO_TIMEOUT,
};

const MIB: u64 = 1 << 20;
/// Bytes of a body that may go the copy path before the bulk path starts:
/// what arrives with the head plus one streaming buffer.
const COPY_SLACK: u64 = 256 << 10;

/// FNV-1a over `bytes`, continuing from `h`.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

/// The FNV-1a of the first `n` pattern bytes (a block of whole 26-letter
/// cycles, repeated).
fn pattern_fnv(n: u64) -> u64 {
    repeated_fnv(&pattern(26 * 40_960), n)
}

/// The FNV-1a of `n` bytes of `block` repeated.
fn repeated_fnv(block: &[u8], n: u64) -> u64 {
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
struct BodyOrigin {
    addr: SocketAddr,
    sent: Arc<AtomicU64>,
    uploads: Mutex<mpsc::Receiver<Result<u64, String>>>,
}

impl BodyOrigin {
    fn start() -> BodyOrigin {
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
    fn next_upload(&self) -> Result<u64, String> {
        match self.uploads.lock().unwrap().recv_timeout(IO_TIMEOUT) {
            Ok(r) => r,
            Err(e) => panic!("no upload ended within {IO_TIMEOUT:?}: {e}"),
        }
    }
}

/// Default chunk size of `/chunked/N`: not a divisor of the pattern's cycle.
const CHUNK: u64 = 26 * 3_846 + 7;

/// The pieces `/chunked/{n}/{k}` writes, one write each, in order: chunks
/// of `k` pattern bytes (the last shorter) as size line, data and CRLF,
/// every other size line of the first 16 with an extension (zgix allows
/// 16 KiB of them per message), then the last chunk with a trailer. `k` is at most 1 MiB.
fn chunked_wire(n: u64, k: u64) -> Vec<Vec<u8>> {
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
fn chunked_bytes(n: u64, k: u64) -> Vec<u8> {
    chunked_wire(n, k).concat()
}

fn serve(
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

fn read_exact_fnv(r: &mut impl Read, n: u64) -> std::io::Result<(u64, u64)> {
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

fn read_chunked(r: &mut impl BufRead) -> std::io::Result<(u64, u64)> {
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

fn read_exact_fnv_from(r: &mut impl Read, n: u64, h0: u64) -> std::io::Result<(u64, u64)> {
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
fn bulk_bytes(zgix: &Zgix) -> u64 {
    bulk_in(&metrics_text(zgix))
}

/// Bulk-path bytes in a metrics text.
fn bulk_in(m: &str) -> u64 {
    (series(m, "zgix_io_spliced_bytes_total") + series(m, "zgix_io_relayed_bytes_total")) as u64
}

/// Waits (up to the I/O timeout) until the shard tick has published at
/// least `want` bulk-path bytes; returns the value seen.
#[track_caller]
fn wait_bulk_bytes(zgix: &Zgix, want: u64) -> u64 {
    wait_for(zgix, "bulk-path bytes", |_| {
        let v = bulk_bytes(zgix);
        (v >= want).then_some(v)
    })
}

/// Waits (up to the I/O timeout) until the shard tick has published a
/// value of the series `key` that `ok` accepts; returns it.
#[track_caller]
fn wait_series(zgix: &Zgix, key: &str, ok: impl Fn(f64) -> bool) -> f64 {
    wait_for(zgix, key, |m| Some(series(m, key)).filter(|&v| ok(v)))
}

/// Polls zgix's metrics until `f` returns a value (fails after the I/O timeout,
/// naming `what` and the last metrics).
#[track_caller]
fn wait_for<T>(zgix: &Zgix, what: &str, f: impl Fn(&str) -> Option<T>) -> T {
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

fn proxy() -> (BodyOrigin, Zgix) {
    let origin = BodyOrigin::start();
    let zgix = Zgix::start(&Config::new(&[origin.addr]).admin());
    (origin, zgix)
}

/// Reads a Content-Length body of `n` bytes, checking every byte against
/// the pattern; returns its FNV-1a. `step` bounds each read.
fn read_pattern_body(client: &mut Client, n: u64, step: usize, mut each: impl FnMut(u64)) -> u64 {
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

#[test]
fn a_64_mib_download_on_the_bulk_path_is_byte_exact_and_the_connection_stays_in_sync() {
    let (_origin, zgix) = proxy();
    let n = 64 * MIB;
    let mut client = Client::connect(zgix.addr());
    client.send(format!("GET /cl/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    let head = client.read_response_head();
    assert_eq!(head.status, 200, "{}", head.show());
    assert_eq!(head.field("content-length"), Some(n.to_string().as_str()));
    assert_eq!(
        read_pattern_body(&mut client, n, usize::MAX, |_| {}),
        pattern_fnv(n)
    );
    wait_bulk_bytes(&zgix, n - COPY_SLACK);
    // The next request on the same connection is answered in sync.
    assert_in_sync(&mut client);
}

#[test]
fn a_64_mib_upload_on_the_bulk_path_is_byte_exact_and_a_pipelined_request_follows() {
    let (_origin, zgix) = proxy();
    let n = 64 * MIB;
    let mut client = Client::connect(zgix.addr());
    client.send(format!("POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {n}\r\n\r\n").as_bytes());
    let block = pattern(1 << 20);
    for _ in 0..n / MIB - 1 {
        client.send(&block);
    }
    // The last megabyte and the next request in one write: the bytes past
    // the body must not be relayed with it.
    let mut tail = block.clone();
    tail.extend_from_slice(b"GET /cl/3 HTTP/1.1\r\nHost: t\r\n\r\n");
    client.send(&tail);
    let r = client.read_response();
    assert_eq!(r.status, 200, "{}", r.show());
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!("{n} {:016x}", repeated_fnv(&block, n))
    );
    let next = client.read_response();
    assert_eq!(next.status, 200);
    assert_eq!(next.body, b"abc");
    wait_bulk_bytes(&zgix, n - COPY_SLACK);
}

/// Received-buffer bytes one 1 MiB body on a pooled connection may relay
/// (uring) before its splices start: the buffer the head came in, one
/// more, and slack for a head split across two.
const RELAY_SLACK: u64 = 64 << 10;

/// An origin for bodies behind a zgix of one shard, whose tick then
/// publishes everything that shard did before it (`metrics_after_tick`).
fn proxy_one_shard() -> (BodyOrigin, Zgix) {
    let origin = BodyOrigin::start();
    let zgix = Zgix::start(&Config::new(&[origin.addr]).cpus(&[0]).admin());
    (origin, zgix)
}

/// The bytes relayed from received buffers and spliced so far, once the
/// shard tick has published everything done before the call.
fn relayed_and_spliced(zgix: &Zgix) -> (u64, u64) {
    let m = metrics_after_tick(zgix);
    (
        series(&m, "zgix_io_relayed_bytes_total") as u64,
        series(&m, "zgix_io_spliced_bytes_total") as u64,
    )
}

/// At most [`COPY_SLACK`] of the `n` bytes missed the bulk path (relayed
/// from received buffers or spliced).
fn assert_on_the_bulk_path(relayed: u64, spliced: u64, n: u64) {
    assert!(
        relayed + spliced >= n - COPY_SLACK,
        "{spliced} bytes of {n} spliced, {relayed} relayed"
    );
}

/// The next request on `client`'s connection gets its own answer: the
/// connection is in sync after what came before.
fn assert_in_sync(client: &mut Client) {
    let r = client.get("/cl/5");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"abcde");
}

/// zgix still answers a small request on a new connection.
fn assert_still_serves(zgix: &Zgix) {
    let r = Client::connect(zgix.addr()).get("/cl/4");
    assert_eq!(r.body, b"abcd");
}

#[test]
fn one_mib_downloads_on_a_pooled_connection_splice_past_the_buffer_their_head_came_in() {
    // On the ring a socket whose last body took the bulk path receives its
    // next head one buffer at a time, so the rest of the body stays in the
    // socket for the splices; before that, a multishot receive had pulled
    // most of each body into provided buffers before the head was parsed.
    let (_origin, zgix) = proxy_one_shard();
    let (n, k) = (MIB, 8u64);
    let mut client = Client::connect(zgix.addr());
    // The first body comes on a fresh upstream connection (multishot).
    client.send(format!("GET /cl/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    check_cl(&mut client, n);
    let (r0, s0) = relayed_and_spliced(&zgix);
    for _ in 0..k {
        client.send(format!("GET /cl/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        check_cl(&mut client, n);
    }
    let (r1, s1) = relayed_and_spliced(&zgix);
    let (relayed, spliced) = (r1 - r0, s1 - s0);
    assert!(
        relayed <= k * RELAY_SLACK,
        "{relayed} bytes of {k} bodies of {n} relayed from received buffers ({spliced} spliced)"
    );
    assert!(
        spliced >= k * (n - COPY_SLACK),
        "{spliced} bytes of {k} bodies of {n} spliced ({relayed} relayed)"
    );
}

#[test]
fn one_mib_uploads_on_a_kept_connection_splice_past_the_buffers_their_head_came_in() {
    // The client's socket: after one upload on the bulk path, the next
    // request's head is received one buffer at a time (see above).
    let (_origin, zgix) = proxy_one_shard();
    let (n, k) = (MIB, 8u64);
    let block = pattern(n);
    let want = format!("{n} {:016x}", repeated_fnv(&block, n));
    let mut client = Client::connect(zgix.addr());
    let upload = |client: &mut Client| {
        let mut req =
            format!("POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {n}\r\n\r\n").into_bytes();
        req.extend_from_slice(&block);
        client.send(&req);
        let r = client.read_response();
        assert_eq!(r.status, 200, "{}", r.show());
        assert_eq!(String::from_utf8_lossy(&r.body), want);
    };
    upload(&mut client);
    let (r0, s0) = relayed_and_spliced(&zgix);
    for _ in 0..k {
        upload(&mut client);
    }
    let (r1, s1) = relayed_and_spliced(&zgix);
    let (relayed, spliced) = (r1 - r0, s1 - s0);
    assert!(
        relayed <= k * RELAY_SLACK,
        "{relayed} bytes of {k} uploads of {n} relayed from received buffers ({spliced} spliced)"
    );
    assert!(
        spliced >= k * (n - COPY_SLACK),
        "{spliced} bytes of {k} uploads of {n} spliced ({relayed} relayed)"
    );
}

/// Small chunks: under the bulk path's threshold for chunks (256 KiB).
const SMALL_CHUNK: u64 = 16_000;

#[test]
fn chunked_bodies_of_small_chunks_go_the_copy_path_byte_exact_both_ways() {
    let (_origin, zgix) = proxy();
    let n = 64 * MIB;
    let mut client = Client::connect(zgix.addr());
    let r = client.get(&format!("/chunked/{n}/{SMALL_CHUNK}"));
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert_eq!(r.body.len() as u64, n);
    assert_eq!(fnv(FNV0, &r.body), pattern_fnv(n));
    drop(r);
    // A chunked upload, re-encoded by zgix on its way.
    client.send(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    let block = pattern(1 << 20);
    let piece = SMALL_CHUNK as usize;
    let mut at = 0u64;
    while at < n {
        let piece = &block[..piece.min((n - at) as usize)];
        if at < 100 * SMALL_CHUNK {
            client.send(format!("{:x};ext=1\r\n", piece.len()).as_bytes());
        } else {
            client.send(format!("{:x}\r\n", piece.len()).as_bytes());
        }
        client.send(piece);
        client.send(b"\r\n");
        at += piece.len() as u64;
    }
    client.send(b"0\r\n\r\n");
    // The pattern restarts with every piece.
    let h = repeated_fnv(&block[..piece], n);
    let r = client.read_response();
    assert_eq!(String::from_utf8_lossy(&r.body), format!("{n} {h:016x}"));
    // Then a Content-Length body of 1 MiB: the bulk counter moves by that
    // one alone, so the 128 MiB above went the copy path.
    client.send(b"GET /cl/1048576 HTTP/1.1\r\nHost: t\r\n\r\n");
    let head = client.read_response_head();
    assert_eq!(head.status, 200);
    read_pattern_body(&mut client, MIB, usize::MAX, |_| {});
    let v = wait_bulk_bytes(&zgix, MIB - COPY_SLACK);
    assert!(
        v <= MIB,
        "bulk bytes {v}: a chunked body of small chunks took the bulk path"
    );
}

/// Bulk-path bytes (spliced plus relayed) the shard moved during `f`.
fn bulk_during(zgix: &Zgix, f: impl FnOnce()) -> (u64, u64) {
    let (r0, s0) = relayed_and_spliced(zgix);
    f();
    let (r1, s1) = relayed_and_spliced(zgix);
    (r1 - r0, s1 - s0)
}

/// Reads a `/chunked/{n}/{k}` response on `c` and checks its body byte for
/// byte as framed on the wire (size lines, extensions, trailer).
#[track_caller]
fn check_chunked_raw(c: &mut Client, n: u64, k: u64) {
    let head = c.read_response_head();
    assert_eq!(head.status, 200, "{}", head.show());
    assert_eq!(head.field("transfer-encoding"), Some("chunked"));
    let want = chunked_bytes(n, k);
    let mut got = vec![0u8; want.len()];
    c.read_exact(&mut got);
    if got != want {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        panic!(
            "body differs at byte {at} of {}: got {:?}, want {:?}",
            want.len(),
            String::from_utf8_lossy(&got[at..(at + 40).min(got.len())]),
            String::from_utf8_lossy(&want[at..(at + 40).min(want.len())])
        );
    }
}

#[test]
fn a_chunked_8_mib_response_of_big_chunks_is_spliced_and_arrives_byte_exact_with_its_framing() {
    let (_origin, zgix) = proxy_one_shard();
    let (n, k) = (8 * MIB, MIB);
    let mut client = Client::connect(zgix.addr());
    // The first response comes on a fresh upstream connection (on the
    // ring its first chunk is partly relayed from received buffers).
    let (relayed, spliced) = bulk_during(&zgix, || {
        client.send(format!("GET /chunked/{n}/{k} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        check_chunked_raw(&mut client, n, k);
    });
    assert_on_the_bulk_path(relayed, spliced, n);
    // Again on the pooled connection: each chunk's data is spliced past
    // the buffer its size line came in.
    let (relayed, spliced) = bulk_during(&zgix, || {
        client.send(format!("GET /chunked/{n}/{k} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        check_chunked_raw(&mut client, n, k);
    });
    assert!(
        spliced >= n - COPY_SLACK,
        "{spliced} bytes of {n} spliced, {relayed} relayed"
    );
    // Chunks that do not fall on read boundaries (CHUNK is odd-sized), and
    // the connection stays in sync.
    let n = 4 * MIB + 333;
    client.send(format!("GET /chunked/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    check_chunked_raw(&mut client, n, CHUNK);
    assert_in_sync(&mut client);
}

#[test]
fn a_response_of_many_small_chunks_is_exact_and_stays_on_the_copy_path() {
    let (_origin, zgix) = proxy_one_shard();
    let mut client = Client::connect(zgix.addr());
    let (relayed, spliced) = bulk_during(&zgix, || {
        // Up to 256 KiB a chunk, all of them under the bulk path's threshold.
        for (n, k) in [
            (4 * MIB, 1_000),
            (2 * MIB + 1, 7),
            (MIB, SMALL_CHUNK),
            (2 * MIB + 5, 200_000),
            (MIB, (256 << 10) - 1),
        ] {
            client.send(format!("GET /chunked/{n}/{k} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
            check_chunked_raw(&mut client, n, k);
        }
    });
    assert_eq!((relayed, spliced), (0, 0), "small chunks on the bulk path");
}

#[test]
fn an_http_1_0_client_gets_big_chunks_de_chunked_on_the_copy_path() {
    let (_origin, zgix) = proxy_one_shard();
    let n = 4 * MIB + 17;
    let (relayed, spliced) = bulk_during(&zgix, || {
        let mut client = Client::connect(zgix.addr());
        client.send(format!("GET /chunked/{n}/{MIB} HTTP/1.0\r\nHost: t\r\n\r\n").as_bytes());
        let head = client.read_response_head();
        assert_eq!(head.status, 200, "{}", head.show());
        assert_eq!(head.field("transfer-encoding"), None);
        assert_eq!(
            read_pattern_body(&mut client, n, usize::MAX, |_| {}),
            pattern_fnv(n)
        );
        // Delimited by close, nothing after the data.
        client.expect_closed();
    });
    assert_eq!(
        (relayed, spliced),
        (0, 0),
        "de-chunked data on the bulk path"
    );
}

/// Sends a chunked upload of `n` pattern bytes in chunks of `k`, each
/// size line with an extension and written in two pieces, then a trailer;
/// `tail` goes in the same write as the last chunk.
fn send_chunked_upload(client: &mut Client, n: u64, k: u64, tail: &[u8]) -> u64 {
    client.send(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    let block = pattern(26 * 40_960);
    let mut at = 0u64;
    while at < n {
        let len = (n - at).min(k);
        let line = if at < 16 * k {
            format!("{len:x};e=\"{at}\"\r\n")
        } else {
            format!("{len:x}\r\n")
        };
        let (a, b) = line.split_at(line.len() / 2);
        client.send(a.as_bytes());
        client.send(b.as_bytes());
        let from = (at % 26) as usize;
        client.send(&block[from..from + len as usize]);
        client.send(b"\r\n");
        at += len;
    }
    let mut last = b"0\r\nX-Sum: 1\r\n\r\n".to_vec();
    last.extend_from_slice(tail);
    client.send(&last);
    pattern_fnv(n)
}

#[test]
fn an_upload_of_big_chunks_is_spliced_and_reaches_the_origin_re_encoded() {
    let (origin, zgix) = proxy_one_shard();
    let (n, k) = (8 * MIB + 5, MIB);
    let mut client = Client::connect(zgix.addr());
    let mut h = 0;
    let (relayed, spliced) = bulk_during(&zgix, || {
        h = send_chunked_upload(&mut client, n, k, b"GET /cl/3 HTTP/1.1\r\nHost: t\r\n\r\n");
        let r = client.read_response();
        assert_eq!(r.status, 200, "{}", r.show());
        assert_eq!(String::from_utf8_lossy(&r.body), format!("{n} {h:016x}"));
    });
    // The origin saw a clean body: no extension, no trailer (else it
    // reports the upload broken).
    assert_eq!(origin.next_upload(), Ok(n));
    assert_on_the_bulk_path(relayed, spliced, n);
    // The request after the body is answered in sync.
    let next = client.read_response();
    assert_eq!(next.status, 200);
    assert_eq!(next.body, b"abc");
    // Chunks that do not fall on read boundaries, on the kept connection.
    let n = 3 * MIB + 1;
    let h = send_chunked_upload(&mut client, n, CHUNK, b"");
    let r = client.read_response();
    assert_eq!(String::from_utf8_lossy(&r.body), format!("{n} {h:016x}"));
    assert_eq!(origin.next_upload(), Ok(n));
}

#[test]
fn a_malformed_chunk_after_a_big_spliced_chunk_is_refused_as_before() {
    let (origin, zgix) = proxy_one_shard();
    // A response: the chunk's data went on, its bad CRLF does not; the
    // client connection closes without a last chunk.
    let k = 2 * MIB;
    let (relayed, spliced) = bulk_during(&zgix, || {
        let mut client = Client::connect(zgix.addr());
        client.send(format!("GET /badchunk/{k} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        let head = client.read_response_head();
        assert_eq!(head.status, 200);
        let mut rest = Vec::new();
        match client.body_reader().read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("no close after {} bytes: {e}", rest.len()),
        }
        let mut want = format!("{k:x}\r\n").into_bytes();
        want.extend_from_slice(&pattern(k));
        assert!(
            rest.len() <= want.len() && rest[..] == want[..rest.len()],
            "{} bytes after the head, not a prefix of the valid framing: {:?}",
            rest.len(),
            String::from_utf8_lossy(&rest[rest.len().saturating_sub(40)..])
        );
    });
    assert_on_the_bulk_path(relayed, spliced, k);
    // An upload: a bad CRLF after a big chunk's data is answered 400, and
    // the origin never gets a complete request.
    let mut client = Client::connect(zgix.addr());
    let (relayed, spliced) = bulk_during(&zgix, || {
        client.send(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
        client.send(format!("{k:x}\r\n").as_bytes());
        client.send(&pattern(k));
        let _ = client.try_send(b"XX0\r\n\r\n");
        let r = client.read_response();
        assert_eq!(r.status, 400, "{}", r.show());
        client.expect_closed();
        assert!(
            origin.next_upload().is_err(),
            "the origin got the body whole"
        );
    });
    assert_on_the_bulk_path(relayed, spliced, k);
    assert_still_serves(&zgix);
}

#[test]
fn a_client_that_closes_mid_chunk_leaves_the_origin_an_incomplete_request() {
    let (origin, zgix) = proxy_one_shard();
    let (k, sent) = (8 * MIB, 2 * MIB);
    let mut client = Client::connect(zgix.addr());
    client.send(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    client.send(format!("{k:x}\r\n").as_bytes());
    client.send(&pattern(sent));
    client
        .stream()
        .shutdown(std::net::Shutdown::Both)
        .expect("shutdown");
    let broken = origin.next_upload();
    assert!(broken.is_err(), "the origin got a whole body: {broken:?}");
    // What came was on the bulk path, and zgix still serves.
    let (relayed, spliced) = relayed_and_spliced(&zgix);
    assert_on_the_bulk_path(relayed, spliced, sent);
    assert_still_serves(&zgix);
}

#[test]
fn a_slow_reader_keeps_the_bytes_in_flight_bounded() {
    let (origin, zgix) = proxy();
    let n = 192 * MIB;
    let mut client = Client::connect(zgix.addr());
    client.send(format!("GET /cl/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    let head = client.read_response_head();
    assert_eq!(head.status, 200);
    // Reading 4 KiB at a time and checking every byte, the client is the
    // slowest of the three: what the origin wrote and the client has not
    // read sits in kernel socket buffers (loopback autotuning allows up to
    // tcp_rmem's 32 MiB on zgix's upstream socket) and in zgix. Unbounded
    // buffering in zgix would let it approach the whole body.
    let mut worst = 0u64;
    let sent = origin.sent.clone();
    read_pattern_body(&mut client, n, 4096, |got| {
        worst = worst.max(sent.load(Ordering::Acquire).saturating_sub(got));
    });
    assert!(worst < 64 * MIB, "{worst} bytes in flight");
    let hwm = zgix.vm_hwm_kib();
    assert!(hwm < 64 * 1024, "zgix VmHWM {hwm} KiB");
    let m = metrics_text(&zgix);
    assert!(series(&m, "zgix_io_buffers_held") <= 256.0);
}

/// An origin that answers a request with `101` and then echoes every byte.
fn echo_upgrade_origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut r = BufReader::new(c.try_clone()?);
                loop {
                    let mut line = Vec::new();
                    if r.read_until(b'\n', &mut line)? == 0 || line == b"\r\n" {
                        break;
                    }
                }
                let mut w = c;
                w.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")?;
                std::io::copy(&mut r, &mut w)?;
                w.shutdown(std::net::Shutdown::Write)
            });
        }
    });
    addr
}

#[test]
fn a_16_mib_tunnel_goes_the_bulk_path_both_ways_byte_exact() {
    let zgix = Zgix::start(&Config::new(&[echo_upgrade_origin()]).admin());
    let mut client = Client::connect(zgix.addr());
    client.send(b"GET /t HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n");
    assert_eq!(client.read_response_head().status, 101);
    let n = 16 * MIB;
    let mut w = client.writer();
    let writer = std::thread::spawn(move || w.write_all(&pattern(n)).expect("tunnel write"));
    assert_eq!(
        read_pattern_body(&mut client, n, usize::MAX, |_| {}),
        pattern_fnv(n)
    );
    writer.join().expect("writer");
    // Both directions on the bulk path (spliced on epoll; on the ring the
    // received buffers sent on as they are).
    wait_bulk_bytes(&zgix, 2 * (n - COPY_SLACK));
}

/// Splice pipes one shard may have out (`io::PIPES_MAX`).
const PIPES_MAX: usize = 256;

/// Sends `GET /cl/{n}` on a new connection to zgix.
fn get_cl(zgix: &Zgix, n: u64) -> Client {
    let mut c = Client::connect(zgix.addr());
    c.send(format!("GET /cl/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    c
}

/// Reads a whole `/cl/{n}` response on `c` and checks it byte for byte.
#[track_caller]
fn check_cl(c: &mut Client, n: u64) {
    let head = c.read_response_head();
    assert_eq!(head.status, 200);
    assert_eq!(head.field("content-length"), Some(n.to_string().as_str()));
    assert_eq!(read_pattern_body(c, n, usize::MAX, |_| {}), pattern_fnv(n));
}

#[test]
fn downloads_past_the_shards_pipes_relay_without_one_byte_exact_and_the_pipes_come_back() {
    let origin = BodyOrigin::start();
    let zgix = Zgix::start(&Config::new(&[origin.addr]).cpus(&[0]).admin());
    // Uploads whose bodies never come hold every pipe of the shard: each
    // relay waits in its first splice from the client.
    let holders: Vec<Client> = (0..PIPES_MAX)
        .map(|_| {
            let mut c = Client::connect(zgix.addr());
            c.send(
                format!(
                    "POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
                    256 * MIB
                )
                .as_bytes(),
            );
            c
        })
        .collect();
    wait_series(&zgix, "zgix_io_pipes_out", |v| v >= PIPES_MAX as f64);
    // Downloads past that relay without a pipe (uring: the received buffers
    // sent on as they are; epoll: through the exchange's buffer).
    let n = 4 * MIB + 12_345;
    let mut more: Vec<Client> = (0..3).map(|_| get_cl(&zgix, n)).collect();
    for c in &mut more {
        check_cl(c, n);
    }
    let m = metrics_text(&zgix);
    assert_eq!(series(&m, "zgix_io_pipes_out"), PIPES_MAX as f64);
    wait_series(&zgix, "zgix_io_splice_fallbacks_total", |v| v >= 3.0);
    // The connections stay in sync on the fallback path.
    for c in &mut more {
        c.send(b"GET /cl/70000 HTTP/1.1\r\nHost: t\r\n\r\n");
        check_cl(c, 70_000);
    }
    // The waiting relays end with their clients and give their pipes back:
    // the next download splices again.
    drop(holders);
    wait_series(&zgix, "zgix_io_pipes_out", |v| v == 0.0);
    // (Published in the same tick as the pipes: no ended relay moves bytes
    // after this.)
    let m = metrics_text(&zgix);
    let (bulk, fallbacks) = (bulk_in(&m), series(&m, "zgix_io_splice_fallbacks_total"));
    let mut c = get_cl(&zgix, n);
    check_cl(&mut c, n);
    let m = wait_for(&zgix, "bulk-path bytes", |m| {
        (bulk_in(m) >= bulk + n - COPY_SLACK).then(|| m.to_string())
    });
    assert_eq!(series(&m, "zgix_io_splice_fallbacks_total"), fallbacks);
}

/// A self-signed certificate for `localhost` in a scratch directory.
fn cert(tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("zgix-bodies-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let c = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cp, kp) = (dir.join("c.pem"), dir.join("c.key"));
    std::fs::write(&cp, c.pem()).unwrap();
    std::fs::write(&kp, key.serialize_pem()).unwrap();
    (dir, cp, kp)
}

/// The body curl reads from `https://localhost:PORT{path}` (zgix's TLS
/// listener, certificate `ca`); fails the test if curl does.
fn curl_tls(ca: &std::path::Path, port: u16, path: &str) -> Vec<u8> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "--cacert"])
        .arg(ca)
        .arg("--resolve")
        .arg(format!("localhost:{port}:127.0.0.1"))
        .arg(format!("https://localhost:{port}{path}"))
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn a_tls_listener_relays_large_bodies_by_copying() {
    let origin = BodyOrigin::start();
    let (dir, c, k) = cert("tls");
    let json = format!(
        r#"{{"admin": {{"bind": "127.0.0.1:0"}},
            "listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "c"}}}},
                          {{"bind": "127.0.0.1:0", "name": "tls", "http": {{"cluster": "c"}},
                            "tls": {{"certificates": [{{"cert": "{}", "key": "{}"}}]}}}}],
            "clusters": {{"c": {{"endpoints": ["{}"]}}}}}}"#,
        c.display(),
        k.display(),
        origin.addr
    );
    let zgix = Zgix::start_json(&json);
    let tls_port = zgix.listeners[1].port();
    let n = 16 * MIB;
    let body = curl_tls(&c, tls_port, &format!("/cl/{n}"));
    assert_eq!(body.len() as u64, n);
    assert_eq!(fnv(FNV0, &body), pattern_fnv(n));
    // Big chunks over TLS: copied too (curl takes the chunked framing off).
    let body = curl_tls(&c, tls_port, &format!("/chunked/{}/{MIB}", 4 * MIB));
    assert_eq!(body.len() as u64, 4 * MIB);
    assert_eq!(fnv(FNV0, &body), pattern_fnv(4 * MIB));
    // Then 1 MiB on the plaintext listener: the bulk counter moves by that
    // alone, so the 20 MiB over TLS were copied.
    let mut client = Client::connect(zgix.addr());
    client.send(b"GET /cl/1048576 HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(client.read_response_head().status, 200);
    read_pattern_body(&mut client, MIB, usize::MAX, |_| {});
    let v = wait_bulk_bytes(&zgix, MIB - COPY_SLACK);
    assert!(v <= MIB, "bulk bytes {v}: the TLS body took the bulk path");
    let _ = std::fs::remove_dir_all(dir);
}
