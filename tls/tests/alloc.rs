//! Heap allocations of an established server [`Session`] per keep-alive exchange (a request record read, a head written, a 16 KiB body encrypted into the caller's reused buffer), counted by a wrapping allocator around the server's calls only, against rustls' client in memory: rustls' one per record, none of zgix's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use zgix_tls::server::{self, Listener, MinVersion};
use zgix_tls::{CertStore, Session, Tickets, UnknownSni};

struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters are const-initialised thread-local cells, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.with(|o| o.get()) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON.with(|o| o.get()) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Runs `f` with its allocations counted.
fn counted<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = COUNT.with(|c| c.get());
    ON.with(|o| o.set(true));
    let r = f();
    ON.with(|o| o.set(false));
    (r, COUNT.with(|c| c.get()) - before)
}

#[test]
fn an_established_session_allocates_nothing_per_keep_alive_exchange() {
    let dir = std::env::temp_dir().join(format!("zgix-tls-alloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["alloc.example".to_string()])
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
    let cc = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut client =
        rustls::ClientConnection::new(Arc::new(cc), "alloc.example".try_into().unwrap()).unwrap();
    let mut s = Session::new(sc).unwrap();
    let mut to_s = Vec::new();
    let mut got = Vec::new();
    let mut body = Vec::new();
    let mut exchange = |s: &mut Session, client: &mut rustls::ClientConnection, count: bool| {
        use std::io::Write;
        if s.is_established() {
            client
                .writer()
                .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                .unwrap();
        }
        while client.wants_write() {
            client.write_tls(&mut to_s).unwrap();
        }
        let mut server_side = |s: &mut Session| {
            got.clear();
            let p = s
                .read(&mut to_s, &mut |d| got.extend_from_slice(d))
                .unwrap();
            to_s.drain(..p.consumed);
            if s.is_established() && !got.is_empty() {
                s.write(&[b'h'; 150]).unwrap();
                // A body: into a buffer of the caller's, reused.
                body.clear();
                s.write_into(&[b'b'; 16384], &mut body).unwrap();
            }
            s.take_output()
        };
        let (out, n) = if count {
            counted(|| server_side(s))
        } else {
            (server_side(s), 0)
        };
        let mut wire = out.clone();
        wire.extend_from_slice(&body);
        let (_, m) = counted(|| s.give_back(out));
        let mut r = &wire[..];
        while !r.is_empty() {
            client.read_tls(&mut r).unwrap();
            client.process_new_packets().unwrap();
            let mut sink = [0u8; 4096];
            while let Ok(k) = std::io::Read::read(&mut client.reader(), &mut sink) {
                if k == 0 {
                    break;
                }
            }
        }
        n + m
    };
    while !s.is_established() {
        exchange(&mut s, &mut client, false);
    }
    for _ in 0..10 {
        exchange(&mut s, &mut client, false);
    }
    let n: u64 = (0..100).map(|_| exchange(&mut s, &mut client, true)).sum();
    // rustls 0.23's unbuffered API allocates once per record either way:
    // a record read is decrypted in place and then copied into a Vec of
    // its own (`take_received_plaintext`), a record written is encrypted
    // into a Vec and copied out (`write_plaintext`). Here that is one
    // record in and two out; zgix's session adds none.
    assert!(n <= 3 * 100, "{n} allocations over 100 exchanges");
}
