//! End-to-end TLS termination with real clients (curl, openssl s_client) on loopback: certificates by SNI, ALPN, versions, session tickets resumed across shards, plaintext HTTP on the TLS port, X-Forwarded-Proto, admission on TLS, --check and reload reading the certificates, and the TLS series in /metrics. Certificates are made by the test (rcgen); none is committed.

mod lifecycle_support;
mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use lifecycle_support::Proc;
use support::{metrics_text, run_zgix, series, with_test_defaults, Origin, TempConfig, Zgix};

/// A scratch directory with a CA-less self-signed certificate per name set.
struct Certs {
    dir: PathBuf,
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Certs {
    fn new(tag: &str) -> Certs {
        let dir = std::env::temp_dir().join(format!("zgix-tls-e2e-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Certs { dir }
    }

    /// Writes `<stem>.pem` and `<stem>.key` for `names` (ECDSA P-256), valid
    /// `days` more days.
    fn make(&self, stem: &str, names: &[&str], days: i64) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, names[0]);
        let today = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
            / 86_400;
        let (y, m, d) = civil(today - 1);
        p.not_before = rcgen::date_time_ymd(y, m, d);
        let (y, m, d) = civil(today + days + 1);
        p.not_after = rcgen::date_time_ymd(y, m, d);
        let cert = p.self_signed(&key).unwrap();
        let (c, k) = (
            self.dir.join(format!("{stem}.pem")),
            self.dir.join(format!("{stem}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

/// The civil date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y as i32, m as u8, d as u8)
}

fn config(origin: SocketAddr, tls: &str, extra_http: &str) -> String {
    format!(
        r#"{{"cpus": [0, 1], "admin": {{"bind": "127.0.0.1:0"}},
            "listeners": [{{"bind": "127.0.0.1:0", "name": "public", "tls": {tls},
                           "http": {{"cluster": "c"{extra_http}}}}}],
            "clusters": {{"c": {{"endpoints": ["{origin}"]}}}}}}"#
    )
}

fn tls_block(certs: &[(PathBuf, PathBuf)], more: &str) -> String {
    let list: Vec<String> = certs
        .iter()
        .map(|(c, k)| format!(r#"{{"cert": "{}", "key": "{}"}}"#, c.display(), k.display()))
        .collect();
    format!(r#"{{"certificates": [{}]{more}}}"#, list.join(", "))
}

/// A zgix on two shards with one TLS listener serving one certificate for
/// `site.example` (made under a scratch directory tagged `tag`) in front of
/// a fresh origin; `extra_http` is appended to the listener's `http` block.
fn one_site(tag: &str, extra_http: &str) -> (Certs, (PathBuf, PathBuf), Origin, Zgix) {
    let certs = Certs::new(tag);
    let site = certs.make("site", &["site.example"], 90);
    let o = Origin::start();
    let z = Zgix::start_json(&config(
        o.addr(),
        &tls_block(std::slice::from_ref(&site), ""),
        extra_http,
    ));
    (certs, site, o, z)
}

/// [`one_site`] on one shard with busy polling off, so that every idle
/// moment is a park (the backstop tests count parks), with `env` for zgix.
fn one_quiet_shard(tag: &str, env: &[(&str, &str)]) -> (Certs, (PathBuf, PathBuf), Origin, Zgix) {
    let certs = Certs::new(tag);
    let site = certs.make("site", &["site.example"], 90);
    let o = Origin::start();
    let json = config(o.addr(), &tls_block(std::slice::from_ref(&site), ""), "").replacen(
        r#""cpus": [0, 1]"#,
        r#""cpus": [0], "limits": {"busy_poll_us": 0}"#,
        1,
    );
    let z = Zgix::start_json_env(&json, env);
    (certs, site, o, z)
}

/// [`one_site`] on one shard (the backstop counter is per shard's park).
fn one_site_on_one_shard(tag: &str) -> (Certs, (PathBuf, PathBuf), Origin, Zgix) {
    let certs = Certs::new(tag);
    let site = certs.make("site", &["site.example"], 90);
    let o = Origin::start();
    let json = config(o.addr(), &tls_block(std::slice::from_ref(&site), ""), "").replacen(
        r#""cpus": [0, 1]"#,
        r#""cpus": [0]"#,
        1,
    );
    let z = Zgix::start_json(&json);
    (certs, site, o, z)
}

/// `curl` over TLS to `name` (resolved to `addr`), trusting `ca`; returns
/// (HTTP status, stderr).
fn curl(addr: SocketAddr, name: &str, ca: &Path, path: &str) -> (u16, String) {
    curl_run(addr, name, ca, path, &[])
}

/// [`curl`] with extra arguments; the HTTP status (0 when it failed).
fn curl_with(addr: SocketAddr, name: &str, ca: &Path, path: &str, extra: &[&str]) -> u16 {
    curl_run(addr, name, ca, path, extra).0
}

fn curl_run(addr: SocketAddr, name: &str, ca: &Path, path: &str, extra: &[&str]) -> (u16, String) {
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
        .args(extra)
        .arg("--cacert")
        .arg(ca)
        .arg("--resolve")
        .arg(format!("{name}:{}:127.0.0.1", addr.port()))
        .arg(format!("https://{name}:{}{path}", addr.port()))
        .output()
        .expect("run curl");
    let code = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `openssl s_client` with `args`, sending one HTTP request; its stdout and
/// stderr together.
fn s_client(addr: SocketAddr, args: &[&str]) -> String {
    let mut child = Command::new("openssl")
        .arg("s_client")
        .arg("-connect")
        .arg(addr.to_string())
        // Wait for the answer after stdin ends (the request closes it).
        .arg("-ign_eof")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run openssl");
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `/metrics` once `done` holds of it (counts are taken after the connection's
/// last event, which can follow the client's exit), or after `IO_TIMEOUT`.
fn metrics_until(z: &Zgix, done: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + support::IO_TIMEOUT;
    loop {
        let m = metrics_text(z);
        if done(&m) || std::time::Instant::now() > deadline {
            return m;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn curl_gets_200_over_tls_with_the_certificate_its_sni_names_and_forwarded_proto_https() {
    let certs = Certs::new("sni");
    let site = certs.make("site", &["site.example"], 90);
    let api = certs.make("api", &["api.example", "*.api.example"], 90);
    let o = Origin::start();
    let z = Zgix::start_json(&config(
        o.addr(),
        &tls_block(&[site.clone(), api.clone()], ""),
        "",
    ));
    let addr = z.addr();
    let (code, err) = curl(addr, "site.example", &site.0, "/a");
    assert_eq!(code, 200, "{err}");
    // The api certificate answers for its wildcard; trusting only it proves
    // it was the one sent.
    let (code, err) = curl(addr, "v1.api.example", &api.0, "/b");
    assert_eq!(code, 200, "{err}");
    // Trusting the other certificate fails: SNI picked this one.
    let (code, _) = curl(addr, "v1.api.example", &site.0, "/c");
    assert_eq!(code, 0, "a certificate for another name must not verify");
    let heads: Vec<String> = o
        .requests()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.head).into_owned())
        .collect();
    assert_eq!(heads.len(), 2, "{heads:?}");
    for h in &heads {
        assert!(h.contains("\r\nX-Forwarded-Proto: https\r\n"), "{h}");
    }
    // The refused client's handshake is counted when zgix has read its alert,
    // which may be after curl exits: wait for the count.
    let m = metrics_until(&z, |m| {
        series(
            m,
            "zgix_tls_handshakes_total{listener=\"public\",result=\"alert\",version=\"none\"}",
        ) >= 1.0
    });
    assert_eq!(
        series(
            &m,
            "zgix_tls_handshakes_total{listener=\"public\",result=\"ok\",version=\"TLSv1.3\"}"
        ),
        2.0,
        "{m}"
    );
    assert!(m.contains(
        "zgix_tls_certificate_expiry_seconds{listener=\"public\",name=\"site.example\"} "
    ));
}

#[test]
fn openssl_sees_alpn_refuses_tls11_and_resumes_across_shards() {
    let (certs, _site, _o, z) = one_site("ossl", "");
    assert_eq!(z.shards, 2);
    let addr = z.addr();
    let out = s_client(
        addr,
        &[
            "-servername",
            "site.example",
            "-alpn",
            "http/1.1",
            "-tls1_3",
        ],
    );
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");
    assert!(out.contains("HTTP/1.1 200 "), "{out}");
    let out = s_client(addr, &["-servername", "site.example", "-tls1_1"]);
    assert!(
        !out.contains("HTTP/1.1 200 "),
        "TLS 1.1 must not be spoken: {out}"
    );
    // One session, then 20 reconnects with its ticket: the connections land
    // on both shards (SO_REUSEPORT), every one resumes.
    let sess = certs.dir.join("sess.pem");
    let sess_s = sess.to_string_lossy().into_owned();
    let out = s_client(addr, &["-servername", "site.example", "-sess_out", &sess_s]);
    assert!(out.contains("HTTP/1.1 200 "), "{out}");
    let mut reused = 0;
    for _ in 0..20 {
        let out = s_client(addr, &["-servername", "site.example", "-sess_in", &sess_s]);
        if out.contains("Reused, TLSv1.3") {
            reused += 1;
        }
    }
    assert_eq!(reused, 20);
    let m = metrics_text(&z);
    assert_eq!(
        series(&m, "zgix_tls_resumed_total{listener=\"public\"}"),
        20.0
    );
}

/// A client whose ALPN offer names none of the listener's protocols
/// (`curl --http1.0` offers only `http/1.0`) is served without ALPN, as
/// nginx and HAProxy serve it, instead of failing the handshake with
/// `no_application_protocol`; an offer with one common name still gets it.
#[test]
fn a_client_offering_only_alpn_names_zgix_does_not_speak_is_served_without_alpn() {
    let (_certs, site, o, z) = one_site("alpn10", "");
    let (code, err) = curl_run(z.addr(), "site.example", &site.0, "/ten", &["--http1.0"]);
    assert_eq!(code, 200, "{err}");
    let out = s_client(
        z.addr(),
        &["-servername", "site.example", "-alpn", "http/1.0,spdy/3"],
    );
    assert!(out.contains("No ALPN negotiated"), "{out}");
    assert!(out.contains("HTTP/1.1 200 "), "{out}");
    let out = s_client(
        z.addr(),
        &["-servername", "site.example", "-alpn", "http/1.0,http/1.1"],
    );
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");
    let heads: Vec<String> = o
        .requests()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.head).into_owned())
        .collect();
    assert_eq!(heads.len(), 3, "{heads:?}");
    assert!(heads[0].starts_with("GET /ten HTTP/1.1\r\n"), "{heads:?}");
}

#[test]
fn plaintext_http_on_the_tls_port_gets_400_in_cleartext() {
    let certs = Certs::new("plain");
    let site = certs.make("site", &["site.example"], 90);
    let o = Origin::start();
    let z = Zgix::start_json(&config(o.addr(), &tls_block(&[site], ""), ""));
    let mut c = support::Client::connect(z.addr());
    let r = c.request(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 400, "{}", r.show());
    assert!(o.requests().is_empty());
    let key =
        "zgix_tls_handshakes_total{listener=\"public\",result=\"plaintext\",version=\"none\"}";
    let m = metrics_until(&z, |m| series(m, key) >= 1.0);
    assert_eq!(series(&m, key), 1.0);
}

#[test]
fn the_rate_limit_counts_tls_requests_like_plain_ones() {
    let (_certs, site, _o, z) = one_site(
        "rate",
        r#", "rate_limit": {"requests": 1, "window_ms": 3600000, "burst": 2}"#,
    );
    let codes: Vec<u16> = (0..3)
        .map(|_| curl(z.addr(), "site.example", &site.0, "/").0)
        .collect();
    assert_eq!(codes, [200, 200, 429]);
}

#[test]
fn check_and_reload_read_the_certificates() {
    let certs = Certs::new("check");
    let good = certs.make("good", &["site.example"], 90);
    let soon = certs.make("soon", &["soon.example"], 3);
    let other = certs.make("other", &["other.example"], 90);
    let o = Origin::start();
    // A key of another certificate, and a missing file: both named.
    let bad = tls_block(
        &[
            (good.0.clone(), other.1.clone()),
            (certs.dir.join("none.pem"), good.1.clone()),
        ],
        "",
    );
    let file = TempConfig::new(&with_test_defaults(&config(o.addr(), &bad, "")));
    let r = run_zgix(&["--check", "--config", &file.path.to_string_lossy()]);
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    assert!(
        r.stderr.contains("listeners[0].tls.certificates[0]: ")
            && r.stderr.contains("does not match the certificate"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("listeners[0].tls.certificates[1]: ")
            && r.stderr.contains("none.pem: cannot read it"),
        "{}",
        r.stderr
    );
    let warn = TempConfig::new(&with_test_defaults(&config(
        o.addr(),
        &tls_block(&[soon], ""),
        "",
    )));
    let r = run_zgix(&["--check", "--config", &warn.path.to_string_lossy()]);
    assert_eq!(r.status.code(), Some(0), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("warning: listeners[0].tls.certificates[0].cert: the certificate expires in"),
        "{}",
        r.stderr
    );

    // Reload onto another certificate: new connections get it; a bad file
    // refuses the reload and the old certificate keeps serving.
    let p = Proc::start(
        &config(o.addr(), &tls_block(std::slice::from_ref(&good), ""), ""),
        &[],
    );
    let addr = p.listeners()[0];
    assert_eq!(curl(addr, "site.example", &good.0, "/").0, 200);
    p.reload(
        &config(o.addr(), &tls_block(std::slice::from_ref(&other), ""), ""),
        1,
    );
    let addr = p.listeners()[0];
    assert_eq!(curl(addr, "other.example", &other.0, "/").0, 200);
    p.write_config(&config(o.addr(), &bad, ""));
    p.signal("HUP");
    let log = p.wait_log("reload rejected", 1);
    assert!(
        log.contains("reload: listeners[0].tls.certificates[0]: "),
        "{log}"
    );
    assert_eq!(
        curl(addr, "other.example", &other.0, "/").0,
        200,
        "the old certificate serves"
    );
}

#[test]
fn sessions_from_before_an_upgrade_resume_on_the_new_process() {
    let certs = Certs::new("upgrade");
    let site = certs.make("site", &["site.example"], 90);
    let o = Origin::start();
    let port = lifecycle_support::free_port();
    let json = format!(
        r#"{{"cpus": [0, 1], "listeners": [{{"bind": "127.0.0.1:{port}", "name": "public",
            "tls": {}, "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{}"]}}}}}}"#,
        tls_block(std::slice::from_ref(&site), ""),
        o.addr()
    );
    let mut old = Proc::start(&json, &[]);
    let addr = old.listeners()[0];
    let sess = certs.dir.join("sess.pem");
    let sess_s = sess.to_string_lossy().into_owned();
    let out = s_client(addr, &["-servername", "site.example", "-sess_out", &sess_s]);
    assert!(out.contains("HTTP/1.1 200 "), "{out}");
    let new = Proc::start(&json, &["--upgrade"]);
    assert!(old.wait_exit().success(), "{}", old.stderr());
    let out = s_client(addr, &["-servername", "site.example", "-sess_in", &sess_s]);
    assert!(
        out.contains("Reused, TLSv1.3"),
        "{out}\nnew:\n{}",
        new.stderr()
    );
    assert!(out.contains("HTTP/1.1 200 "), "{out}");
}

#[test]
fn the_access_log_names_the_tls_version_cipher_sni_and_resumption() {
    let certs = Certs::new("log");
    let site = certs.make("site", &["site.example"], 90);
    let o = Origin::start();
    let log = certs.dir.join("access.log");
    let json = format!(
        r#"{{"cpus": [0], "access_log": {{"path": "{}", "format": "json"}},
            "listeners": [{{"bind": "127.0.0.1:0", "name": "public", "tls": {},
                           "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{}"]}}}}}}"#,
        log.display(),
        tls_block(std::slice::from_ref(&site), ""),
        o.addr()
    );
    let z = Zgix::start_json(&json);
    assert_eq!(curl(z.addr(), "site.example", &site.0, "/logged").0, 200);
    let mut line = None;
    for _ in 0..400 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains("/logged")) {
            line = Some(l.to_string());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let line = line.expect("the request's access-log line");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["tls_version"], "TLSv1.3", "{line}");
    assert!(
        v["tls_cipher"].as_str().unwrap().starts_with("TLS13_"),
        "{line}"
    );
    assert_eq!(v["sni"], "site.example", "{line}");
    assert_eq!(v["tls_resumed"], false, "{line}");
}

#[test]
fn the_waf_and_a_proxy_header_before_tls_work_on_a_tls_listener() {
    let (_certs, site, o, z) = one_site("waf", r#", "waf": {"deny": ["/forbidden"]}"#);
    assert_eq!(curl(z.addr(), "site.example", &site.0, "/open").0, 200);
    assert_eq!(
        curl(z.addr(), "site.example", &site.0, "/forbidden/x").0,
        403
    );
    // PROXY v1 before the ClientHello: the header is read on the raw socket,
    // the handshake follows on the bytes after it.
    let json = format!(
        r#"{{"cpus": [0], "listeners": [{{"bind": "127.0.0.1:0", "proxy_protocol": true,
            "tls": {}, "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{}"]}}}}}}"#,
        tls_block(std::slice::from_ref(&site), ""),
        o.addr()
    );
    let p = Zgix::start_json(&json);
    let with = curl_with(
        p.addr(),
        "site.example",
        &site.0,
        "/pp",
        &["--haproxy-protocol"],
    );
    assert_eq!(with, 200);
    let without = curl_with(p.addr(), "site.example", &site.0, "/pp", &[]);
    assert_eq!(
        without, 0,
        "a ClientHello where the PROXY header belongs is refused"
    );
}

#[test]
fn the_connection_limit_counts_tls_connections() {
    let (_certs, site, o, z) = one_site("conn", r#", "conn_limit": {"max": 1}"#);
    // One kept-alive TLS connection holds the client's one slot.
    let mut held = Command::new("openssl")
        .args(["s_client", "-quiet", "-connect"])
        .arg(z.addr().to_string())
        .args(["-servername", "site.example"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run openssl");
    held.stdin
        .as_mut()
        .unwrap()
        .write_all(b"GET /held HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut seen = false;
    for _ in 0..400 {
        if o.requests().len() == 1 {
            seen = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(seen, "the held connection's request reached the origin");
    assert_eq!(curl(z.addr(), "site.example", &site.0, "/second").0, 503);
    let _ = held.kill();
    let _ = held.wait();
}

/// A keep-alive HTTPS/1.1 client (rustls) trusting `ca`, one request at a
/// time, reading Content-Length answers.
struct KeepAlive {
    s: rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>,
}

impl KeepAlive {
    fn connect(addr: SocketAddr, name: &'static str, ca: &Path) -> KeepAlive {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from_pem_file(ca).unwrap())
            .unwrap();
        let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let conn =
            rustls::ClientConnection::new(std::sync::Arc::new(cfg), name.try_into().unwrap())
                .unwrap();
        let tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(support::IO_TIMEOUT)).unwrap();
        KeepAlive {
            s: rustls::StreamOwned::new(conn, tcp),
        }
    }

    /// GET `path`: the status and the body's length.
    fn get(&mut self, path: &str) -> (u16, usize) {
        use std::io::Read;
        let req = format!("GET {path} HTTP/1.1\r\nHost: site.example\r\n\r\n");
        self.s.write_all(req.as_bytes()).unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            self.s.read_exact(&mut b).unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let status = head[9..12].parse().unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().unwrap())
            })
            .expect("a content-length answer");
        let mut body = vec![0u8; len];
        self.s.read_exact(&mut body).unwrap();
        (status, len)
    }
}

/// Heap allocations of zgix's one shard over a window in which `n`
/// keep-alive requests of `path` are made, lasting at least `at_least`
/// (glommio's timers allocate per unit of time, not per request, so two
/// windows of one length differ by the requests), and how long they took.
/// The counter is published on the shard's 100 ms tick, as in
/// `support::allocation_window`, whose client is plaintext.
fn allocation_window(
    z: &Zgix,
    c: &mut KeepAlive,
    path: &str,
    n: usize,
    at_least: std::time::Duration,
) -> (u64, std::time::Duration) {
    let tick = std::time::Duration::from_millis(350);
    std::thread::sleep(tick);
    let before = support::heap_allocations(z);
    let start = std::time::Instant::now();
    for _ in 0..n {
        assert_eq!(c.get(path).0, 200);
    }
    let took = start.elapsed();
    std::thread::sleep(at_least.saturating_sub(took) + tick);
    (support::heap_allocations(z) - before, took)
}

#[test]
fn keep_alive_https_requests_allocate_only_rustls_own_per_record_with_64_b_and_16_kib_bodies() {
    const N: usize = 400;
    let certs = Certs::new("alloc");
    let site = certs.make("site", &["site.example"], 90);
    let o = Origin::start();
    let z = Zgix::start_json(&format!(
        r#"{{"cpus": [0], "admin": {{"bind": "127.0.0.1:0"}},
            "listeners": [{{"bind": "127.0.0.1:0", "name": "public", "tls": {},
                           "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{}"]}}}}}}"#,
        tls_block(std::slice::from_ref(&site), ""),
        o.addr()
    ));
    let mut c = KeepAlive::connect(z.addr(), "site.example", &site.0);
    // rustls 0.23's unbuffered API allocates once per TLS record (a record
    // read is copied into a Vec after its in-place decryption, a record
    // written is encrypted into one): the request's record and the answer's
    // one record (head and body go out in one write, so in one record; the
    // 16 KiB answer fills two). Besides, zgix boxes the TLS head read of
    // each request (`ClientConn::read_lean`, so an idle connection's future
    // stays small): 3 and 4 per request. A head and body written apart
    // would add one (one record more), which the bound catches. zgix adds
    // nothing else (it did: a 16 KiB body grew and freed the session's send
    // buffer, 6 per request in all).
    for (path, rustls_own) in [("/cl/64", 3), ("/cl/16384", 4)] {
        // Warm: the connection's buffers, the shard's pools, the origin's.
        for _ in 0..20 {
            assert_eq!(c.get(path), (200, path[4..].parse().unwrap()));
        }
        let (busy, took) = allocation_window(&z, &mut c, path, N, Default::default());
        let (idle, _) = allocation_window(&z, &mut c, path, 0, took);
        // The scrapes allocate a varying few dozen times; half an
        // allocation per request more than rustls' would add N / 2.
        let bound = idle + (rustls_own * N + N / 2) as u64;
        assert!(
            busy <= bound,
            "{path}: {N} requests made {busy} allocations, none made {idle} (bound {bound})"
        );
    }
    assert_eq!(o.accepted(), 1, "one pooled upstream connection");
}

/// The TLS answers zgix closes after (`Connection: close` over HTTP/1.1, an
/// HTTP/2 connection the client ends, a handshake the client closes at once)
/// go out with their close_notify and FIN, and no park on the shard slept to
/// the inline-send backstop for them (`zgix_io_backstop_parks_total` stays
/// where it was). Before the sockets were marked closing, each of these
/// held the uring shard for up to 1 ms (issue 19's close stall). A guard
/// against regressions: with the test defaults' busy polling it passes
/// without the mark too. With busy polling off it failed without the mark,
/// but also in 2 of 5 runs of this file with it: whether those parks are a
/// client slow to send (legitimate) or another stall is not known yet.
#[test]
fn tls_answers_before_zgix_closes_do_not_wait_for_the_backstop() {
    let (_certs, site, _o, z) = one_site_on_one_shard("backstop");
    let start = series(
        &support::metrics_after_tick(&z),
        "zgix_io_backstop_parks_total",
    );
    for i in 0..5 {
        let path = format!("/close{i}");
        let code = curl_with(
            z.addr(),
            "site.example",
            &site.0,
            &path,
            &["--http1.1", "-H", "Connection: close"],
        );
        assert_eq!(code, 200, "{path}");
        let code = curl_with(z.addr(), "site.example", &site.0, "/h2", &["--http2"]);
        assert_eq!(code, 200, "h2");
        let out = s_client(z.addr(), &["-servername", "site.example", "-tls1_3"]);
        assert!(out.contains("HTTP/1.1 200"), "{out}");
    }
    let m = support::metrics_after_tick(&z);
    let parks = series(&m, "zgix_io_backstop_parks_total") - start;
    assert_eq!(parks, 0.0, "parks slept to the backstop\n{m}");
}

/// A TLS 1.3 client that sends its first request with its Finished
/// (`openssl s_time -new -www /`) gets it answered without the shard's park
/// sleeping to the inline-send backstop: zgix's session ticket, sent after
/// that Finished, is followed by the request it has already read, not by a
/// peer event. Before `Sock::goes_on` marked that send, each such
/// connection slept to the backstop (about 1 ms by default; set to 5 ms
/// here, where zgix_io_backstop_parks_total saw 139 such parks over 312
/// connections), which halved the full-handshake rate on uring.
#[test]
fn a_request_that_came_with_the_tls13_finished_does_not_wait_for_the_backstop() {
    let (_certs, _site, o, z) = one_quiet_shard("ticket", &[("ZGIX_INLINE_BACKSTOP_MS", "5")]);
    let start = series(
        &support::metrics_after_tick(&z),
        "zgix_io_backstop_parks_total",
    );
    let out = Command::new("openssl")
        .args(["s_time", "-connect"])
        .arg(z.addr().to_string())
        .args(["-new", "-tls1_3", "-www", "/", "-time", "1"])
        .output()
        .expect("run openssl s_time");
    let text = String::from_utf8_lossy(&out.stdout);
    let made: u64 = text
        .lines()
        .find_map(|l| {
            l.split_once(" connections in ")
                .map(|(n, _)| n.trim().parse().ok())
        })
        .flatten()
        .unwrap_or(0);
    assert!(made > 0, "s_time made no connection:\n{text}");
    let m = support::metrics_after_tick(&z);
    let parks = series(&m, "zgix_io_backstop_parks_total") - start;
    // A park may still sleep to the backstop when a client is slow to send
    // its next bytes (a loaded machine): rare, where the stall hit about
    // every other connection (128 over 333 without the mark).
    assert!(
        parks * 20.0 <= made as f64,
        "{parks} parks slept to the backstop over {made} connections\n{m}"
    );
    assert!(
        o.requests().len() as u64 >= made,
        "every connection's request reached the origin"
    );
}
