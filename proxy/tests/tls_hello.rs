//! TLS termination against clients the other tests do not use and hellos no real client sends: Python's `ssl` module (TLS 1.3 and 1.2, close_notify at the end), a truncated ClientHello, a 1-byte hello and a 64 KiB hello (each closes only its own connection, with `decode_error` where TLS calls for an alert, while another client is served), and a TLS 1.2 client-initiated renegotiation (refused; zgix goes on serving). Certificates are made by the test (rcgen).

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{metrics_text, series, Origin, Zgix};

/// How long a read of a refused connection may take before the test fails.
const WAIT: Duration = Duration::from_secs(10);

/// Less than zgix's client header timeout (10 s), which would end an
/// s_client that waits for a renegotiation forever.
const RENEGOTIATION_WAIT: Duration = Duration::from_secs(5);

/// The alert zgix sends for a hello it cannot use (RFC 8446 §6.2:
/// `decode_error`, fatal).
const DECODE_ERROR_ALERT: [u8; 7] = [21, 3, 3, 0, 2, 2, 50];

struct Cert {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Drop for Cert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A self-signed certificate for `site.example` (rcgen's default validity).
fn cert(tag: &str) -> Cert {
    let dir = std::env::temp_dir().join(format!("zgix-tls-hello-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec!["site.example".to_string()]).unwrap();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "site.example");
    let c = p.self_signed(&key).unwrap();
    let out = Cert {
        cert: dir.join("site.pem"),
        key: dir.join("site.key"),
        dir,
    };
    std::fs::write(&out.cert, c.pem()).unwrap();
    std::fs::write(&out.key, key.serialize_pem()).unwrap();
    out
}

fn start(c: &Cert, origin: SocketAddr) -> Zgix {
    start_with(c, origin, "")
}

/// [`start`] with more fields of `tls` (`, "min_version": "1.3"`).
fn start_with(c: &Cert, origin: SocketAddr, tls_more: &str) -> Zgix {
    Zgix::start_json(&format!(
        r#"{{"cpus": [0], "admin": {{"bind": "127.0.0.1:0"}},
            "listeners": [{{"bind": "127.0.0.1:0", "name": "public",
                "tls": {{"certificates": [{{"cert": "{}", "key": "{}"}}]{tls_more}}},
                "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{origin}"]}}}}}}"#,
        c.cert.display(),
        c.key.display()
    ))
}

/// One HTTPS GET with curl, trusting `ca`: the status (0 on failure).
fn curl(addr: SocketAddr, ca: &Path) -> u16 {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg("--cacert")
        .arg(ca)
        .arg("--resolve")
        .arg(format!("site.example:{}:127.0.0.1", addr.port()))
        .arg(format!("https://site.example:{}/", addr.port()))
        .output()
        .expect("run curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// A Python `ssl` client: connects, checks the certificate against `ca`,
/// sends one request, reads to the end (an EOF without close_notify raises
/// `SSLEOFError`), prints version, cipher and status line.
const PY_CLIENT: &str = r#"
import socket, ssl, sys
ca, port, maxv = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
if maxv == "1.2":
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
    with ctx.wrap_socket(s, server_hostname="site.example") as t:
        t.sendall(b"GET /py HTTP/1.1\r\nHost: site.example\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = t.recv(65536)
            if not b:
                break
            data += b
        print(t.version(), t.cipher()[0], data.split(b"\r\n")[0].decode())
"#;

#[test]
fn python_ssl_clients_are_served_over_tls13_and_tls12_and_get_close_notify() {
    let c = cert("py");
    let o = Origin::start();
    let z = start(&c, o.addr());
    for (maxv, want) in [("1.3", "TLSv1.3 TLS_AES_"), ("1.2", "TLSv1.2 ECDHE-ECDSA-")] {
        let out = Command::new("python3")
            .arg("-c")
            .arg(PY_CLIENT)
            .arg(&c.cert)
            .arg(z.addr().port().to_string())
            .arg(maxv)
            .output()
            .expect("run python3");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "python ssl client (max {maxv}) failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.starts_with(want), "{stdout}");
        assert!(stdout.trim_end().ends_with("HTTP/1.1 200 OK"), "{stdout}");
    }
    assert_eq!(o.requests().len(), 2);
}

/// A real ClientHello (rustls' client, for `site.example`).
fn client_hello() -> Vec<u8> {
    client_hello_of(rustls::DEFAULT_VERSIONS)
}

/// A ClientHello offering only `versions`.
fn client_hello_of(versions: &[&'static rustls::SupportedProtocolVersion]) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let mut conn =
        rustls::ClientConnection::new(Arc::new(cfg), "site.example".try_into().unwrap()).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    assert_eq!(out[0], 22, "a handshake record");
    out
}

/// Everything the server sends until it closes (bounded by [`WAIT`]).
fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the connection was not closed: {e} (got {got:?})"),
        }
    }
}

fn bad_hellos(z: &Zgix) -> f64 {
    series(
        &metrics_text(z),
        "zgix_tls_handshakes_total{listener=\"public\",result=\"bad_hello\",version=\"none\"}",
    )
}

#[test]
fn truncated_one_byte_and_64k_hellos_close_only_their_connection() {
    let c = cert("bad");
    let o = Origin::start();
    let z = start(&c, o.addr());
    let addr = z.addr();

    // Half a real ClientHello, then nothing: the connection waits for the
    // rest while another client is served.
    let hello = client_hello();
    let mut truncated = TcpStream::connect(addr).unwrap();
    truncated.write_all(&hello[..hello.len() / 2]).unwrap();
    let mut one_byte = TcpStream::connect(addr).unwrap();
    one_byte.write_all(&[22]).unwrap();
    assert_eq!(
        curl(addr, &c.cert),
        200,
        "another client is served meanwhile"
    );
    // Their ends: a FIN in the middle of a hello gets no alert (there is
    // no handshake to alert about), just the close.
    truncated.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_until_closed(&mut truncated), b"");
    one_byte.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_until_closed(&mut one_byte), b"");

    // A 64 KiB ClientHello (in four full records): longer than zgix reads,
    // refused with decode_error after its first record.
    let mut big = TcpStream::connect(addr).unwrap();
    let mut first = vec![1u8, 0x01, 0x00, 0x00]; // ClientHello, 65,536 bytes
    first.resize(1 << 14, 0);
    let mut bytes = Vec::new();
    for i in 0..4 {
        bytes.extend_from_slice(&[22, 3, 1, 0x40, 0x00]);
        bytes.extend_from_slice(if i == 0 { &first } else { &[0u8; 1 << 14] });
    }
    // zgix may close before all of it is written: that is the point.
    let _ = big.write_all(&bytes);
    let got = read_until_closed(&mut big);
    assert_eq!(
        got, DECODE_ERROR_ALERT,
        "a decode_error alert, then the close"
    );
    assert_eq!(curl(addr, &c.cert), 200, "zgix still serves");
    assert_eq!(bad_hellos(&z), 3.0);
}

#[test]
fn tls12_renegotiation_is_refused_and_zgix_keeps_serving() {
    let c = cert("reneg");
    let o = Origin::start();
    let z = start(&c, o.addr());
    let addr = z.addr();
    let mut child = Command::new("openssl")
        .args(["s_client", "-tls1_2", "-servername", "site.example"])
        .arg("-connect")
        .arg(addr.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run openssl");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    // The handshake is done when s_client prints its session summary.
    let mut seen = String::new();
    let mut line = String::new();
    while !seen.contains("Verify return code") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "s_client ended: {seen}"
        );
        seen.push_str(&line);
    }
    assert!(seen.contains("TLSv1.2"), "{seen}");
    // `R` asks s_client to renegotiate; stdin stays open, so s_client ends
    // only if the server refuses and closes (well before any timeout of
    // zgix's: the client header timeout is 10 s, WAIT is 5 s).
    stdin.write_all(b"R\n").unwrap();
    stdin.flush().unwrap();
    let deadline = Instant::now() + RENEGOTIATION_WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "s_client still connected after asking to renegotiate"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut rest = String::new();
    let _ = stdout.read_to_string(&mut rest);
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    drop(stdin);
    assert!(err.contains("RENEGOTIATING"), "{rest}{err}");
    assert!(
        err.contains("no renegotiation"),
        "the no_renegotiation alert reached the client: {status:?}\n{rest}\n{err}"
    );
    assert_eq!(curl(addr, &c.cert), 200, "zgix still serves");
}

#[test]
fn a_refused_hello_with_a_second_message_in_its_record_does_not_crash_the_shard() {
    // A TLS 1.2-only ClientHello to a TLS 1.3-only listener, and an empty
    // Finished in the same record: rustls refuses the hello with the
    // Finished still held. zgix once asked rustls for the alert twice,
    // and the second call panicked in rustls' deframer, ending the shard.
    let c = cert("twomsg");
    let o = Origin::start();
    let z = start_with(&c, o.addr(), r#", "min_version": "1.3""#);
    let mut hello = client_hello_of(&[&rustls::version::TLS12]);
    let len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
    assert_eq!(hello.len(), 5 + len, "one record");
    hello.extend_from_slice(&[20, 0, 0, 0]);
    hello[3..5].copy_from_slice(&((len + 4) as u16).to_be_bytes());
    let mut s = TcpStream::connect(z.addr()).unwrap();
    s.write_all(&hello).unwrap();
    let got = read_until_closed(&mut s);
    assert_eq!(got.first(), Some(&21), "an alert record: {got:?}");
    assert_eq!(curl(z.addr(), &c.cert), 200, "the shard still serves");
}

/// Data segments the kernel received on `s` so far (`tcpi_data_segs_in`).
fn data_segments_in(s: &TcpStream) -> u32 {
    use std::os::fd::AsRawFd;
    // SAFETY: getsockopt into a zeroed tcp_info of the size passed.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        assert_eq!(r, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
        info.tcpi_data_segs_in
    }
}

/// A TLS 1.3 client whose request goes in the same write as its Finished,
/// asking zgix to close after the answer (`Connection: close`), receives
/// two data segments from zgix: the server's flight, then the session
/// ticket, the answer and `close_notify` in one send (the ticket held for
/// the answer, close_notify written with it; before, four: flight, ticket,
/// answer, close_notify, each a send and a wake-up of the client). The
/// session still ends with close_notify (a clean end, not a truncation).
#[test]
fn the_ticket_the_last_answer_and_close_notify_go_in_one_send() {
    use rustls::pki_types::pem::PemObject;
    let c = cert("segments");
    let o = Origin::start();
    let z = start(&c, o.addr());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_file(&c.cert).unwrap())
        .unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    for round in 0..3 {
        let mut tls = rustls::ClientConnection::new(
            Arc::new(cfg.clone()),
            "site.example".try_into().unwrap(),
        )
        .unwrap();
        // Written before the handshake: rustls sends it right after its Finished.
        tls.writer()
            .write_all(b"GET /seg HTTP/1.1\r\nHost: site.example\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut tcp = TcpStream::connect(z.addr()).unwrap();
        tcp.set_read_timeout(Some(WAIT)).unwrap();
        let mut plain = Vec::new();
        let mut clean = false;
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // Everything rustls has to send, in one write (one segment).
            let mut out = Vec::new();
            while tls.wants_write() {
                tls.write_tls(&mut out).unwrap();
            }
            if !out.is_empty() {
                tcp.write_all(&out).unwrap();
            }
            let n = tcp.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            let mut rd = &buf[..n];
            while !rd.is_empty() {
                tls.read_tls(&mut rd).unwrap();
                tls.process_new_packets().unwrap();
            }
            let mut chunk = [0u8; 4096];
            loop {
                match tls.reader().read(&mut chunk) {
                    Ok(0) => {
                        clean = true;
                        break;
                    }
                    Ok(k) => plain.extend_from_slice(&chunk[..k]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("round {round}: {e}"),
                }
            }
        }
        let text = String::from_utf8_lossy(&plain);
        assert!(text.starts_with("HTTP/1.1 200"), "round {round}: {text}");
        assert!(
            clean,
            "round {round}: the session ended without close_notify"
        );
        assert_eq!(
            data_segments_in(&tcp),
            2,
            "round {round}: data segments from zgix (flight; ticket + answer + close_notify)"
        );
    }
}
