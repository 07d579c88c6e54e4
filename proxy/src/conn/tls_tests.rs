//! The TLS client side on a real loopback socket and both drivers: rustls' client against [`handshake::accept`] and [`ClientConn`] (data both ways, a reply bigger than a record, close_notify), and the first-look refusals (plaintext HTTP, garbage, an unknown SNI, a stalled handshake).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::client::ClientConn;
use super::handshake::{self, Outcome, TlsListener};
use crate::io::{Driver, Kind, Listener, Options};

fn on_driver<F, Fut>(kind: Kind, f: F)
where
    F: FnOnce(Rc<Driver>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    crate::io::tests::on_driver(Options::new(kind), f)
}

struct Certs {
    dir: std::path::PathBuf,
    pem: String,
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn certs(names: &[&str]) -> Certs {
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    let cert = params.self_signed(&key).unwrap();
    let dir =
        std::env::temp_dir().join(format!("zgix-conn-tls-{}-{}", std::process::id(), names[0]));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("c.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("k.pem"), key.serialize_pem()).unwrap();
    Certs {
        dir,
        pem: cert.pem(),
    }
}

fn listener_for(c: &Certs, unknown: &str) -> TlsListener {
    let json = format!(
        r#"{{"certificates": [{{"cert": "{0}/c.pem", "key": "{0}/k.pem"}}], "unknown_sni": "{unknown}", "handshake_timeout_ms": 300}}"#,
        c.dir.display()
    );
    let t: zgix_config::ListenerTls = serde_json::from_str(&json).unwrap();
    let tickets = Arc::new(zgix_tls::Tickets::generate().unwrap());
    TlsListener::load(
        "listeners[0].tls",
        &t,
        &tickets,
        zgix_tls::certs::now_secs(),
    )
    .unwrap()
    .0
}

fn client_config(c: &Certs) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(c.pem.as_bytes()).unwrap())
        .unwrap();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// Accepts one connection on `d` and runs the handshake on it.
async fn accept_one(l: &Listener, tls: &TlsListener) -> Result<ClientConn, (Outcome, ClientConn)> {
    let (s, _) = l.accept().await.unwrap();
    let mut c = ClientConn::plain(s);
    match handshake::accept(c.sock().unwrap(), tls, &[], Some(Duration::from_secs(5))).await {
        Ok(t) => {
            c.start_tls(t);
            Ok(c)
        }
        Err(o) => Err((o, c)),
    }
}

/// Joins a client thread without blocking the executor (the driver must
/// keep turning for the closes the client waits for).
async fn join<T>(d: &Rc<Driver>, t: std::thread::JoinHandle<T>) -> T {
    for _ in 0..2000 {
        if t.is_finished() {
            return t.join().expect("client thread");
        }
        d.sleep(Duration::from_millis(5)).await;
    }
    panic!("the client thread did not finish");
}

fn bound(d: &Rc<Driver>) -> (Listener, std::net::SocketAddr) {
    let fd = crate::io::bind_listener("127.0.0.1:0".parse().unwrap()).unwrap();
    let l = Listener::from_fd(fd, d).unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

#[test]
fn a_rustls_client_talks_both_ways_and_sees_close_notify() {
    for kind in [Kind::Uring, Kind::Epoll] {
        on_driver(kind, |d| async move {
            let c = certs(&["site.example"]);
            let tls = listener_for(&c, "default");
            let (l, addr) = bound(&d);
            let cfg = client_config(&c);
            let peer = std::thread::spawn(move || {
                let conn =
                    rustls::ClientConnection::new(cfg, "site.example".try_into().unwrap()).unwrap();
                let mut s = rustls::StreamOwned::new(conn, TcpStream::connect(addr).unwrap());
                s.write_all(b"ping").unwrap();
                let mut back = Vec::new();
                s.read_to_end(&mut back).unwrap();
                back
            });
            let conn = accept_one(&l, &tls).await.ok().expect("handshake");
            let (info, sni) = conn.tls().unwrap();
            assert_eq!(info.version, "TLSv1.3");
            assert_eq!(sni, Some("site.example"));
            let mut buf = [0u8; 16];
            let n = conn.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"ping");
            let big = vec![7u8; 50_000];
            conn.write_all(&big).await.unwrap();
            conn.shutdown().await;
            let back = join(&d, peer).await;
            assert_eq!(back, big, "read_to_end ended on close_notify, not an error");
            assert_eq!(conn.bytes_read(), 4);
            assert_eq!(conn.bytes_written(), 50_000);
        });
    }
}

#[test]
fn plaintext_garbage_unknown_sni_and_stalls_are_refused_and_classed() {
    for kind in [Kind::Uring, Kind::Epoll] {
        on_driver(kind, |d| async move {
            let c = certs(&["refuse.example"]);
            let tls = listener_for(&c, "refuse");
            let (l, addr) = bound(&d);
            // Plaintext HTTP: 400 in cleartext.
            let t = std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                let mut back = String::new();
                let _ = s.read_to_string(&mut back);
                back
            });
            let Err((o, s)) = accept_one(&l, &tls).await else {
                panic!("plaintext accepted")
            };
            assert_eq!(o, Outcome::Plaintext);
            drop(s);
            let back = join(&d, t).await;
            assert!(back.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{back}");
            // Garbage.
            let t = std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(&[0u8; 32]).unwrap();
                let mut back = Vec::new();
                let _ = s.read_to_end(&mut back);
                back
            });
            let Err((o, s)) = accept_one(&l, &tls).await else {
                panic!("garbage accepted")
            };
            assert_eq!(o, Outcome::BadHello);
            drop(s);
            assert_eq!(join(&d, t).await, zgix_tls::hello::DECODE_ERROR_ALERT);
            // An SNI no certificate names, on a refusing listener.
            let cfg = client_config(&c);
            let t = std::thread::spawn(move || {
                let conn = rustls::ClientConnection::new(cfg, "other.example".try_into().unwrap())
                    .unwrap();
                let mut s = rustls::StreamOwned::new(conn, TcpStream::connect(addr).unwrap());
                s.write_all(b"x")
                    .and_then(|()| s.flush())
                    .err()
                    .map(|e| e.to_string())
            });
            let Err((o, s)) = accept_one(&l, &tls).await else {
                panic!("unknown SNI accepted")
            };
            assert_eq!(o, Outcome::NoCert);
            drop(s);
            let err = join(&d, t).await.expect("the client fails");
            assert!(err.contains("UnrecognisedName"), "{err}");
            // A client that connects and says nothing: the handshake deadline.
            let t = std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                let mut b = [0u8; 1];
                let _ = s.read(&mut b);
            });
            let Err((o, s)) = accept_one(&l, &tls).await else {
                panic!("silence accepted")
            };
            assert_eq!(o, Outcome::Timeout);
            drop(s);
            join(&d, t).await;
        });
    }
}

/// The pattern byte at offset `i` of the long upload below.
fn pattern(i: usize) -> u8 {
    (i * 7 + i / 251) as u8
}

#[test]
fn whole_records_are_decrypted_where_the_ring_received_them_and_split_ones_are_completed() {
    const SMALL: usize = 20;
    const LONG: usize = 100_000;
    for kind in [Kind::Uring, Kind::Epoll] {
        on_driver(kind, move |d| async move {
            let c = certs(&["lend.example"]);
            let tls = listener_for(&c, "default");
            let (l, addr) = bound(&d);
            let cfg = client_config(&c);
            let peer = std::thread::spawn(move || {
                let conn =
                    rustls::ClientConnection::new(cfg, "lend.example".try_into().unwrap()).unwrap();
                let mut s = rustls::StreamOwned::new(conn, TcpStream::connect(addr).unwrap());
                // One record at a time, each after the answer to the one
                // before: each lands in a provided buffer of its own.
                let mut ack = [0u8; 1];
                for i in 0..SMALL {
                    s.write_all(format!("request {i:02}").as_bytes()).unwrap();
                    s.read_exact(&mut ack).unwrap();
                }
                // Records of 16 KiB: most straddle two provided buffers.
                let long: Vec<u8> = (0..LONG).map(pattern).collect();
                s.write_all(&long).unwrap();
                s.conn.send_close_notify();
                s.flush().unwrap();
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
            });
            let conn = accept_one(&l, &tls).await.ok().expect("handshake");
            let taken = crate::io::record_buffers_taken();
            let mut buf = [0u8; 1000];
            for i in 0..SMALL {
                let n = conn.read(&mut buf).await.unwrap();
                assert_eq!(&buf[..n], format!("request {i:02}").as_bytes(), "{kind:?}");
                conn.write_all(b"k").await.unwrap();
            }
            let taken = crate::io::record_buffers_taken() - taken;
            match kind {
                // Decrypted in the provided buffer: no record buffer taken.
                Kind::Uring => assert_eq!(taken, 0, "whole records were copied out to decrypt"),
                // epoll's recv fills the pooled record buffer itself (the
                // first request may have come with the client's Finished).
                Kind::Epoll => assert!(taken >= SMALL as u64 - 1, "{taken}"),
            }
            let mut got = 0;
            while got < LONG {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "{kind:?}: EOF after {got} bytes");
                for (k, b) in buf[..n].iter().enumerate() {
                    assert_eq!(*b, pattern(got + k), "{kind:?}: byte {}", got + k);
                }
                got += n;
            }
            assert_eq!(
                conn.read(&mut buf).await.unwrap(),
                0,
                "close_notify ends it"
            );
            assert_eq!(conn.bytes_read(), (LONG + SMALL * 10) as u64);
            conn.shutdown().await;
            drop(conn);
            join(&d, peer).await;
            assert_eq!(
                d.buffers_held(),
                0,
                "{kind:?}: every provided buffer went back"
            );
        });
    }
}
