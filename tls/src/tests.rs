//! A zgix [`Session`] against rustls' own client, in memory: the handshake, data both ways, ALPN, versions, tickets shared by two sessions (two shards), `close_notify`, and failures classed as the metrics count them.

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore};

use crate::server::{self, Listener, MinVersion};
use crate::testkeys::{self, Pair};
use crate::{load, CertStore, Failure, Session, Tickets, UnknownSni};

fn listener(pairs: &[&Pair], unknown: UnknownSni, min: MinVersion, tickets: bool) -> Listener {
    let certs: Vec<_> = pairs
        .iter()
        .map(|p| load(&p.cert, &p.key).unwrap())
        .collect();
    Listener {
        certs: Arc::new(CertStore::new(&certs, unknown).unwrap()),
        min_version: min,
        alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        tickets: tickets.then(|| Arc::new(Tickets::generate().unwrap())),
    }
}

/// A server config for one ECDSA certificate naming `site.example` (the
/// first certificate for an unknown name, TLS 1.2 and up), with or without
/// session tickets; and the key pair, for clients to trust.
fn site(tickets: bool) -> (Pair, Arc<rustls::ServerConfig>) {
    let p = testkeys::ecdsa(&["site.example"]);
    let server = server::config(&listener(
        &[&p],
        UnknownSni::Default,
        MinVersion::Tls12,
        tickets,
    ))
    .unwrap();
    (p, server)
}

fn client(
    trust: &[&Pair],
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    for p in trust {
        for c in crate::certs::read_chain(&p.cert).unwrap() {
            roots.add(c).unwrap();
        }
    }
    let mut c = ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    c
}

/// Moves bytes between the two until neither has anything to send;
/// returns what the server decrypted, or the server's failure.
fn pump(c: &mut ClientConnection, s: &mut Session, got: &mut Vec<u8>) -> Result<(), Failure> {
    pump_back(c, s, got, &mut Vec::new())
}

/// [`pump`], keeping what the client decrypted in `back`.
fn pump_back(
    c: &mut ClientConnection,
    s: &mut Session,
    got: &mut Vec<u8>,
    back: &mut Vec<u8>,
) -> Result<(), Failure> {
    let mut inbuf: Vec<u8> = Vec::new();
    for _ in 0..64 {
        let mut moved = false;
        while c.wants_write() {
            c.write_tls(&mut inbuf).unwrap();
            moved = true;
        }
        if !inbuf.is_empty() {
            let p = s.read(&mut inbuf, &mut |d| got.extend_from_slice(d))?;
            inbuf.drain(..p.consumed);
        }
        let out = s.pending().to_vec();
        if !out.is_empty() {
            s.sent(out.len());
            let mut r = &out[..];
            while !r.is_empty() {
                c.read_tls(&mut r).unwrap();
                let _ = c.process_new_packets();
                let mut buf = [0u8; 8192];
                while let Ok(n) = c.reader().read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    back.extend_from_slice(&buf[..n]);
                }
            }
            moved = true;
        }
        if !moved {
            break;
        }
    }
    Ok(())
}

fn connect(
    cfg: &Arc<ClientConfig>,
    name: &str,
    server: &Arc<rustls::ServerConfig>,
) -> (ClientConnection, Session) {
    let c = ClientConnection::new(cfg.clone(), ServerName::try_from(name.to_string()).unwrap())
        .unwrap();
    (c, Session::new(server.clone()).unwrap())
}

#[test]
fn a_handshake_then_data_both_ways_with_alpn_and_close_notify() {
    let (p, server) = site(true);
    let cfg = Arc::new(client(&[&p], &[&rustls::version::TLS13], &[b"http/1.1"]));
    let (mut c, mut s) = connect(&cfg, "site.example", &server);
    let mut got = Vec::new();
    c.writer()
        .write_all(b"GET / HTTP/1.1\r\nHost: site.example\r\n\r\n")
        .unwrap();
    pump(&mut c, &mut s, &mut got).unwrap();
    assert!(s.is_established());
    assert_eq!(got, b"GET / HTTP/1.1\r\nHost: site.example\r\n\r\n");
    let info = s.info();
    assert_eq!(info.version, "TLSv1.3");
    assert!(info.cipher.starts_with("TLS13_"), "{info:?}");
    assert_eq!(info.alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert!(!info.resumed);

    let body = vec![b'x'; 40_000];
    s.write(&body).unwrap();
    s.close();
    let mut back = Vec::new();
    pump_back(&mut c, &mut s, &mut got, &mut back).unwrap();
    assert_eq!(back, body, "three records of at most 16 KiB");
    assert!(s.pending().is_empty(), "sent and freed");
    // A clean end of data, not an unexpected EOF: the client saw close_notify.
    assert!(c.reader().read(&mut [0u8; 1]).is_ok_and(|n| n == 0));
}

#[test]
fn a_ticket_from_one_session_resumes_on_another_sharing_the_keys() {
    let p = testkeys::ecdsa(&["site.example"]);
    let l = listener(&[&p], UnknownSni::Default, MinVersion::Tls12, true);
    // Two shards: two configurations built from the same ticket keys.
    let shard_a = server::config(&l).unwrap();
    let shard_b = server::config(&l).unwrap();
    let cfg = Arc::new(client(&[&p], &[&rustls::version::TLS13], &[]));
    let (mut c, mut s) = connect(&cfg, "site.example", &shard_a);
    c.writer().write_all(b"x").unwrap();
    pump(&mut c, &mut s, &mut Vec::new()).unwrap();
    assert!(!s.info().resumed);
    let (mut c2, mut s2) = connect(&cfg, "site.example", &shard_b);
    c2.writer().write_all(b"y").unwrap();
    pump(&mut c2, &mut s2, &mut Vec::new()).unwrap();
    assert!(s2.info().resumed, "resumed on the other shard");
}

#[test]
fn without_tickets_nothing_resumes() {
    let (p, server) = site(false);
    let cfg = Arc::new(client(&[&p], &[&rustls::version::TLS13], &[]));
    for _ in 0..2 {
        let (mut c, mut s) = connect(&cfg, "site.example", &server);
        c.writer().write_all(b"x").unwrap();
        pump(&mut c, &mut s, &mut Vec::new()).unwrap();
        assert!(s.is_established() && !s.info().resumed);
    }
}

#[test]
fn tls12_is_spoken_unless_the_minimum_is_13() {
    let p = testkeys::ecdsa(&["site.example"]);
    let cfg = Arc::new(client(&[&p], &[&rustls::version::TLS12], &[]));
    let l12 = server::config(&listener(
        &[&p],
        UnknownSni::Default,
        MinVersion::Tls12,
        true,
    ))
    .unwrap();
    let (mut c, mut s) = connect(&cfg, "site.example", &l12);
    c.writer().write_all(b"x").unwrap();
    pump(&mut c, &mut s, &mut Vec::new()).unwrap();
    assert_eq!(s.info().version, "TLSv1.2");
    let l13 = server::config(&listener(
        &[&p],
        UnknownSni::Default,
        MinVersion::Tls13,
        true,
    ))
    .unwrap();
    let (mut c, mut s) = connect(&cfg, "site.example", &l13);
    c.writer().write_all(b"x").unwrap();
    let e = pump(&mut c, &mut s, &mut Vec::new()).unwrap_err();
    assert!(matches!(e, Failure::Alert(_)), "{e:?}");
    assert!(!s.pending().is_empty(), "an alert is queued for the client");
}

#[test]
fn sni_picks_the_certificate_and_refuse_fails_an_unknown_name() {
    let a = testkeys::ecdsa(&["a.example"]);
    let b = testkeys::ecdsa(&["b.example"]);
    let server = server::config(&listener(
        &[&a, &b],
        UnknownSni::Refuse,
        MinVersion::Tls12,
        true,
    ))
    .unwrap();
    // Trusting only b's certificate: the handshake works only if b is picked.
    let cfg = Arc::new(client(&[&b], &[&rustls::version::TLS13], &[]));
    let (mut c, mut s) = connect(&cfg, "b.example", &server);
    c.writer().write_all(b"x").unwrap();
    pump(&mut c, &mut s, &mut Vec::new()).unwrap();
    assert!(s.is_established());
    let cfg = Arc::new(client(&[&a, &b], &[&rustls::version::TLS13], &[]));
    let (mut c, mut s) = connect(&cfg, "c.example", &server);
    c.writer().write_all(b"x").unwrap();
    assert_eq!(
        pump(&mut c, &mut s, &mut Vec::new()).unwrap_err(),
        Failure::NoCert
    );
}

#[test]
fn garbage_after_a_record_header_is_a_bad_hello_and_leaves_an_alert() {
    let (_, server) = site(true);
    let mut s = Session::new(server).unwrap();
    let mut junk = vec![22, 3, 1, 0, 8, 1, 0, 0, 4, 9, 9, 9, 9];
    let e = s.read(&mut junk, &mut |_| {}).unwrap_err();
    assert!(
        matches!(e, Failure::BadHello(_) | Failure::Alert(_)),
        "{e:?}"
    );
    assert!(!s.pending().is_empty(), "an alert for the client");
}

#[test]
fn a_refused_hello_with_another_message_in_its_record_fails_without_a_panic() {
    // A TLS 1.2-only ClientHello to a 1.3-only listener, with a second
    // handshake message (an empty Finished) in the same record: rustls
    // refuses the hello while the second message is still held, and
    // asking it for the alert again would make it look for that message
    // in an empty buffer (a panic in rustls' deframer, i.e. a crashed
    // shard, before flush_alerts called it once only).
    let p = testkeys::ecdsa(&["site.example"]);
    let cfg = Arc::new(client(&[&p], &[&rustls::version::TLS12], &[]));
    let l13 = server::config(&listener(
        &[&p],
        UnknownSni::Default,
        MinVersion::Tls13,
        true,
    ))
    .unwrap();
    let mut c = ClientConnection::new(cfg, "site.example".try_into().unwrap()).unwrap();
    let mut hello = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut hello).unwrap();
    }
    assert_eq!(hello[0], 22);
    let len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
    assert_eq!(hello.len(), 5 + len, "one record");
    hello.extend_from_slice(&[20, 0, 0, 0]);
    hello[3..5].copy_from_slice(&((len + 4) as u16).to_be_bytes());
    let mut s = Session::new(l13).unwrap();
    let e = s.read(&mut hello, &mut |_| {}).unwrap_err();
    assert!(matches!(e, Failure::Alert(_)), "{e:?}");
    assert!(!s.pending().is_empty(), "an alert for the client");
}

#[test]
fn the_server_picks_aes_128_gcm_over_a_client_that_prefers_aes_256() {
    let p = testkeys::ecdsa(&["site.example"]);
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| u8::from(s.suite() != rustls::CipherSuite::TLS13_AES_256_GCM_SHA384));
    let mut roots = RootCertStore::empty();
    for c in crate::certs::read_chain(&p.cert).unwrap() {
        roots.add(c).unwrap();
    }
    let cfg = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server = server::config(&listener(
        &[&p],
        UnknownSni::Default,
        MinVersion::Tls12,
        true,
    ))
    .unwrap();
    let (mut c, mut s) = connect(&Arc::new(cfg), "site.example", &server);
    c.writer().write_all(b"x").unwrap();
    pump(&mut c, &mut s, &mut Vec::new()).unwrap();
    assert_eq!(s.info().cipher, "TLS13_AES_128_GCM_SHA256");
}

/// `write_over` encrypts over a scratch buffer's old bytes (a pooled send
/// buffer's last contents) and leaves it holding exactly the records, with
/// what was already queued first: the client reads every byte back in
/// order, whether the scratch is longer than the records (its tail of old
/// bytes is cut), shorter (it grows), or empty, and for 1 to 3 records.
#[test]
fn write_over_a_scratch_buffer_sends_exactly_the_records_whatever_it_held() {
    let (p, server) = site(false);
    let cfg = Arc::new(client(&[&p], &[&rustls::version::TLS13], &[b"http/1.1"]));
    let (mut c, mut s) = connect(&cfg, "site.example", &server);
    c.writer().write_all(b"hi").unwrap();
    pump(&mut c, &mut s, &mut Vec::new()).unwrap();
    assert!(s.is_established());
    let mut scratch = vec![0xa5u8; 70_000];
    let mut expect = Vec::new();
    let mut back = Vec::new();
    for (i, (len, held)) in [
        (16_384usize, 70_000usize),
        (100, 20_000),
        (40_000, 300),
        (1, 0),
        (16_385, 16_500),
    ]
    .into_iter()
    .enumerate()
    {
        scratch.resize(held, 0x5a);
        // Something queued before (a small write not taken yet) goes first.
        let small = [b'0' + i as u8; 7];
        s.write(&small).unwrap();
        let body: Vec<u8> = (0..len).map(|k| (k % 251) as u8 ^ i as u8).collect();
        s.write_over(&body, &mut scratch).unwrap();
        assert!(
            s.pending().is_empty(),
            "the queued bytes moved into the scratch"
        );
        let records = len.div_ceil(crate::session::MAX_PLAINTEXT) + 1;
        assert!(
            scratch.len() <= 7 + len + records * crate::session::RECORD_OVERHEAD,
            "{len} bytes in {records} records: {} bytes to send (old bytes left in)",
            scratch.len()
        );
        expect.extend_from_slice(&small);
        expect.extend_from_slice(&body);
        let mut r = &scratch[..];
        while !r.is_empty() {
            c.read_tls(&mut r).unwrap();
            c.process_new_packets().expect("records the client accepts");
            let mut buf = [0u8; 8192];
            while let Ok(n) = c.reader().read(&mut buf) {
                if n == 0 {
                    break;
                }
                back.extend_from_slice(&buf[..n]);
            }
        }
        assert_eq!(back.len(), expect.len(), "round {i}");
        assert!(back == expect, "round {i}: bytes differ");
    }
}
