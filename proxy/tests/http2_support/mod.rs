//! What the HTTP/2 tests share: throw-away certificates, zgix configurations with an h2 listener, a raw frame client (RFC 9113 §4.1 frames, HPACK literals without Huffman coding, RFC 7541 §6.2.2) and waits on metrics and the access log.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{metrics_text, series, Zgix};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const STREAM_CLOSED: u32 = 0x5;
pub const REFUSED_STREAM: u32 = 0x7;
pub const CANCEL: u32 = 0x8;
pub const COMPRESSION_ERROR: u32 = 0x9;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// How long a test waits for any one answer.
pub const WAIT: Duration = Duration::from_secs(10);

/// A scratch directory holding one self-signed certificate for `site.example`.
pub struct Cert {
    dir: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Drop for Cert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cert {
    pub fn new(tag: &str) -> Cert {
        let dir = std::env::temp_dir().join(format!("zgix-h2-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let p = rcgen::CertificateParams::new(vec!["site.example".to_string()]).unwrap();
        let c = p.self_signed(&key).unwrap();
        let (cert, keyp) = (dir.join("c.pem"), dir.join("k.pem"));
        std::fs::write(&cert, c.pem()).unwrap();
        std::fs::write(&keyp, key.serialize_pem()).unwrap();
        Cert {
            dir,
            cert,
            key: keyp,
        }
    }

    /// A `tls` block for this certificate, with `more` fields.
    pub fn tls(&self, more: &str) -> String {
        format!(
            r#"{{"certificates": [{{"cert": "{}", "key": "{}"}}]{more}}}"#,
            self.cert.display(),
            self.key.display()
        )
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// A config: listener 0 on TLS (`tls`), listener 1 plain with prior
/// knowledge, both with `http` extra fields and `http2` settings; an admin
/// endpoint and, when given, an access log.
pub fn config(
    origin: SocketAddr,
    tls: &str,
    http2: &str,
    extra_http: &str,
    log: Option<&Path>,
) -> String {
    let log = log.map_or(String::new(), |p| {
        format!(r#""access_log": {{"path": "{}"}},"#, p.display())
    });
    let h2 = if http2.is_empty() {
        r#"{"prior_knowledge": true}"#.to_string()
    } else {
        format!(r#"{{"prior_knowledge": true, {http2}}}"#)
    };
    let h2_tls = if http2.is_empty() {
        "{}".to_string()
    } else {
        format!("{{{http2}}}")
    };
    format!(
        r#"{{"cpus": [0], "admin": {{"bind": "127.0.0.1:0"}}, {log}
            "listeners": [
              {{"bind": "127.0.0.1:0", "name": "tls", "tls": {tls}, "http2": {h2_tls},
                "http": {{"cluster": "c"{extra_http}}}}},
              {{"bind": "127.0.0.1:0", "name": "h2c", "http2": {h2},
                "http": {{"cluster": "c"{extra_http}}}}}],
            "clusters": {{"c": {{"endpoints": ["{origin}"]}}}}}}"#
    )
}

/// curl's status and HTTP version for `url` (`args` before it).
pub fn curl(args: &[&str], url: &str) -> (u16, String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "/dev/null"])
        .args(["-w", "%{http_code} %{http_version}"])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (code, version) = text.split_once(' ').unwrap_or(("0", ""));
    (
        code.parse().unwrap_or(0),
        version.to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// curl arguments that reach listener 0 as `site.example` over TLS.
pub fn tls_args(z: &Zgix, cert: &Cert) -> (Vec<String>, String) {
    let port = z.listeners[0].port();
    (
        vec![
            "--cacert".into(),
            cert.cert.display().to_string(),
            "--resolve".into(),
            format!("site.example:{port}:127.0.0.1"),
        ],
        format!("https://site.example:{port}"),
    )
}

/// h2load's status-code counts (2xx, 3xx, 4xx, 5xx) and the requests that
/// got no answer (errored or timed out; h2load's "failed" counts 4xx too).
pub fn h2load(args: &[&str]) -> ([u64; 4], u64, String) {
    let out = Command::new("timeout")
        .arg("60")
        .arg("h2load")
        .args(args)
        .output()
        .expect("run h2load");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut codes = [0; 4];
    let mut failed = u64::MAX;
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("status codes: ") {
            for (i, part) in rest.split(", ").enumerate().take(4) {
                codes[i] = part.split(' ').next().unwrap().parse().unwrap();
            }
        }
        if let Some(rest) = l.strip_prefix("requests: ") {
            for part in rest.split(", ") {
                if let Some(n) = part.strip_suffix(" errored") {
                    failed = n.parse::<u64>().unwrap();
                }
                if let Some(n) = part.strip_suffix(" timeout") {
                    failed = failed.saturating_add(n.parse().unwrap());
                }
            }
        }
    }
    (codes, failed, text)
}

/// Waits until the series `key` reaches `at_least`; its value.
#[track_caller]
pub fn wait_series(z: &Zgix, key: &str, at_least: f64) -> f64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let v = series(&metrics_text(z), key);
        if v >= at_least || Instant::now() > deadline {
            return v;
        }
        std::thread::yield_now();
    }
}

/// Waits until the file holds `n` lines; its lines.
pub fn wait_lines(path: &Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::yield_now();
    }
}

/// An HPACK integer with an `n`-bit prefix whose other bits are `first`.
pub fn hpack_int(out: &mut Vec<u8>, first: u8, n: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A literal field without indexing, new name (RFC 7541 §6.2.2).
pub fn lit(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name);
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// A literal field with incremental indexing, new name (§6.2.1).
pub fn lit_indexed(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x40);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name);
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// A GET's header block for `path`.
pub fn get_block(path: &str) -> Vec<u8> {
    let mut b = Vec::new();
    lit(&mut b, b":method", b"GET");
    lit(&mut b, b":scheme", b"http");
    lit(&mut b, b":path", path.as_bytes());
    lit(&mut b, b":authority", b"site.example");
    b
}

#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub id: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM or GOAWAY.
    pub fn code(&self) -> u32 {
        let at = if self.kind == GOAWAY { 4 } else { 0 };
        u32::from_be_bytes(self.payload[at..at + 4].try_into().unwrap())
    }

    /// A GOAWAY's last stream id.
    pub fn last_stream(&self) -> u32 {
        u32::from_be_bytes(self.payload[..4].try_into().unwrap()) & 0x7fff_ffff
    }
}

/// A client that writes frames by hand; a thread reads the server's frames
/// as they come (so a GOAWAY is seen even while the client still writes).
pub struct Raw {
    pub s: TcpStream,
    pub sent: usize,
    frames: std::sync::mpsc::Receiver<Frame>,
}

fn read_frame(s: &mut TcpStream) -> Option<Frame> {
    let mut h = [0u8; 9];
    s.read_exact(&mut h).ok()?;
    let n = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
    let mut payload = vec![0; n];
    s.read_exact(&mut payload).ok()?;
    Some(Frame {
        kind: h[3],
        flags: h[4],
        id: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        payload,
    })
}

impl Raw {
    /// Connects to a prior-knowledge listener and sends the preface and an
    /// empty SETTINGS.
    pub fn open(addr: SocketAddr) -> Raw {
        let mut r = Raw::bare(addr);
        r.write(PREFACE);
        r.frame(SETTINGS, 0, 0, &[]);
        r
    }

    /// Connects; nothing sent yet.
    pub fn bare(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_write_timeout(Some(WAIT)).unwrap();
        let mut rd = s.try_clone().unwrap();
        rd.set_read_timeout(Some(WAIT * 2)).unwrap();
        let (tx, frames) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            while let Some(f) = read_frame(&mut rd) {
                if tx.send(f).is_err() {
                    break;
                }
            }
        });
        Raw { s, sent: 0, frames }
    }

    pub fn write(&mut self, b: &[u8]) -> bool {
        self.sent += b.len();
        self.s.write_all(b).is_ok()
    }

    pub fn frame_bytes(kind: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
        let n = payload.len() as u32;
        let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    pub fn frame(&mut self, kind: u8, flags: u8, id: u32, payload: &[u8]) -> bool {
        self.write(&Raw::frame_bytes(kind, flags, id, payload))
    }

    pub fn headers(&mut self, id: u32, block: &[u8], end_stream: bool) -> bool {
        let flags = END_HEADERS | if end_stream { END_STREAM } else { 0 };
        self.frame(HEADERS, flags, id, block)
    }

    pub fn rst(&mut self, id: u32, code: u32) -> bool {
        self.frame(RST_STREAM, 0, id, &code.to_be_bytes())
    }

    /// The next frame `f` picks; `None` when the connection ended first or
    /// nothing came within the wait.
    pub fn until(&mut self, mut f: impl FnMut(&Frame) -> bool) -> Option<Frame> {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let fr = self.frames.recv_timeout(left).ok()?;
            if f(&fr) {
                return Some(fr);
            }
        }
    }

    /// The GOAWAY the server sends next (other frames skipped).
    pub fn goaway(&mut self) -> Option<Frame> {
        self.until(|f| f.kind == GOAWAY)
    }

    /// The response HEADERS' status on stream `id` (0 when Huffman-coded),
    /// or the RST_STREAM code as `Err`.
    pub fn answer(&mut self, id: u32) -> Option<Result<u16, u32>> {
        let f = self.until(|f| f.id == id && (f.kind == HEADERS || f.kind == RST_STREAM))?;
        if f.kind == RST_STREAM {
            return Some(Err(f.code()));
        }
        Some(Ok(status_of(&f.payload)))
    }

    /// Waits for the end of stream `id`'s answer (a frame with END_STREAM,
    /// or its reset).
    pub fn answer_end(&mut self, id: u32) -> Option<Frame> {
        self.until(|f| {
            f.id == id
                && ((f.kind == DATA || f.kind == HEADERS) && f.flags & END_STREAM != 0
                    || f.kind == RST_STREAM)
        })
    }

    /// Whether the server closed the connection within the wait.
    pub fn closed(&mut self) -> bool {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.frames.recv_timeout(left) {
                Ok(_) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return true,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return false,
            }
        }
    }
}

/// `:status` from the first field of a response block when zgix's codec
/// sent it indexed (RFC 7541 Appendix A: 8..=14) or as a plain literal; 0
/// when it is Huffman-coded (the tests that need the code use curl).
pub fn status_of(block: &[u8]) -> u16 {
    match block.first().copied().unwrap_or(0) {
        0x88 => 200,
        0x89 => 204,
        0x8a => 206,
        0x8b => 304,
        0x8c => 400,
        0x8d => 404,
        0x8e => 500,
        b if block.len() > 2 && block[1] & 0x80 == 0 && (b & 0x0f == 8 || b & 0x3f == 8) => {
            let len = (block[1] as usize).min(block.len() - 2);
            std::str::from_utf8(&block[2..2 + len])
                .ok()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0)
        }
        _ => 0,
    }
}

/// A config with one plain prior-knowledge listener `h2c` (`http2` fields
/// added) and an admin endpoint; `top` adds top-level fields.
pub fn h2c_config(origin: SocketAddr, http2: &str, top: &str) -> String {
    format!(
        r#"{{"cpus": [0], "admin": {{"bind": "127.0.0.1:0"}}{top},
            "listeners": [{{"bind": "127.0.0.1:0", "name": "h2c",
                "http2": {{"prior_knowledge": true{http2}}}, "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{origin}"]}}}}}}"#
    )
}

/// The `zgix_h2_refused_total` series of listener `h2c` for `reason`.
pub fn refused(reason: &str) -> String {
    format!("zgix_h2_refused_total{{listener=\"h2c\",reason=\"{reason}\"}}")
}
