//! The bulk path (issue 21) end to end: 64 MiB down and up through zgix byte for byte on the bulk path (received buffers sent as they are on uring, splice on epoll), 1 MiB bodies on kept and pooled connections spliced past the buffers their heads came in, a 16 MiB echo through a tunnel, downloads past a shard's pipes relayed without one, and a TLS listener that falls back to copying; chunked bodies are in `bodies_chunked.rs`.

mod bodies_support;
mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;

use bodies_support::*;
use support::{metrics_text, pattern, series, Client, Config, Zgix};

#[test]
fn a_64_mib_download_on_the_bulk_path_is_byte_exact_and_the_connection_stays_in_sync() {
    let (_origin, zgix) = proxy();
    let n = 64 * MIB;
    let mut client = Client::connect(zgix.addr());
    client.send(format!("GET /cl/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    let head = client.read_response_head();
    assert_eq!(head.status, 200, "{}", head.show());
    assert_eq!(head.field("content-length"), Some(n.to_string().as_str()));
    assert_eq!(
        read_pattern_body(&mut client, n, usize::MAX, |_| {}),
        pattern_fnv(n)
    );
    wait_bulk_bytes(&zgix, n - COPY_SLACK);
    // The next request on the same connection is answered in sync.
    assert_in_sync(&mut client);
}

#[test]
fn a_64_mib_upload_on_the_bulk_path_is_byte_exact_and_a_pipelined_request_follows() {
    let (_origin, zgix) = proxy();
    let n = 64 * MIB;
    let mut client = Client::connect(zgix.addr());
    client.send(format!("POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {n}\r\n\r\n").as_bytes());
    let block = pattern(1 << 20);
    for _ in 0..n / MIB - 1 {
        client.send(&block);
    }
    // The last megabyte and the next request in one write: the bytes past
    // the body must not be relayed with it.
    let mut tail = block.clone();
    tail.extend_from_slice(b"GET /cl/3 HTTP/1.1\r\nHost: t\r\n\r\n");
    client.send(&tail);
    let r = client.read_response();
    assert_eq!(r.status, 200, "{}", r.show());
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!("{n} {:016x}", repeated_fnv(&block, n))
    );
    let next = client.read_response();
    assert_eq!(next.status, 200);
    assert_eq!(next.body, b"abc");
    wait_bulk_bytes(&zgix, n - COPY_SLACK);
}

#[test]
fn one_mib_downloads_on_a_pooled_connection_splice_past_the_buffer_their_head_came_in() {
    // On the ring a socket whose last body took the bulk path receives its
    // next head one buffer at a time, so the rest of the body stays in the
    // socket for the splices; before that, a multishot receive had pulled
    // most of each body into provided buffers before the head was parsed.
    let (_origin, zgix) = proxy_one_shard();
    let (n, k) = (MIB, 8u64);
    let mut client = Client::connect(zgix.addr());
    // The first body comes on a fresh upstream connection (multishot).
    client.send(format!("GET /cl/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    check_cl(&mut client, n);
    let (r0, s0) = relayed_and_spliced(&zgix);
    for _ in 0..k {
        client.send(format!("GET /cl/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        check_cl(&mut client, n);
    }
    let (r1, s1) = relayed_and_spliced(&zgix);
    let (relayed, spliced) = (r1 - r0, s1 - s0);
    assert!(
        relayed <= k * RELAY_SLACK,
        "{relayed} bytes of {k} bodies of {n} relayed from received buffers ({spliced} spliced)"
    );
    assert!(
        spliced >= k * (n - COPY_SLACK),
        "{spliced} bytes of {k} bodies of {n} spliced ({relayed} relayed)"
    );
}

#[test]
fn one_mib_uploads_on_a_kept_connection_splice_past_the_buffers_their_head_came_in() {
    // The client's socket: after one upload on the bulk path, the next
    // request's head is received one buffer at a time (see above).
    let (_origin, zgix) = proxy_one_shard();
    let (n, k) = (MIB, 8u64);
    let block = pattern(n);
    let want = format!("{n} {:016x}", repeated_fnv(&block, n));
    let mut client = Client::connect(zgix.addr());
    let upload = |client: &mut Client| {
        let mut req =
            format!("POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {n}\r\n\r\n").into_bytes();
        req.extend_from_slice(&block);
        client.send(&req);
        let r = client.read_response();
        assert_eq!(r.status, 200, "{}", r.show());
        assert_eq!(String::from_utf8_lossy(&r.body), want);
    };
    upload(&mut client);
    let (r0, s0) = relayed_and_spliced(&zgix);
    for _ in 0..k {
        upload(&mut client);
    }
    let (r1, s1) = relayed_and_spliced(&zgix);
    let (relayed, spliced) = (r1 - r0, s1 - s0);
    assert!(
        relayed <= k * RELAY_SLACK,
        "{relayed} bytes of {k} uploads of {n} relayed from received buffers ({spliced} spliced)"
    );
    assert!(
        spliced >= k * (n - COPY_SLACK),
        "{spliced} bytes of {k} uploads of {n} spliced ({relayed} relayed)"
    );
}

/// An origin that answers a request with `101` and then echoes every byte.
fn echo_upgrade_origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut r = BufReader::new(c.try_clone()?);
                loop {
                    let mut line = Vec::new();
                    if r.read_until(b'\n', &mut line)? == 0 || line == b"\r\n" {
                        break;
                    }
                }
                let mut w = c;
                w.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")?;
                std::io::copy(&mut r, &mut w)?;
                w.shutdown(std::net::Shutdown::Write)
            });
        }
    });
    addr
}

#[test]
fn a_16_mib_tunnel_goes_the_bulk_path_both_ways_byte_exact() {
    let zgix = Zgix::start(&Config::new(&[echo_upgrade_origin()]).admin());
    let mut client = Client::connect(zgix.addr());
    client.send(b"GET /t HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n");
    assert_eq!(client.read_response_head().status, 101);
    let n = 16 * MIB;
    let mut w = client.writer();
    let writer = std::thread::spawn(move || w.write_all(&pattern(n)).expect("tunnel write"));
    assert_eq!(
        read_pattern_body(&mut client, n, usize::MAX, |_| {}),
        pattern_fnv(n)
    );
    writer.join().expect("writer");
    // Both directions on the bulk path (spliced on epoll; on the ring the
    // received buffers sent on as they are).
    wait_bulk_bytes(&zgix, 2 * (n - COPY_SLACK));
}

/// Splice pipes one shard may have out (`io::PIPES_MAX`).
const PIPES_MAX: usize = 256;

/// Sends `GET /cl/{n}` on a new connection to zgix.
fn get_cl(zgix: &Zgix, n: u64) -> Client {
    let mut c = Client::connect(zgix.addr());
    c.send(format!("GET /cl/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    c
}

/// Reads a whole `/cl/{n}` response on `c` and checks it byte for byte.
#[track_caller]
fn check_cl(c: &mut Client, n: u64) {
    let head = c.read_response_head();
    assert_eq!(head.status, 200);
    assert_eq!(head.field("content-length"), Some(n.to_string().as_str()));
    assert_eq!(read_pattern_body(c, n, usize::MAX, |_| {}), pattern_fnv(n));
}

#[test]
fn downloads_past_the_shards_pipes_relay_without_one_byte_exact_and_the_pipes_come_back() {
    let origin = BodyOrigin::start();
    let zgix = Zgix::start(&Config::new(&[origin.addr]).cpus(&[0]).admin());
    // Uploads whose bodies never come hold every pipe of the shard: each
    // relay waits in its first splice from the client.
    let holders: Vec<Client> = (0..PIPES_MAX)
        .map(|_| {
            let mut c = Client::connect(zgix.addr());
            c.send(
                format!(
                    "POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
                    256 * MIB
                )
                .as_bytes(),
            );
            c
        })
        .collect();
    wait_series(&zgix, "zgix_io_pipes_out", |v| v >= PIPES_MAX as f64);
    // Downloads past that relay without a pipe (uring: the received buffers
    // sent on as they are; epoll: through the exchange's buffer).
    let n = 4 * MIB + 12_345;
    let mut more: Vec<Client> = (0..3).map(|_| get_cl(&zgix, n)).collect();
    for c in &mut more {
        check_cl(c, n);
    }
    let m = metrics_text(&zgix);
    assert_eq!(series(&m, "zgix_io_pipes_out"), PIPES_MAX as f64);
    wait_series(&zgix, "zgix_io_splice_fallbacks_total", |v| v >= 3.0);
    // The connections stay in sync on the fallback path.
    for c in &mut more {
        c.send(b"GET /cl/70000 HTTP/1.1\r\nHost: t\r\n\r\n");
        check_cl(c, 70_000);
    }
    // The waiting relays end with their clients and give their pipes back:
    // the next download splices again.
    drop(holders);
    wait_series(&zgix, "zgix_io_pipes_out", |v| v == 0.0);
    // (Published in the same tick as the pipes: no ended relay moves bytes
    // after this.)
    let m = metrics_text(&zgix);
    let (bulk, fallbacks) = (bulk_in(&m), series(&m, "zgix_io_splice_fallbacks_total"));
    let mut c = get_cl(&zgix, n);
    check_cl(&mut c, n);
    let m = wait_for(&zgix, "bulk-path bytes", |m| {
        (bulk_in(m) >= bulk + n - COPY_SLACK).then(|| m.to_string())
    });
    assert_eq!(series(&m, "zgix_io_splice_fallbacks_total"), fallbacks);
}

/// A self-signed certificate for `localhost` in a scratch directory.
fn cert(tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("zgix-bodies-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let c = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cp, kp) = (dir.join("c.pem"), dir.join("c.key"));
    std::fs::write(&cp, c.pem()).unwrap();
    std::fs::write(&kp, key.serialize_pem()).unwrap();
    (dir, cp, kp)
}

/// The body curl reads from `https://localhost:PORT{path}` (zgix's TLS
/// listener, certificate `ca`); fails the test if curl does.
fn curl_tls(ca: &std::path::Path, port: u16, path: &str) -> Vec<u8> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "--cacert"])
        .arg(ca)
        .arg("--resolve")
        .arg(format!("localhost:{port}:127.0.0.1"))
        .arg(format!("https://localhost:{port}{path}"))
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn a_tls_listener_relays_large_bodies_by_copying() {
    let origin = BodyOrigin::start();
    let (dir, c, k) = cert("tls");
    let json = format!(
        r#"{{"admin": {{"bind": "127.0.0.1:0"}},
            "listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "c"}}}},
                          {{"bind": "127.0.0.1:0", "name": "tls", "http": {{"cluster": "c"}},
                            "tls": {{"certificates": [{{"cert": "{}", "key": "{}"}}]}}}}],
            "clusters": {{"c": {{"endpoints": ["{}"]}}}}}}"#,
        c.display(),
        k.display(),
        origin.addr
    );
    let zgix = Zgix::start_json(&json);
    let tls_port = zgix.listeners[1].port();
    let n = 16 * MIB;
    let body = curl_tls(&c, tls_port, &format!("/cl/{n}"));
    assert_eq!(body.len() as u64, n);
    assert_eq!(fnv(FNV0, &body), pattern_fnv(n));
    // Big chunks over TLS: copied too (curl takes the chunked framing off).
    let body = curl_tls(&c, tls_port, &format!("/chunked/{}/{MIB}", 4 * MIB));
    assert_eq!(body.len() as u64, 4 * MIB);
    assert_eq!(fnv(FNV0, &body), pattern_fnv(4 * MIB));
    // Then 1 MiB on the plaintext listener: the bulk counter moves by that
    // alone, so the 20 MiB over TLS were copied.
    let mut client = Client::connect(zgix.addr());
    client.send(b"GET /cl/1048576 HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(client.read_response_head().status, 200);
    read_pattern_body(&mut client, MIB, usize::MAX, |_| {});
    let v = wait_bulk_bytes(&zgix, MIB - COPY_SLACK);
    assert!(v <= MIB, "bulk bytes {v}: the TLS body took the bulk path");
    let _ = std::fs::remove_dir_all(dir);
}
