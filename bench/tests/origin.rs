//! End to end on the binary: `zgix-bench origin` still accepts and serves a new connection after keep-alive traffic came and went (issue 19's hang), and `zgix-bench load` fails, naming the target, when the target stalls.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_zgix-bench");

/// Long enough for a loaded test machine; a hung origin fails the test here
/// instead of hanging it.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
/// The origin's answer with `--body-bytes 5`, byte for byte.
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nServer: zgix-bench\r\nContent-Type: text/plain\r\n\
Content-Length: 5\r\n\r\nxxxxx";

/// An origin process, killed when dropped.
struct Origin {
    child: Child,
    addr: SocketAddr,
}

impl Origin {
    /// Starts `zgix-bench origin` on a free loopback port and waits for its
    /// `origin: listening on ADDR` line.
    fn start(args: &[&str]) -> Origin {
        let mut child = Command::new(BIN)
            .args(["origin", "--bind", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn zgix-bench origin");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("origin: listening on ")
            .unwrap_or_else(|| panic!("origin printed {line:?}"))
            .parse()
            .unwrap();
        Origin { child, addr }
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// Reads one response of exactly `RESPONSE`'s length and checks its bytes.
fn expect_response(s: &mut TcpStream, what: &str) {
    let mut got = vec![0u8; RESPONSE.len()];
    s.read_exact(&mut got)
        .unwrap_or_else(|e| panic!("{what}: no response: {e}"));
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(RESPONSE),
        "{what}"
    );
}

/// A fresh connection gets a full answer: the origin still accepts and serves.
fn new_connection_is_served(addr: SocketAddr, what: &str) {
    let mut s = connect(addr);
    s.write_all(REQUEST).unwrap();
    expect_response(&mut s, what);
}

#[test]
fn new_connection_is_served_after_keep_alive_traffic() {
    const CONNECTIONS: usize = 32;
    const REQUESTS: usize = 50;
    let origin = Origin::start(&["--cpus", "0", "--body-bytes", "5"]);
    for round in 0..4 {
        let mut conns: Vec<TcpStream> = (0..CONNECTIONS).map(|_| connect(origin.addr)).collect();
        for i in 0..REQUESTS {
            for s in &mut conns {
                s.write_all(REQUEST).unwrap();
            }
            for (c, s) in conns.iter_mut().enumerate() {
                expect_response(s, &format!("round {round} connection {c} request {i}"));
            }
        }
        // Half the clients close politely: the origin must see the EOF and
        // close its side too (a hung origin leaves them in CLOSE-WAIT, and
        // these reads time out).
        for (c, s) in conns.iter_mut().enumerate().filter(|(c, _)| c % 2 == 0) {
            s.shutdown(Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap_or_else(|e| {
                panic!("round {round} connection {c}: origin did not close: {e}")
            });
            assert!(rest.is_empty(), "round {round} connection {c}: {rest:?}");
        }
        // The other half leave with a request in flight and unread answers:
        // the origin's send then meets a closed (reset) socket.
        for s in conns.iter_mut().skip(1).step_by(2) {
            s.write_all(REQUEST).unwrap();
        }
        drop(conns);
        new_connection_is_served(origin.addr, &format!("new connection after round {round}"));
    }
    // Pipelined requests on one more new connection, then a close.
    let mut s = connect(origin.addr);
    s.write_all(
        &[
            REQUEST,
            REQUEST,
            b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
        ]
        .concat(),
    )
    .unwrap();
    expect_response(&mut s, "pipelined 1");
    expect_response(&mut s, "pipelined 2");
    let mut last = Vec::new();
    s.read_to_end(&mut last).unwrap();
    assert!(
        last.ends_with(b"Connection: close\r\nContent-Length: 5\r\n\r\nxxxxx"),
        "{}",
        String::from_utf8_lossy(&last)
    );
}

#[test]
fn delayed_origin_serves_new_connections_too() {
    // --delay-ms waits on the driver's timers: each answer is held back, and
    // new connections are accepted meanwhile.
    let origin = Origin::start(&["--cpus", "0", "--body-bytes", "5", "--delay-ms", "30"]);
    let mut first = connect(origin.addr);
    let t0 = std::time::Instant::now();
    first.write_all(REQUEST).unwrap();
    new_connection_is_served(origin.addr, "second connection while the first waits");
    expect_response(&mut first, "first connection");
    assert!(t0.elapsed() >= Duration::from_millis(30), "answered early");
}

fn load(url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["load", "--url", url])
        .args(args)
        .output()
        .expect("run zgix-bench load")
}

#[test]
fn load_fails_on_a_stalled_target() {
    // A listener nobody accepts from: the kernel completes the handshakes
    // into its backlog and no byte ever comes back, as from a hung origin.
    let stalled = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = stalled.local_addr().unwrap();
    let out = load(
        &format!("http://{addr}/"),
        &[
            "--connections",
            "4",
            "--duration",
            "0.6",
            "--timeout-ms",
            "200",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stderr: {stderr}\nstdout: {stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "zgix-bench load: target {addr} stalled: no request completed"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("no figures reported"), "{stderr}");
    assert!(!stdout.contains("requests/s"), "{stdout}");

    // The same run against a live origin reports its figures and succeeds.
    let origin = Origin::start(&["--cpus", "0"]);
    let out = load(
        &format!("http://{}/", origin.addr),
        &[
            "--connections",
            "4",
            "--duration",
            "0.3",
            "--timeout-ms",
            "200",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("requests/s:"), "{stdout}");
}
