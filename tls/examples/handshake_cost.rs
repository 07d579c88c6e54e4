//! TLS 1.3 handshakes in memory, zgix's server [`Session`] against rustls' client offering OpenSSL's suite order (AES-256-GCM-SHA384 first), for counting the server's instructions per handshake under callgrind:
//!
//! `valgrind --tool=callgrind --toggle-collect='<rustls::server::server_conn::UnbufferedServerConnection as zgix_tls::session::Side>::process' target/release/examples/handshake_cost 100 [full|resumed] [x25519|p256|x25519mlkem768]`
//!
//! `full` (the default): the client keeps no session, so every handshake
//! signs; `resumed`: after a first full one, each offers the ticket of the
//! one before (PSK with DHE, no signature). The third argument is the one
//! key-exchange group the client offers (default: rustls' list, X25519
//! first). Prints the suite, the group, how many handshakes resumed, and the
//! server's wall time per handshake (its record processing only, natively:
//! run it on an idle CPU).

use std::sync::Arc;

use zgix_tls::server::{self, Listener, MinVersion};
use zgix_tls::{CertStore, Session, Tickets, UnknownSni};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100);
    let resume = std::env::args().nth(2).as_deref() == Some("resumed");
    let group = std::env::args().nth(3);
    let dir = std::env::temp_dir().join(format!("zgix-hs-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["bench.example".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (c, k) = (dir.join("c.pem"), dir.join("k.pem"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    let loaded = vec![zgix_tls::load(&c, &k).unwrap()];
    let _ = std::fs::remove_dir_all(&dir);
    let sc = server::config(&Listener {
        certs: Arc::new(CertStore::new(&loaded, UnknownSni::Default).unwrap()),
        min_version: MinVersion::Tls12,
        alpn: vec![b"http/1.1".to_vec()],
        tickets: Some(Arc::new(Tickets::generate().unwrap())),
    })
    .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    // OpenSSL's default TLS 1.3 order, as `s_time` and most clients send it.
    if let Some(g) = &group {
        use rustls::crypto::aws_lc_rs::kx_group;
        provider.kx_groups = vec![match g.as_str() {
            "x25519" => kx_group::X25519,
            "p256" => kx_group::SECP256R1,
            "x25519mlkem768" => kx_group::X25519MLKEM768,
            other => panic!("unknown group {other}: x25519, p256 or x25519mlkem768"),
        }];
    }
    provider.cipher_suites.sort_by_key(|s| match s.suite() {
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 0,
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => 1,
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 2,
        _ => 3,
    });
    let mut cc = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    if !resume {
        cc.resumption = rustls::client::Resumption::disabled();
    }
    let cc = Arc::new(cc);
    let (mut suite, mut resumed) = ("", 0);
    let mut kx = String::new();
    let mut server_time = std::time::Duration::ZERO;
    for _ in 0..n {
        let mut client =
            rustls::ClientConnection::new(cc.clone(), "bench.example".try_into().unwrap()).unwrap();
        let mut s = Session::new(sc.clone()).unwrap();
        let mut to_s = Vec::new();
        while !s.is_established() {
            while client.wants_write() {
                client.write_tls(&mut to_s).unwrap();
            }
            let t = std::time::Instant::now();
            let p = s.read(&mut to_s, &mut |_| {}).unwrap();
            server_time += t.elapsed();
            to_s.drain(..p.consumed);
            // With the server's last flight: the ticket after its Finished.
            let out = s.take_output();
            let mut r = &out[..];
            while !r.is_empty() {
                client.read_tls(&mut r).unwrap();
                client.process_new_packets().unwrap();
            }
        }
        suite = s.info().cipher;
        resumed += usize::from(s.info().resumed);
        kx = format!(
            "{:?}",
            client.negotiated_key_exchange_group().map(|g| g.name())
        );
    }
    println!(
        "{n} handshakes, {resumed} resumed, {suite}, {kx}, server {:.1} µs each",
        server_time.as_secs_f64() * 1e6 / n as f64
    );
}
