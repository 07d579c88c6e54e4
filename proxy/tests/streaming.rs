//! End-to-end streaming: 1 GiB up and down through zgix with flat memory (VmHWM), plus a large chunked upload.

mod support;

use std::io::BufRead;

use support::{assert_bytes, pattern, pattern_byte, Client, Config, Origin, Zgix};

const GIB: u64 = 1 << 30;
/// zgix's peak RSS must stay under this while moving a gigabyte: buffers are
/// per connection (`buffer_bytes`), never per body.
const MAX_HWM_KIB: u64 = 64 * 1024;

fn proxy() -> (Origin, Zgix) {
    let origin = Origin::start();
    let zgix = Zgix::start(&Config::new(&[origin.addr()]));
    (origin, zgix)
}

#[track_caller]
fn assert_flat_memory(zgix: &Zgix, what: &str) {
    let hwm = zgix.vm_hwm_kib();
    assert!(
        hwm < MAX_HWM_KIB,
        "{what}: zgix VmHWM {hwm} KiB, limit {MAX_HWM_KIB} KiB"
    );
}

#[test]
fn one_gib_content_length_upload_with_flat_memory() {
    let (origin, zgix) = proxy();
    let mut client = Client::connect(zgix.addr());
    client.send(
        format!("POST /sink HTTP/1.1\r\nHost: t\r\nContent-Length: {GIB}\r\n\r\n").as_bytes(),
    );
    let block = pattern(256 * 1024);
    let mut left = GIB;
    while left > 0 {
        let take = block.len().min(left as usize);
        if let Err(e) = client.try_send(&block[..take]) {
            panic!(
                "upload failed after {} bytes: {e}; received: \"{}\"",
                GIB - left,
                client.transcript()
            );
        }
        left -= take as u64;
    }
    let resp = client.read_response();
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_bytes(&resp.body, GIB.to_string().as_bytes());
    assert_eq!(origin.only_request().body_len, GIB);
    assert_flat_memory(&zgix, "1 GiB upload");
    // The connection is still in sync after the body.
    assert_eq!(client.get("/").status, 200);
}

#[test]
fn one_gib_download_with_flat_memory() {
    let (_origin, zgix) = proxy();
    let mut client = Client::connect(zgix.addr());
    client.send(format!("GET /source/{GIB} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    let head = client.read_response_head();
    assert_eq!(head.status, 200, "{}", head.show());
    assert_eq!(head.field("content-length"), Some(GIB.to_string().as_str()));
    let mut received = 0u64;
    let reader = client.body_reader();
    while received < GIB {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) => panic!("download failed after {received} bytes: {e}"),
        };
        assert!(!buf.is_empty(), "connection closed after {received} bytes");
        // Spot-check the first byte of every read: a shift or reorder shows up.
        assert_eq!(
            buf[0],
            pattern_byte(received),
            "wrong byte at offset {received}"
        );
        let take = buf.len().min((GIB - received) as usize);
        reader.consume(take);
        received += take as u64;
    }
    assert_flat_memory(&zgix, "1 GiB download");
    assert_eq!(client.get("/cl/3").body, b"abc");
}

#[test]
fn large_chunked_upload_is_streamed() {
    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 1024; // 64 MiB
    let (origin, zgix) = proxy();
    let mut client = Client::connect(zgix.addr());
    client.send(b"POST /sink HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    let mut chunk = format!("{CHUNK:x}\r\n").into_bytes();
    chunk.extend_from_slice(&pattern(CHUNK as u64));
    chunk.extend_from_slice(b"\r\n");
    for i in 0..CHUNKS {
        if let Err(e) = client.try_send(&chunk) {
            panic!(
                "upload failed at chunk {i}: {e}; received: \"{}\"",
                client.transcript()
            );
        }
    }
    client.send(b"0\r\n\r\n");
    let resp = client.read_response();
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_bytes(&resp.body, (CHUNK * CHUNKS).to_string().as_bytes());
    // Re-encoded on the way (chunk boundaries follow zgix's reads), so the
    // origin's framing is at least the data plus one last chunk.
    let got = origin.only_request();
    assert!(
        got.body_len >= (CHUNK * CHUNKS + 5) as u64,
        "{}",
        got.body_len
    );
    assert_flat_memory(&zgix, "64 MiB chunked upload");
}
