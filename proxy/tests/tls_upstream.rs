//! End-to-end TLS towards origins (`clusters.NAME.tls`) against a real TLS origin (nginx on loopback, certificates made by the test with rcgen): 200 through it, keep-alive reuse (the origin sees one connection for many requests), session resumption when the origin closes, a wrong CA or server name answered 502 and counted, `verify: false` warned, health probes over TLS, `--check` reading the CA file, `close_notify` when the pool closes an idle connection, and TLS failure counts kept across a reload.

mod support;

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{metrics_text, run_zgix, series, Client, TempConfig, Zgix};

/// Bytes of the origin's `/big`: many TLS records, and more than one
/// receive buffer.
const BIG: usize = 300_000;

/// The longest any wait of this file takes before it fails.
const WAIT: Duration = Duration::from_secs(15);

/// Polls `f` until it gives a value (an event: a port open, a log line).
#[track_caller]
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A scratch directory holding a CA, the origin's certificate signed by it,
/// and a second CA that signed nothing.
struct Pki {
    dir: PathBuf,
    ca: PathBuf,
    other_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ca(name: &str) -> (rcgen::CertificateParams, rcgen::KeyPair, rcgen::Certificate) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = p.self_signed(&key).unwrap();
    (p, key, cert)
}

impl Pki {
    /// The origin's certificate names `origin.test` and 127.0.0.1.
    fn new(tag: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("zgix-tls-up-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (ca_params, ca_key, ca_cert) = ca("zgix test origin CA");
        let (_, _, other) = ca("zgix test other CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p =
            rcgen::CertificateParams::new(vec!["origin.test".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "origin.test");
        let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
        let leaf = p.signed_by(&key, &issuer).unwrap();
        let pki = Pki {
            ca: dir.join("ca.pem"),
            other_ca: dir.join("other-ca.pem"),
            cert: dir.join("origin.pem"),
            key: dir.join("origin.key"),
            dir,
        };
        std::fs::write(&pki.ca, ca_cert.pem()).unwrap();
        std::fs::write(&pki.other_ca, other.pem()).unwrap();
        std::fs::write(&pki.cert, leaf.pem()).unwrap();
        std::fs::write(&pki.key, key.serialize_pem()).unwrap();
        pki
    }
}

/// nginx serving TLS on two loopback ports: `keep` keeps connections alive,
/// `close` closes each after its answer. Its access log records each
/// request's connection serial number and whether its session was reused.
struct Nginx {
    child: Child,
    dir: PathBuf,
    keep: SocketAddr,
    close: SocketAddr,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Nginx {
    fn start(pki: &Pki) -> Nginx {
        let dir = pki.dir.join("nginx");
        std::fs::create_dir_all(&dir).unwrap();
        let (keep, close) = (free_port(), free_port());
        let d = dir.display();
        let (cert, key) = (pki.cert.display(), pki.key.display());
        let conf = format!(
            r#"worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format conns "$server_port $connection $ssl_session_reused $ssl_protocol";
    access_log {d}/access.log conns;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    server {{
        listen 127.0.0.1:{keep} ssl;
        keepalive_requests 10000;
        keepalive_timeout 60s;
        location = /big {{ alias {d}/big; }}
        location / {{ return 200 "from the TLS origin\n"; }}
    }}
    server {{
        listen 127.0.0.1:{close} ssl;
        keepalive_timeout 0;
        location / {{ return 200 "from the TLS origin\n"; }}
    }}
}}
"#
        );
        std::fs::write(dir.join("big"), support::pattern(BIG as u64)).unwrap();
        let path = dir.join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new("nginx")
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run nginx (Debian package nginx)");
        let n = Nginx {
            child,
            keep: SocketAddr::from(([127, 0, 0, 1], keep)),
            close: SocketAddr::from(([127, 0, 0, 1], close)),
            dir,
        };
        for a in [n.keep, n.close] {
            wait_for("nginx's port", || TcpStream::connect(a).ok());
        }
        n
    }

    /// The access log's lines for requests to `port`: (connection serial,
    /// session reused).
    fn requests(&self, port: u16) -> Vec<(u64, bool)> {
        let log = std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default();
        log.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f.first()? == &port.to_string()).then(|| (f[1].parse().unwrap(), f[2] == "r"))
            })
            .collect()
    }

    /// Waits until the origin logged `n` requests on `port`.
    fn wait_requests(&self, port: u16, n: usize) -> Vec<(u64, bool)> {
        wait_for(&format!("{n} requests in nginx's log"), || {
            let r = self.requests(port);
            (r.len() >= n).then_some(r)
        })
    }
}

/// One plain listener in front of cluster `c` (one endpoint, `tls` as given).
fn config(endpoint: &str, tls: &str, extra_cluster: &str) -> String {
    format!(
        r#"{{"cpus": [0], "admin": {{"bind": "127.0.0.1:0"}},
            "listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{endpoint}"], "tls": {tls}{extra_cluster}}}}}}}"#
    )
}

fn tls_to(pki: &Pki, ca: &Path, server_name: &str) -> String {
    let _ = pki;
    format!(
        r#"{{"server_name": "{server_name}", "ca": "{}"}}"#,
        ca.display()
    )
}

#[test]
fn requests_go_through_a_tls_origin_on_one_kept_alive_connection() {
    let pki = Pki::new("keep");
    let ng = Nginx::start(&pki);
    let z = Zgix::start_json(&config(
        &ng.keep.to_string(),
        &tls_to(&pki, &pki.ca, "origin.test"),
        "",
    ));
    let mut c = Client::connect(z.addr());
    const N: usize = 10;
    for i in 0..N {
        let r = c.get(&format!("/r{i}"));
        assert_eq!(r.status, 200, "{}", r.show());
        assert_eq!(r.body, b"from the TLS origin\n");
    }
    // A large answer (many records) and a request body streamed up.
    let r = c.get("/big");
    assert_eq!(r.status, 200, "{}", r.show());
    support::assert_bytes(&r.body, &support::pattern(BIG as u64));
    // A second client: the pooled TLS connection serves it too.
    let r = Client::connect(z.addr()).get("/other");
    assert_eq!(r.status, 200, "{}", r.show());
    let seen = ng.wait_requests(ng.keep.port(), N + 2);
    let conns: HashSet<u64> = seen.iter().map(|(c, _)| *c).collect();
    // Last (nginx answers `return 200` before it read the body, so the
    // connection may not be reusable after it).
    let body = support::pattern(100_000);
    let mut req = b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n".to_vec();
    req.extend_from_slice(&body);
    let r = c.request(&req);
    assert_eq!(r.status, 200, "{}", r.show());
    assert_eq!(
        conns.len(),
        1,
        "one TLS connection for every request: {seen:?}"
    );
    let m = metrics_text(&z);
    let ep = format!("cluster=\"c\",endpoint=\"{}\"", ng.keep);
    assert_eq!(
        series(
            &m,
            &format!("zgix_upstream_endpoint_connects_total{{{ep}}}")
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        series(
            &m,
            "zgix_upstream_tls_failures_total{cluster=\"c\",reason=\"unknown_ca\"}"
        ),
        0.0
    );
}

#[test]
fn a_new_connection_to_the_origin_resumes_the_tls_session() {
    let pki = Pki::new("resume");
    let ng = Nginx::start(&pki);
    // No server_name: the certificate is checked against the endpoint's
    // IP address (its IP SAN).
    let tls = format!(r#"{{"ca": "{}"}}"#, pki.ca.display());
    let z = Zgix::start_json(&config(&ng.close.to_string(), &tls, ""));
    for i in 0..3 {
        let r = Client::connect(z.addr()).get(&format!("/{i}"));
        assert_eq!(r.status, 200, "{}", r.show());
    }
    let seen = ng.wait_requests(ng.close.port(), 3);
    let conns: HashSet<u64> = seen.iter().map(|(c, _)| *c).collect();
    assert_eq!(
        conns.len(),
        3,
        "the origin closes each connection: {seen:?}"
    );
    assert!(!seen[0].1, "the first handshake is a full one: {seen:?}");
    assert!(
        seen[1].1 && seen[2].1,
        "the later handshakes resume: {seen:?}"
    );
}

/// Starts zgix towards the keep-alive port with `tls`, asks once, and
/// returns the answer's status and zgix's metrics.
fn one_request(ng: &Nginx, tls: &str) -> (u16, String, Zgix) {
    let z = Zgix::start_json(&config(&ng.keep.to_string(), tls, r#", "retries": 0"#));
    let r = Client::connect(z.addr()).get("/");
    let m = metrics_text(&z);
    (r.status, m, z)
}

#[test]
fn a_wrong_ca_is_a_502_counted_as_a_tls_failure() {
    let pki = Pki::new("wrongca");
    let ng = Nginx::start(&pki);
    let (status, m, _z) = one_request(&ng, &tls_to(&pki, &pki.other_ca, "origin.test"));
    assert_eq!(status, 502);
    assert_eq!(
        series(
            &m,
            "zgix_upstream_tls_failures_total{cluster=\"c\",reason=\"unknown_ca\"}"
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        series(
            &m,
            "zgix_cluster_upstream_errors_total{cluster=\"c\",kind=\"tls_handshake\"}"
        ),
        1.0,
        "{m}"
    );
    assert!(ng.requests(ng.keep.port()).is_empty(), "nothing was sent");
}

#[test]
fn tls_failure_counts_survive_a_reload() {
    let pki = Pki::new("reloadfail");
    let ng = Nginx::start(&pki);
    let (status, _, z) = one_request(&ng, &tls_to(&pki, &pki.other_ca, "origin.test"));
    assert_eq!(status, 502);
    let key = "zgix_upstream_tls_failures_total{cluster=\"c\",reason=\"unknown_ca\"}";
    z.signal("HUP");
    let m = wait_for("the reload", || {
        let m = metrics_text(&z);
        (series(&m, "zgix_config_generation") >= 2.0).then_some(m)
    });
    assert_eq!(
        series(&m, key),
        1.0,
        "the count went back at the reload: {m}"
    );
    assert_eq!(Client::connect(z.addr()).get("/").status, 502);
    assert_eq!(series(&metrics_text(&z), key), 2.0);
}

/// A one-connection TLS origin (rustls, the Pki's certificate): answers
/// one request kept alive, then reports how the connection ended: `Ok(())`
/// on `close_notify`, the error on a FIN without it.
fn one_connection_origin(pki: &Pki) -> (SocketAddr, std::sync::mpsc::Receiver<Result<(), String>>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::io::{Read, Write};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.cert)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(&pki.key).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let config = std::sync::Arc::new(config);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (tcp, _) = l.accept().unwrap();
        tcp.set_read_timeout(Some(WAIT)).unwrap();
        let conn = rustls::ServerConnection::new(config).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        // The request head, line by line up to its blank line.
        let mut lines = std::io::BufReader::new(&mut tls);
        let mut line = String::new();
        loop {
            line.clear();
            match std::io::BufRead::read_line(&mut lines, &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => {}
            }
        }
        drop(lines);
        let _ = tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n");
        let _ = tls.flush();
        let mut buf = [0u8; 64];
        let end = match tls.read(&mut buf) {
            Ok(0) => Ok(()),
            Ok(n) => Err(format!("{n} more bytes")),
            Err(e) => Err(e.to_string()),
        };
        let _ = tx.send(end);
    });
    (addr, rx)
}

#[test]
fn an_idle_pooled_tls_connection_closed_by_the_pool_sends_close_notify() {
    let pki = Pki::new("closenotify");
    let (origin, ended) = one_connection_origin(&pki);
    let tls = tls_to(&pki, &pki.ca, "origin.test");
    let json = config(&origin.to_string(), &tls, "").replacen(
        "{",
        r#"{"limits": {"upstream_pool_idle_timeout_ms": 50}, "#,
        1,
    );
    let z = Zgix::start_json(&json);
    let r = Client::connect(z.addr()).get("/");
    assert_eq!(r.status, 200);
    // The shard's sweep (every second) closes it past the idle timeout.
    let end = ended
        .recv_timeout(WAIT)
        .expect("the pool closed the connection");
    assert_eq!(end, Ok(()), "closed without close_notify");
}

#[test]
fn a_wrong_server_name_is_a_502_counted_as_bad_name() {
    let pki = Pki::new("wrongname");
    let ng = Nginx::start(&pki);
    let (status, m, _z) = one_request(&ng, &tls_to(&pki, &pki.ca, "elsewhere.test"));
    assert_eq!(status, 502);
    assert_eq!(
        series(
            &m,
            "zgix_upstream_tls_failures_total{cluster=\"c\",reason=\"bad_name\"}"
        ),
        1.0,
        "{m}"
    );
}

#[test]
fn verify_false_takes_any_certificate_and_is_warned_at_start() {
    let pki = Pki::new("noverify");
    let ng = Nginx::start(&pki);
    let (status, _, z) = one_request(&ng, r#"{"server_name": "elsewhere.test", "verify": false}"#);
    assert_eq!(status, 200);
    assert!(
        z.stderr()
            .contains("clusters.c.tls.verify: false: the origins' certificates are not checked"),
        "{}",
        z.stderr()
    );
}

#[test]
fn health_probes_speak_tls_and_a_wrong_ca_marks_the_endpoint_down() {
    let pki = Pki::new("probe");
    let ng = Nginx::start(&pki);
    let health = r#", "health": {"active": {"path": "/healthz", "interval_ms": 500, "timeout_ms": 500, "unhealthy": 2}}"#;
    let good = Zgix::start_json(&config(
        &ng.keep.to_string(),
        &tls_to(&pki, &pki.ca, "origin.test"),
        health,
    ));
    // The probes arrive over TLS: nginx logs them with their protocol.
    wait_for("two TLS probes in nginx's log", || {
        let log = std::fs::read_to_string(ng.dir.join("access.log")).unwrap_or_default();
        (log.lines().filter(|l| l.contains(" TLSv1.")).count() >= 2).then_some(())
    });
    assert!(
        !good.stderr().contains("active checks"),
        "{}",
        good.stderr()
    );
    drop(good);
    let bad = Zgix::start_json(&config(
        &ng.keep.to_string(),
        &tls_to(&pki, &pki.other_ca, "origin.test"),
        health,
    ));
    wait_for("the endpoint marked down", || {
        bad.stderr()
            .contains("failed 2 active checks (TLS handshake: unknown_ca); down")
            .then_some(())
    });
}

#[test]
fn check_reads_the_ca_file_and_names_its_path() {
    let pki = Pki::new("check");
    let missing = pki.dir.join("missing.pem");
    let cfg = TempConfig::new(&config(
        "127.0.0.1:9",
        &tls_to(&pki, &missing, "origin.test"),
        "",
    ));
    let run = run_zgix(&["--check", "--config", cfg.path.to_str().unwrap()]);
    assert_ne!(run.status.code(), Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains("clusters.c.tls.ca: ") && run.stderr.contains("missing.pem"),
        "{}",
        run.stderr
    );
    std::fs::write(&missing, "not a certificate\n").unwrap();
    let run = run_zgix(&["--check", "--config", cfg.path.to_str().unwrap()]);
    assert!(run.stderr.contains("clusters.c.tls.ca: "), "{}", run.stderr);
    let cfg = TempConfig::new(&config(
        "127.0.0.1:9",
        &tls_to(&pki, &pki.ca, "origin.test"),
        "",
    ));
    let run = run_zgix(&["--check", "--config", cfg.path.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
}
