//! An answer always ends well: after an interim 1xx was relayed, an origin that hangs, resets or sends garbage still gets the client a final 504 or 502 with `connection: close`, and the access log records that status.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

use support::*;

/// What the hand-written origin does after its interim answer.
#[derive(Clone, Copy)]
enum Then {
    /// Keeps the connection open and says nothing more.
    Hang,
    /// Closes with a reset (`SO_LINGER` 0).
    Reset,
    /// Sends bytes that are no response head.
    Garbage,
}

/// An origin that reads one request head, answers `interim`, and once the
/// client saw the interim answer (`go`) does `then`. The thread holds the
/// connection until the test ends (`go` dropped).
struct OneShot {
    addr: SocketAddr,
    go: mpsc::Sender<()>,
}

fn origin(interim: &'static [u8], then: Then) -> OneShot {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (done, wait) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        let mut head = Vec::new();
        let mut b = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut b) {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&b[..n]),
            }
        }
        s.write_all(interim).unwrap();
        let _ = wait.recv();
        match then {
            Then::Hang => {}
            Then::Reset => {
                reset(&s);
                return;
            }
            Then::Garbage => s.write_all(b"this is no response\r\n\r\n").unwrap(),
        }
        // Until the test is over.
        let _ = wait.recv();
    });
    OneShot { addr, go: done }
}

/// Closes `s` with a reset rather than a FIN.
fn reset(s: &TcpStream) {
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid descriptor and a correctly sized option value.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&lg as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    // Dropping the stream (the caller returns) closes it.
}

fn log_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("zgix-interim-{tag}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// A zgix with a JSON access log and a short upstream header timeout in front of `origin`.
fn start(origin: SocketAddr, log: &Path) -> Zgix {
    Zgix::start_json(&format!(
        r#"{{"cpus":[0],"access_log":{{"path":"{}","format":"json"}},
"limits":{{"upstream_header_timeout_ms":300}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"c"}}}}],
"clusters":{{"c":{{"endpoints":["{origin}"],"retries":0}}}}}}"#,
        log.display()
    ))
}

/// Sends `request`, reads the interim head, lets the origin go on, and reads
/// everything until zgix closes the connection.
fn exchange(addr: SocketAddr, o: &OneShot, request: &[u8]) -> Vec<u8> {
    let mut s = connect(addr);
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.write_all(request).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    let mut interim_seen = false;
    loop {
        if !interim_seen && got.windows(4).any(|w| w == b"\r\n\r\n") {
            interim_seen = true;
            o.go.send(()).unwrap();
        }
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) => panic!(
                "no close within {IO_TIMEOUT:?} ({e}); received: \"{}\"",
                escape(&got)
            ),
        }
    }
    got
}

/// The status of the one access-log line (waits for it).
fn logged_status(path: &Path) -> u64 {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text.lines().next() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            return v["status"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "no access-log line");
        std::thread::yield_now();
    }
}

/// Splits what the client got after the interim head `interim_status` and
/// asserts the rest is zgix's own `code reason` answer.
#[track_caller]
fn assert_interim_then(got: &[u8], interim_status: &str, code: u16, reason: &str) {
    let text = String::from_utf8_lossy(got);
    assert!(
        text.starts_with(&format!("HTTP/1.1 {interim_status} ")),
        "no interim {interim_status} first: \"{}\"",
        escape(got)
    );
    let end = text.find("\r\n\r\n").unwrap() + 4;
    assert_bytes(&unstamped(&got[end..]), &generated(code, reason));
}

#[test]
fn continue_then_a_hanging_origin_is_504() {
    let o = origin(b"HTTP/1.1 100 Continue\r\n\r\n", Then::Hang);
    let log = log_path("hang");
    let z = start(o.addr, &log);
    let got = exchange(
        z.addr(),
        &o,
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    );
    assert_interim_then(&got, "100", 504, "Gateway Timeout");
    assert_eq!(logged_status(&log), 504);
    let _ = std::fs::remove_file(&log);
}

#[test]
fn early_hints_then_a_reset_is_502() {
    let o = origin(
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n",
        Then::Reset,
    );
    let log = log_path("reset");
    let z = start(o.addr, &log);
    let got = exchange(z.addr(), &o, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_interim_then(&got, "103", 502, "Bad Gateway");
    assert_eq!(logged_status(&log), 502);
    let _ = std::fs::remove_file(&log);
}

#[test]
fn early_hints_then_garbage_is_502() {
    let o = origin(
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n",
        Then::Garbage,
    );
    let log = log_path("garbage");
    let z = start(o.addr, &log);
    let got = exchange(z.addr(), &o, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_interim_then(&got, "103", 502, "Bad Gateway");
    assert_eq!(logged_status(&log), 502);
    let _ = std::fs::remove_file(&log);
}
