//! Chunked bodies on the bulk path (issue 21) end to end: the data of big chunks spliced both ways and re-encoded, small chunks on the copy path byte for byte, an HTTP/1.0 client de-chunked, malformed framing after a spliced chunk refused, a client that closes mid-chunk, and a slow reader whose bytes in flight stay bounded.

mod bodies_support;
mod support;

use std::io::Read;
use std::sync::atomic::Ordering;

use bodies_support::*;
use support::{metrics_text, pattern, series, Client, Zgix};

/// Small chunks: under the bulk path's threshold for chunks (256 KiB).
const SMALL_CHUNK: u64 = 16_000;

#[test]
fn chunked_bodies_of_small_chunks_go_the_copy_path_byte_exact_both_ways() {
    let (_origin, zgix) = proxy();
    let n = 64 * MIB;
    let mut client = Client::connect(zgix.addr());
    let r = client.get(&format!("/chunked/{n}/{SMALL_CHUNK}"));
    assert_eq!(r.status, 200, "{}", r.head_text());
    assert_eq!(r.body.len() as u64, n);
    assert_eq!(fnv(FNV0, &r.body), pattern_fnv(n));
    drop(r);
    // A chunked upload, re-encoded by zgix on its way.
    client.send(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    let block = pattern(1 << 20);
    let piece = SMALL_CHUNK as usize;
    let mut at = 0u64;
    while at < n {
        let piece = &block[..piece.min((n - at) as usize)];
        if at < 100 * SMALL_CHUNK {
            client.send(format!("{:x};ext=1\r\n", piece.len()).as_bytes());
        } else {
            client.send(format!("{:x}\r\n", piece.len()).as_bytes());
        }
        client.send(piece);
        client.send(b"\r\n");
        at += piece.len() as u64;
    }
    client.send(b"0\r\n\r\n");
    // The pattern restarts with every piece.
    let h = repeated_fnv(&block[..piece], n);
    let r = client.read_response();
    assert_eq!(String::from_utf8_lossy(&r.body), format!("{n} {h:016x}"));
    // Then a Content-Length body of 1 MiB: the bulk counter moves by that
    // one alone, so the 128 MiB above went the copy path.
    client.send(b"GET /cl/1048576 HTTP/1.1\r\nHost: t\r\n\r\n");
    let head = client.read_response_head();
    assert_eq!(head.status, 200);
    read_pattern_body(&mut client, MIB, usize::MAX, |_| {});
    let v = wait_bulk_bytes(&zgix, MIB - COPY_SLACK);
    assert!(
        v <= MIB,
        "bulk bytes {v}: a chunked body of small chunks took the bulk path"
    );
}

/// Bulk-path bytes (spliced plus relayed) the shard moved during `f`.
fn bulk_during(zgix: &Zgix, f: impl FnOnce()) -> (u64, u64) {
    let (r0, s0) = relayed_and_spliced(zgix);
    f();
    let (r1, s1) = relayed_and_spliced(zgix);
    (r1 - r0, s1 - s0)
}

/// Reads a `/chunked/{n}/{k}` response on `c` and checks its body byte for
/// byte as framed on the wire (size lines, extensions, trailer).
#[track_caller]
fn check_chunked_raw(c: &mut Client, n: u64, k: u64) {
    let head = c.read_response_head();
    assert_eq!(head.status, 200, "{}", head.show());
    assert_eq!(head.field("transfer-encoding"), Some("chunked"));
    let want = chunked_bytes(n, k);
    let mut got = vec![0u8; want.len()];
    c.read_exact(&mut got);
    if got != want {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        panic!(
            "body differs at byte {at} of {}: got {:?}, want {:?}",
            want.len(),
            String::from_utf8_lossy(&got[at..(at + 40).min(got.len())]),
            String::from_utf8_lossy(&want[at..(at + 40).min(want.len())])
        );
    }
}

#[test]
fn a_chunked_8_mib_response_of_big_chunks_is_spliced_and_arrives_byte_exact_with_its_framing() {
    let (_origin, zgix) = proxy_one_shard();
    let (n, k) = (8 * MIB, MIB);
    let mut client = Client::connect(zgix.addr());
    // The first response comes on a fresh upstream connection (on the
    // ring its first chunk is partly relayed from received buffers).
    let (relayed, spliced) = bulk_during(&zgix, || {
        client.send(format!("GET /chunked/{n}/{k} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        check_chunked_raw(&mut client, n, k);
    });
    assert_on_the_bulk_path(relayed, spliced, n);
    // Again on the pooled connection: each chunk's data is spliced past
    // the buffer its size line came in.
    let (relayed, spliced) = bulk_during(&zgix, || {
        client.send(format!("GET /chunked/{n}/{k} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        check_chunked_raw(&mut client, n, k);
    });
    assert!(
        spliced >= n - COPY_SLACK,
        "{spliced} bytes of {n} spliced, {relayed} relayed"
    );
    // Chunks that do not fall on read boundaries (CHUNK is odd-sized), and
    // the connection stays in sync.
    let n = 4 * MIB + 333;
    client.send(format!("GET /chunked/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    check_chunked_raw(&mut client, n, CHUNK);
    assert_in_sync(&mut client);
}

#[test]
fn a_response_of_many_small_chunks_is_exact_and_stays_on_the_copy_path() {
    let (_origin, zgix) = proxy_one_shard();
    let mut client = Client::connect(zgix.addr());
    let (relayed, spliced) = bulk_during(&zgix, || {
        // Up to 256 KiB a chunk, all of them under the bulk path's threshold.
        for (n, k) in [
            (4 * MIB, 1_000),
            (2 * MIB + 1, 7),
            (MIB, SMALL_CHUNK),
            (2 * MIB + 5, 200_000),
            (MIB, (256 << 10) - 1),
        ] {
            client.send(format!("GET /chunked/{n}/{k} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
            check_chunked_raw(&mut client, n, k);
        }
    });
    assert_eq!((relayed, spliced), (0, 0), "small chunks on the bulk path");
}

#[test]
fn an_http_1_0_client_gets_big_chunks_de_chunked_on_the_copy_path() {
    let (_origin, zgix) = proxy_one_shard();
    let n = 4 * MIB + 17;
    let (relayed, spliced) = bulk_during(&zgix, || {
        let mut client = Client::connect(zgix.addr());
        client.send(format!("GET /chunked/{n}/{MIB} HTTP/1.0\r\nHost: t\r\n\r\n").as_bytes());
        let head = client.read_response_head();
        assert_eq!(head.status, 200, "{}", head.show());
        assert_eq!(head.field("transfer-encoding"), None);
        assert_eq!(
            read_pattern_body(&mut client, n, usize::MAX, |_| {}),
            pattern_fnv(n)
        );
        // Delimited by close, nothing after the data.
        client.expect_closed();
    });
    assert_eq!(
        (relayed, spliced),
        (0, 0),
        "de-chunked data on the bulk path"
    );
}

/// Sends a chunked upload of `n` pattern bytes in chunks of `k`, each
/// size line with an extension and written in two pieces, then a trailer;
/// `tail` goes in the same write as the last chunk.
fn send_chunked_upload(client: &mut Client, n: u64, k: u64, tail: &[u8]) -> u64 {
    client.send(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    let block = pattern(26 * 40_960);
    let mut at = 0u64;
    while at < n {
        let len = (n - at).min(k);
        let line = if at < 16 * k {
            format!("{len:x};e=\"{at}\"\r\n")
        } else {
            format!("{len:x}\r\n")
        };
        let (a, b) = line.split_at(line.len() / 2);
        client.send(a.as_bytes());
        client.send(b.as_bytes());
        let from = (at % 26) as usize;
        client.send(&block[from..from + len as usize]);
        client.send(b"\r\n");
        at += len;
    }
    let mut last = b"0\r\nX-Sum: 1\r\n\r\n".to_vec();
    last.extend_from_slice(tail);
    client.send(&last);
    pattern_fnv(n)
}

#[test]
fn an_upload_of_big_chunks_is_spliced_and_reaches_the_origin_re_encoded() {
    let (origin, zgix) = proxy_one_shard();
    let (n, k) = (8 * MIB + 5, MIB);
    let mut client = Client::connect(zgix.addr());
    let mut h = 0;
    let (relayed, spliced) = bulk_during(&zgix, || {
        h = send_chunked_upload(&mut client, n, k, b"GET /cl/3 HTTP/1.1\r\nHost: t\r\n\r\n");
        let r = client.read_response();
        assert_eq!(r.status, 200, "{}", r.show());
        assert_eq!(String::from_utf8_lossy(&r.body), format!("{n} {h:016x}"));
    });
    // The origin saw a clean body: no extension, no trailer (else it
    // reports the upload broken).
    assert_eq!(origin.next_upload(), Ok(n));
    assert_on_the_bulk_path(relayed, spliced, n);
    // The request after the body is answered in sync.
    let next = client.read_response();
    assert_eq!(next.status, 200);
    assert_eq!(next.body, b"abc");
    // Chunks that do not fall on read boundaries, on the kept connection.
    let n = 3 * MIB + 1;
    let h = send_chunked_upload(&mut client, n, CHUNK, b"");
    let r = client.read_response();
    assert_eq!(String::from_utf8_lossy(&r.body), format!("{n} {h:016x}"));
    assert_eq!(origin.next_upload(), Ok(n));
}

#[test]
fn a_malformed_chunk_after_a_big_spliced_chunk_is_refused_as_before() {
    let (origin, zgix) = proxy_one_shard();
    // A response: the chunk's data went on, its bad CRLF does not; the
    // client connection closes without a last chunk.
    let k = 2 * MIB;
    let (relayed, spliced) = bulk_during(&zgix, || {
        let mut client = Client::connect(zgix.addr());
        client.send(format!("GET /badchunk/{k} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        let head = client.read_response_head();
        assert_eq!(head.status, 200);
        let mut rest = Vec::new();
        match client.body_reader().read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("no close after {} bytes: {e}", rest.len()),
        }
        let mut want = format!("{k:x}\r\n").into_bytes();
        want.extend_from_slice(&pattern(k));
        assert!(
            rest.len() <= want.len() && rest[..] == want[..rest.len()],
            "{} bytes after the head, not a prefix of the valid framing: {:?}",
            rest.len(),
            String::from_utf8_lossy(&rest[rest.len().saturating_sub(40)..])
        );
    });
    assert_on_the_bulk_path(relayed, spliced, k);
    // An upload: a bad CRLF after a big chunk's data is answered 400, and
    // the origin never gets a complete request.
    let mut client = Client::connect(zgix.addr());
    let (relayed, spliced) = bulk_during(&zgix, || {
        client.send(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
        client.send(format!("{k:x}\r\n").as_bytes());
        client.send(&pattern(k));
        let _ = client.try_send(b"XX0\r\n\r\n");
        let r = client.read_response();
        assert_eq!(r.status, 400, "{}", r.show());
        client.expect_closed();
        assert!(
            origin.next_upload().is_err(),
            "the origin got the body whole"
        );
    });
    assert_on_the_bulk_path(relayed, spliced, k);
    assert_still_serves(&zgix);
}

#[test]
fn a_client_that_closes_mid_chunk_leaves_the_origin_an_incomplete_request() {
    let (origin, zgix) = proxy_one_shard();
    let (k, sent) = (8 * MIB, 2 * MIB);
    let mut client = Client::connect(zgix.addr());
    client.send(b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    client.send(format!("{k:x}\r\n").as_bytes());
    client.send(&pattern(sent));
    client
        .stream()
        .shutdown(std::net::Shutdown::Both)
        .expect("shutdown");
    let broken = origin.next_upload();
    assert!(broken.is_err(), "the origin got a whole body: {broken:?}");
    // What came was on the bulk path, and zgix still serves.
    let (relayed, spliced) = relayed_and_spliced(&zgix);
    assert_on_the_bulk_path(relayed, spliced, sent);
    assert_still_serves(&zgix);
}

#[test]
fn a_slow_reader_keeps_the_bytes_in_flight_bounded() {
    let (origin, zgix) = proxy();
    let n = 192 * MIB;
    let mut client = Client::connect(zgix.addr());
    client.send(format!("GET /cl/{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    let head = client.read_response_head();
    assert_eq!(head.status, 200);
    // Reading 4 KiB at a time and checking every byte, the client is the
    // slowest of the three: what the origin wrote and the client has not
    // read sits in kernel socket buffers (loopback autotuning allows up to
    // tcp_rmem's 32 MiB on zgix's upstream socket) and in zgix. Unbounded
    // buffering in zgix would let it approach the whole body.
    let mut worst = 0u64;
    let sent = origin.sent.clone();
    read_pattern_body(&mut client, n, 4096, |got| {
        worst = worst.max(sent.load(Ordering::Acquire).saturating_sub(got));
    });
    assert!(worst < 64 * MIB, "{worst} bytes in flight");
    let hwm = zgix.vm_hwm_kib();
    assert!(hwm < 64 * 1024, "zgix VmHWM {hwm} KiB");
    let m = metrics_text(&zgix);
    assert!(series(&m, "zgix_io_buffers_held") <= 256.0);
}
