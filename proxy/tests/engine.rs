//! The connection engine end to end: both directions at once (early answers, a streamed echo), Expect and 1xx relayed from the origin, Upgrade tunnels, and the connection cap. Each origin here is a small scripted std server.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use support::{Client, Config, Zgix};

/// An origin that runs `script` on each accepted connection, in its own thread.
fn scripted(script: fn(TcpStream)) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind origin");
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming().flatten() {
            s.set_read_timeout(Some(Duration::from_secs(20))).ok();
            thread::spawn(move || script(s));
        }
    });
    addr
}

/// Reads a request head (through the blank line).
fn read_head(r: &mut BufReader<TcpStream>) -> String {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return head;
        }
        head.push_str(&line);
        if line == "\r\n" {
            return head;
        }
    }
}

fn start(origin: SocketAddr, f: impl FnOnce(Config) -> Config) -> Zgix {
    Zgix::start(&f(Config::new(&[origin])))
}

#[test]
fn an_early_413_reaches_the_client_while_it_is_still_uploading() {
    let origin = scripted(|s| {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let _ = read_head(&mut r);
        let mut w = s;
        let _ = w.write_all(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbig\n");
        let _ = w.shutdown(std::net::Shutdown::Write);
        // Read a little, then close with the rest unread (a reset).
        let mut b = [0u8; 4096];
        let _ = r.read(&mut b);
    });
    let zgix = start(origin, |c| c);
    let mut client = Client::connect(zgix.addr());
    let len = 10 << 20;
    client
        .send(format!("POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {len}\r\n\r\n").as_bytes());
    let mut writer = client.writer();
    let up = thread::spawn(move || {
        let chunk = vec![b'x'; 64 << 10];
        let mut sent = 0;
        while sent < len {
            if writer.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len();
        }
    });
    let resp = client.read_response();
    assert_eq!(resp.status, 413, "{}", resp.show());
    support::assert_bytes(&resp.body, b"big\n");
    drop(client);
    let _ = up.join();
    // zgix still serves: a new connection gets the origin's answer again.
    let mut again = Client::connect(zgix.addr());
    assert_eq!(
        again
            .request(b"POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc")
            .status,
        413
    );
}

#[test]
fn a_401_sent_before_the_body_is_read_is_answered_at_once() {
    let origin = scripted(|s| {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let _ = read_head(&mut r);
        let mut w = s;
        let _ = w.write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n");
        // Keep the socket open, never reading the body.
        thread::sleep(Duration::from_secs(15));
    });
    let zgix = start(origin, |c| c);
    let mut client = Client::connect(zgix.addr());
    client.send(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\nabc");
    let resp = client.read_response();
    assert_eq!(resp.status, 401, "{}", resp.show());
    // The body was not read, so zgix closes the client connection after the answer.
    let h = resp.head_text();
    assert!(h.to_ascii_lowercase().contains("connection: close"), "{h}");
}

#[test]
fn an_origin_that_echoes_while_reading_streams_20_mib_through() {
    let origin = scripted(|s| {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let head = read_head(&mut r);
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap();
        let mut w = s;
        w.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n").as_bytes())
            .unwrap();
        let mut buf = vec![0u8; 32 << 10];
        let mut left = len;
        while left > 0 {
            let n = r.read(&mut buf[..left.min(32 << 10)]).unwrap();
            assert!(n > 0);
            w.write_all(&buf[..n]).unwrap();
            left -= n;
        }
    });
    let zgix = start(origin, |c| c);
    let len = 20 << 20;
    let mut s = support::connect(zgix.addr());
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(
        format!("PUT /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {len}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut w = s.try_clone().unwrap();
    let up = thread::spawn(move || {
        let chunk: Vec<u8> = (0..(64 << 10)).map(|i| (i % 251) as u8).collect();
        for _ in 0..len / chunk.len() {
            w.write_all(&chunk).unwrap();
        }
    });
    let mut r = BufReader::new(s);
    let head = read_head(&mut r);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    while got < len {
        let n = r.read(&mut buf).unwrap();
        assert!(n > 0, "echo ended after {got} of {len} bytes");
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(b, ((got + k) % (64 << 10) % 251) as u8, "byte {}", got + k);
        }
        got += n;
    }
    up.join().unwrap();
}

#[test]
fn expect_100_continue_is_the_origins_to_answer_and_its_100_is_relayed_stripped() {
    let origin = scripted(|s| {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let head = read_head(&mut r);
        let mut w = s;
        assert!(head.contains("Expect: 100-continue\r\n"), "{head}");
        w.write_all(b"HTTP/1.1 100 Continue\r\nKeep-Alive: timeout=5\r\nX-Interim: yes\r\n\r\n")
            .unwrap();
        let mut body = [0u8; 5];
        r.read_exact(&mut body).unwrap();
        w.write_all(b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\n")
            .unwrap();
        w.write_all(&body).unwrap();
    });
    let zgix = start(origin, |c| c);
    let mut client = Client::connect(zgix.addr());
    client.send(b"PUT /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    let interim = client.read_response();
    support::assert_bytes(
        &interim.raw,
        b"HTTP/1.1 100 Continue\r\nX-Interim: yes\r\n\r\n",
    );
    client.send(b"hello");
    let resp = client.read_response();
    assert_eq!(resp.status, 201, "{}", resp.show());
    support::assert_bytes(&resp.body, b"hello");
}

#[test]
fn an_origin_refusing_the_expectation_is_answered_without_a_body_upload() {
    let origin = scripted(|s| {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let _ = read_head(&mut r);
        let mut w = s;
        w.write_all(b"HTTP/1.1 417 Expectation Failed\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
        thread::sleep(Duration::from_secs(5));
    });
    let zgix = start(origin, |c| c);
    let mut client = Client::connect(zgix.addr());
    client.send(b"PUT /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    let resp = client.read_response();
    assert_eq!(resp.status, 417, "{}", resp.show());
}

#[test]
fn an_upgrade_answered_101_becomes_a_two_way_tunnel() {
    let origin = scripted(|s| {
        let mut r = BufReader::new(s.try_clone().unwrap());
        let head = read_head(&mut r);
        let mut w = s;
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("connection: upgrade\r\n"), "{head}");
        assert!(lower.contains("upgrade: websocket\r\n"), "{head}");
        w.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: abc\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 1024];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => w.write_all(&buf[..n]).unwrap(),
            }
        }
    });
    let zgix = start(origin, |c| c);
    let mut client = Client::connect(zgix.addr());
    client.send(b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n");
    let head = client.read_response_head();
    assert_eq!(head.status, 101, "{}", head.show());
    let h = head.head_text().to_ascii_lowercase();
    assert!(
        h.contains("upgrade: websocket\r\n") && h.contains("connection: upgrade\r\n"),
        "{h}"
    );
    assert!(h.contains("sec-websocket-accept: abc\r\n"), "{h}");
    for msg in [&b"ping"[..], b"frames both ways", b"\x00\x01binary"] {
        client.send(msg);
        let mut got = vec![0u8; msg.len()];
        client.read_exact(&mut got);
        assert_eq!(got, msg);
    }
}

#[test]
fn at_the_connection_cap_a_shard_stops_accepting_until_a_connection_closes() {
    let origin = Origin::start();
    let zgix = Zgix::start(
        &Config::new(&[origin.addr()])
            .cpus(&[0])
            .admin()
            .limit("max_connections", 2),
    );
    let mut a = Client::connect(zgix.addr());
    assert_eq!(a.get("/").status, 200);
    let mut b = Client::connect(zgix.addr());
    assert_eq!(b.get("/").status, 200);
    // The kernel completes the handshake (backlog); zgix does not take it.
    let mut c = Client::connect(zgix.addr());
    c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    let pauses = support::metric(&zgix, "zgix_accept_pauses_total");
    assert!(pauses >= 1.0, "accept pauses: {pauses}");
    drop(a);
    let resp = c.read_response();
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_eq!(b.get("/").status, 200);
}

use support::Origin;
