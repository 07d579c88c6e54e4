//! Unit tests of the load generator.

use super::*;

#[test]
fn urls() {
    let (a, h, p) = parse_url("http://127.0.0.1:8080/x?y=1").unwrap();
    assert_eq!(
        (a.port(), h.as_str(), p.as_str()),
        (8080, "127.0.0.1:8080", "/x?y=1")
    );
    let (a, _, p) = parse_url("http://127.0.0.1").unwrap();
    assert_eq!((a.port(), p.as_str()), (80, "/"));
    assert!(parse_url("https://127.0.0.1/").is_err());
    assert!(parse_url("http:///").is_err());
}

#[test]
fn request_bytes_with_headers() {
    let mut cfg = LoadConfig::new(
        "127.0.0.1:9".parse().unwrap(),
        "/a",
        1,
        Duration::from_secs(1),
    );
    cfg.headers.push("X-Key: 1".into());
    assert_eq!(
        cfg.request_bytes(),
        b"GET /a HTTP/1.1\r\nHost: 127.0.0.1:9\r\nX-Key: 1\r\n\r\n"
    );
}

#[test]
fn load_against_origin_end_to_end() {
    let ocfg = crate::origin::OriginConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        cpus: vec![0],
        body_bytes: 100,
        delay: Duration::ZERO,
        chunked: true,
        chunk_bytes: 0,
        echo: false,
    };
    let origin = crate::origin::start(&ocfg).unwrap();
    let mut cfg = LoadConfig::new(origin.addr, "/", 4, Duration::from_millis(300));
    cfg.sources = 2;
    let report = execute(&cfg, false).unwrap();
    let s = &report.stats;
    assert!(s.completed > 0);
    assert_eq!(s.status.get(&200), Some(&s.completed));
    assert_eq!(s.errors.total(), 0);
    assert_eq!(s.reconnects, 0);
    assert_eq!(s.hist.len(), s.completed);

    cfg.headers.push("Connection: close".into());
    cfg.sources = 0;
    cfg.rate = Some(200.0);
    let report = execute(&cfg, false).unwrap();
    assert!(report.stats.completed > 0);
    assert_eq!(report.stats.errors.total(), 0);
    assert!(report.stats.reconnects + 4 >= report.stats.completed);
    let json = report.json();
    assert_eq!(json["errors"]["read"], 0);
    assert!(json["latency_us"]["p99"].as_u64().is_some());
}

#[test]
fn stall_is_no_completions_or_half_the_connections_timed_out() {
    let report = |completed, timed_out_connections| {
        let mut stats = Stats::new();
        stats.completed = completed;
        stats.timed_out_connections = timed_out_connections;
        stats.errors.timeout = timed_out_connections;
        Report {
            stats,
            elapsed: Duration::from_secs(5),
            target: "127.0.0.1:9000".parse().unwrap(),
            connections: 4,
            rate: None,
            timeout: DEFAULT_TIMEOUT,
        }
    };
    let why = report(0, 0).stalled().expect("nothing completed");
    assert!(
        why.starts_with(
            "target 127.0.0.1:9000 stalled: no request completed in 5.0s over 4 connections"
        ),
        "{why}"
    );
    let why = report(1000, 2).stalled().expect("2 of 4 timed out");
    assert!(
        why.starts_with("target 127.0.0.1:9000 stalled: 2 of 4 connections timed out (nothing within 2000 ms) after 1000 requests"),
        "{why}"
    );
    assert_eq!(report(1000, 1).stalled(), None);
    assert_eq!(report(1, 0).stalled(), None);
}

/// A rustls server on a std thread answering every request on a keep-alive
/// connection with a 5-byte body; returns its address.
fn tls_server() -> SocketAddr {
    use std::io::{Read, Write};
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["bench.example".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap(),
    );
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut t = rustls::StreamOwned::new(conn, s);
                let mut buf = [0u8; 4096];
                let mut have = Vec::new();
                while let Ok(n) = t.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    have.extend_from_slice(&buf[..n]);
                    while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                        have.drain(..end + 4);
                        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
                        if t.write_all(ok).and_then(|_| t.flush()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn load_over_tls_end_to_end() {
    let addr = tls_server();
    let (https, url) = tls::scheme(&format!("https://{addr}/"));
    assert!(https);
    let (target, host, path) = parse_url(&url).unwrap();
    assert_eq!(target, addr);
    let mut cfg = LoadConfig::new(target, &path, 3, Duration::from_millis(400));
    cfg.host = host;
    cfg.tls = Some(tls::client_config());
    let report = execute(&cfg, false).unwrap();
    let s = &report.stats;
    assert!(s.completed > 3, "{}", report.text());
    assert_eq!(s.status.get(&200), Some(&s.completed));
    assert_eq!(s.errors.total(), 0, "{}", report.text());
    assert_eq!(s.reconnects, 0);
    // Every decrypted byte of every answer, nothing more: 43 bytes each.
    assert_eq!(s.bytes_read, s.completed * 43);
}
