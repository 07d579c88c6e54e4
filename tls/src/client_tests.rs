//! The client side ([`ClientSession`]) against zgix's own server [`Session`], in memory: a verified handshake with data both ways, resumption on a second connection, and a wrong CA, a wrong name and `verify: false` classed as the upstream metrics count them.

use std::sync::Arc;

use crate::client::{self, ClientSession, Origin};
use crate::server::{self, Listener, MinVersion};
use crate::testkeys::{self, Pair};
use crate::{load, CertStore, Failure, Session, Tickets, UnknownSni};

fn server_config(pair: &Pair) -> Arc<rustls::ServerConfig> {
    let certs = vec![load(&pair.cert, &pair.key).unwrap()];
    server::config(&Listener {
        certs: Arc::new(CertStore::new(&certs, UnknownSni::Default).unwrap()),
        min_version: MinVersion::Tls12,
        alpn: vec![b"http/1.1".to_vec()],
        tickets: Some(Arc::new(Tickets::generate().unwrap())),
    })
    .unwrap()
}

/// Which side failed.
#[derive(Debug)]
enum Side {
    Client(Failure),
    #[allow(dead_code)] // read through Debug
    Server(Failure),
}

/// Moves records between the two until both are established and quiet;
/// `up` and `down` collect the plaintext each side received.
fn pump(
    c: &mut ClientSession,
    s: &mut Session,
    up: &mut Vec<u8>,
    down: &mut Vec<u8>,
) -> Result<(), Side> {
    let (mut to_s, mut to_c) = (Vec::new(), Vec::new());
    for _ in 0..64 {
        let p = c
            .read(&mut to_c, &mut |d| down.extend_from_slice(d))
            .map_err(Side::Client)?;
        to_c.drain(..p.consumed);
        to_s.extend_from_slice(&c.take_output());
        let p = s
            .read(&mut to_s, &mut |d| up.extend_from_slice(d))
            .map_err(Side::Server)?;
        to_s.drain(..p.consumed);
        to_c.extend_from_slice(&s.take_output());
        if to_c.is_empty() && to_s.is_empty() && c.is_established() && s.is_established() {
            return Ok(());
        }
    }
    panic!("no progress");
}

fn connect(
    origin: &Origin<'_>,
    pair: &Pair,
    name: &str,
) -> (
    Arc<rustls::ClientConfig>,
    Result<(ClientSession, Session), Side>,
) {
    let cc = client::config(origin).unwrap();
    let r = handshake(&cc, pair, name);
    (cc, r)
}

fn handshake(
    cc: &Arc<rustls::ClientConfig>,
    pair: &Pair,
    name: &str,
) -> Result<(ClientSession, Session), Side> {
    let mut c = ClientSession::new(cc.clone(), client::server_name(name).unwrap()).unwrap();
    let mut s = Session::new(server_config(pair)).unwrap();
    pump(&mut c, &mut s, &mut Vec::new(), &mut Vec::new())?;
    Ok((c, s))
}

#[test]
fn a_verified_session_carries_data_both_ways_and_resumes() {
    let pair = testkeys::ecdsa(&["origin.test"]);
    let origin = Origin {
        ca: Some(&pair.cert),
        verify: true,
    };
    let (cc, r) = connect(&origin, &pair, "origin.test");
    let (mut c, mut s) = r.unwrap();
    assert_eq!(c.info().version, "TLSv1.3");
    assert_eq!(c.info().alpn.as_deref(), Some(&b"http/1.1"[..]));
    c.write(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    s.write(&vec![7u8; 40_000]).unwrap();
    let (mut up, mut down) = (Vec::new(), Vec::new());
    pump(&mut c, &mut s, &mut up, &mut down).unwrap();
    assert_eq!(up, b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(down, vec![7u8; 40_000]);
    assert!(!c.info().resumed);
    // The same configuration's next connection resumes (the ticket arrived
    // with the data above). The server must know the ticket key: same
    // server configuration.
    let sc = server_config(&pair);
    let mut s1 = Session::new(sc.clone()).unwrap();
    let mut c1 =
        ClientSession::new(cc.clone(), client::server_name("origin.test").unwrap()).unwrap();
    pump(&mut c1, &mut s1, &mut Vec::new(), &mut Vec::new()).unwrap();
    let mut s2 = Session::new(sc).unwrap();
    let mut c2 = ClientSession::new(cc, client::server_name("origin.test").unwrap()).unwrap();
    pump(&mut c2, &mut s2, &mut Vec::new(), &mut Vec::new()).unwrap();
    assert!(c2.info().resumed, "the second connection resumed");
}

#[test]
fn a_wrong_ca_or_name_is_refused_by_reason_and_verify_false_takes_any() {
    let pair = testkeys::ecdsa(&["origin.test"]);
    let other = testkeys::ecdsa(&["origin.test"]);
    let trusting_other = Origin {
        ca: Some(&other.cert),
        verify: true,
    };
    // Both certificates carry rcgen's default subject, so the chain finds
    // the other one as its issuer and its signature fails: a bad
    // certificate (tests/tls_upstream.rs has a CA of another name, which is
    // `unknown_ca`).
    match connect(&trusting_other, &pair, "origin.test").1 {
        Err(Side::Client(Failure::Refused { reason, .. })) => {
            assert_eq!(reason, "bad_certificate")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let trusting = Origin {
        ca: Some(&pair.cert),
        verify: true,
    };
    match connect(&trusting, &pair, "elsewhere.test").1 {
        Err(Side::Client(Failure::Refused { reason, .. })) => assert_eq!(reason, "bad_name"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let any = Origin {
        ca: None,
        verify: false,
    };
    assert!(connect(&any, &pair, "elsewhere.test").1.is_ok());
}

#[test]
fn config_errors_name_the_file() {
    let missing = std::env::temp_dir().join("zgix-no-such-ca.pem");
    let e = client::config(&Origin {
        ca: Some(&missing),
        verify: true,
    })
    .unwrap_err();
    assert!(e.contains("zgix-no-such-ca.pem: cannot read"), "{e}");
    assert!(client::server_name("bad name").is_err());
    assert!(client::server_name("10.0.0.1").is_ok());
}
