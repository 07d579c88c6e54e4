//! Chunked uploads re-encoded as gather lists (issue 21, "chunked framing adds only the chunk lines"): many small chunks, extensions, a trailer and a chunk spanning receive buffers reach the origin byte-exact re-encoded, their data sent from the client's buffer by vectored sends (`zgix_io_gathered_*`), a pipelined request stays in sync, and a malformed chunk past one send's worth of pieces gets its 400 with nothing of its buffer forwarded. Runs on the driver `ZGIX_TEST_DRIVER` names.

mod support;

use std::io::Read;
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

use support::{metrics_after_tick, series, Client, Config, Origin, Zgix, IO_TIMEOUT};

/// Runs of chunk-data up to this long are copied into zgix's framing, not
/// sent from the client's buffer (`zgix_parser::COPY_MAX`).
const COPY_MAX: usize = 64;

/// A zgix of one shard (its tick then publishes everything it did before).
fn proxy(origin: std::net::SocketAddr) -> Zgix {
    Zgix::start(&Config::new(&[origin]).cpus(&[0]).admin())
}

/// `(gathered sends, gathered bytes)` so far, once the tick published them.
fn gathered(zgix: &Zgix) -> (u64, u64) {
    let m = metrics_after_tick(zgix);
    (
        series(&m, "zgix_io_gathered_sends_total") as u64,
        series(&m, "zgix_io_gathered_bytes_total") as u64,
    )
}

/// Chunk `i`'s data: `len` letters, shifted by `i`.
fn data(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| b'a' + ((i + k) % 26) as u8).collect()
}

/// A chunked body as a client sends it (upper-case sizes, leading zeros and
/// extensions on some lines, a trailer) and as zgix re-encodes it when it
/// reads it whole (RFC 9112 §7.1.1: no chunk-ext; §7.1.2: no trailer).
fn body_of(sizes: &[usize]) -> (Vec<u8>, Vec<u8>, usize) {
    let (mut wire, mut want, mut gatherable) = (Vec::new(), Vec::new(), 0);
    for (i, &len) in sizes.iter().enumerate() {
        let d = data(i, len);
        let line = match i % 4 {
            0 => format!("{len:X};name=\"v {i}\";x\r\n"),
            1 => format!("00{len:x}\r\n"),
            2 => format!("{len:x} ; e=1\r\n"),
            _ => format!("{len:x}\r\n"),
        };
        wire.extend_from_slice(line.as_bytes());
        wire.extend_from_slice(&d);
        wire.extend_from_slice(b"\r\n");
        want.extend_from_slice(format!("{len:x}\r\n").as_bytes());
        want.extend_from_slice(&d);
        want.extend_from_slice(b"\r\n");
        if len > COPY_MAX {
            gatherable += len;
        }
    }
    wire.extend_from_slice(b"0;end\r\nX-Sum: 7\r\nContent-Length: 3\r\n\r\n");
    want.extend_from_slice(b"0\r\n\r\n");
    (wire, want, gatherable)
}

const POST: &[u8] = b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";

/// Posts `sizes` as one chunked body in one write (under one receive
/// buffer, so zgix reads it whole), a pipelined GET after it; checks the
/// origin got the canonical re-encoding; returns the gathered sends and
/// bytes it took, and the bytes of chunk data over COPY_MAX.
fn post_in_one_write(sizes: &[usize]) -> (u64, u64, usize) {
    let origin = Origin::start();
    let zgix = proxy(origin.addr());
    let (wire, want, gatherable) = body_of(sizes);
    let mut msg = POST.to_vec();
    msg.extend_from_slice(&wire);
    // A pipelined request after the body, in the same write.
    msg.extend_from_slice(b"GET /after HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(msg.len() < 12 << 10, "{}", msg.len());
    let (sends0, bytes0) = gathered(&zgix);
    let mut client = Client::connect(zgix.addr());
    client.send(&msg);
    let r = client.read_response();
    assert_eq!(r.status, 200, "{}", r.show());
    let next = client.read_response();
    assert_eq!(next.status, 200, "{}", next.show());
    let got = origin.wait_requests(2);
    let up = &got[0];
    assert_eq!(
        String::from_utf8_lossy(&up.body),
        String::from_utf8_lossy(&want),
        "the origin's body is not the re-encoding"
    );
    assert!(got[1].head.starts_with(b"GET /after "));
    let (sends, bytes) = gathered(&zgix);
    (sends - sends0, bytes - bytes0, gatherable)
}

#[test]
fn chunks_that_fit_one_gather_list_go_up_from_the_clients_buffer() {
    // 20 chunks worth an iovec each and a few tiny ones: one vectored send,
    // every byte of the larger chunks' data from the client's buffer.
    let mut sizes: Vec<usize> = (0..20).map(|i| 65 + i * 37).collect();
    sizes.extend([3, 1, 4]);
    let (sends, bytes, gatherable) = post_in_one_write(&sizes);
    assert_eq!((sends, bytes), (1, gatherable as u64));
}

#[test]
fn many_small_chunks_reach_the_origin_byte_exact_in_one_copied_write() {
    // 40 chunks worth an iovec each (more than one send's 64 pieces, with
    // their framing), 300 tiny ones between and after: more than one gather
    // list holds, so the buffer's re-encoding is copied and goes up in one
    // write, not one vectored send (and upstream round trip) per list.
    let mut sizes: Vec<usize> = (0..40).map(|i| 65 + i * 5).collect();
    sizes.extend((0..300).map(|i| 1 + i % 5));
    sizes.insert(20, 3);
    let (sends, bytes, _) = post_in_one_write(&sizes);
    assert_eq!((sends, bytes), (0, 0), "no vectored send");
}

/// Checks `raw` is a canonical re-encoding (lower-case hex sizes without
/// padding, no chunk-ext, non-empty chunks, the last chunk with no trailer)
/// and returns its data and chunk count.
fn canonical(raw: &[u8]) -> (Vec<u8>, usize) {
    let (mut rest, mut out, mut chunks) = (raw, Vec::new(), 0);
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a size line");
        let line = std::str::from_utf8(&rest[..eol]).expect("ASCII size line");
        let n = usize::from_str_radix(line, 16).unwrap_or_else(|_| panic!("size {line:?}"));
        assert_eq!(line, format!("{n:x}"), "not canonical: {line:?}");
        rest = &rest[eol + 2..];
        if n == 0 {
            assert_eq!(rest, b"\r\n", "a trailer or bytes after the last chunk");
            return (out, chunks);
        }
        out.extend_from_slice(&rest[..n]);
        assert_eq!(&rest[n..n + 2], b"\r\n");
        rest = &rest[n + 2..];
        chunks += 1;
    }
}

#[test]
fn a_chunk_spanning_receive_buffers_arrives_whole_re_encoded_as_runs() {
    let origin = Origin::start();
    let zgix = proxy(origin.addr());
    // Under the bulk path's 256 KiB, over any buffer: it spans reads.
    let sizes = [200 << 10, 5, 3000, 1, 70];
    let (wire, _, _) = body_of(&sizes);
    let want_data: Vec<u8> = sizes
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| data(i, n))
        .collect();
    let (_, bytes0) = gathered(&zgix);
    let mut client = Client::connect(zgix.addr());
    client.send(POST);
    for piece in wire.chunks(7001) {
        client.send(piece);
    }
    let r = client.read_response();
    assert_eq!(r.status, 200, "{}", r.show());
    let up = origin.only_request();
    assert_eq!(up.body_len as usize, up.body.len());
    let (got, chunks) = canonical(&up.body);
    assert_eq!(got.len(), want_data.len());
    assert!(got == want_data, "the data changed on the way");
    assert!(
        chunks > sizes.len(),
        "the big chunk was not split into runs"
    );
    // Nearly all of it from the client's buffer (a run cut short by a read
    // may be copied).
    let (_, bytes) = gathered(&zgix);
    let gathered = bytes - bytes0;
    assert!(
        gathered as usize >= want_data.len() - COPY_MAX * chunks
            && gathered as usize <= want_data.len(),
        "{gathered} of {} bytes gathered",
        want_data.len()
    );
}

#[test]
fn a_malformed_chunk_past_one_sends_pieces_is_refused_before_any_of_its_buffer_goes() {
    // An origin that records every byte it gets until zgix closes.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        tx.send(got).unwrap();
    });
    let zgix = proxy(addr);
    // 50 chunks that each take an iovec, then a bad CRLF: the error lies
    // past what one vectored send holds.
    let sizes: Vec<usize> = (0..50).map(|i| 100 + i).collect();
    let (mut wire, _, _) = body_of(&sizes);
    let bad = wire.len() - b"0;end\r\nX-Sum: 7\r\nContent-Length: 3\r\n\r\n".len() - 2;
    wire[bad] = b'X';
    let mut msg = POST.to_vec();
    msg.extend_from_slice(&wire);
    let mut client = Client::connect(zgix.addr());
    client.send(&msg);
    let r = client.read_response();
    assert_eq!(r.status, 400, "{}", r.show());
    client.expect_closed();
    let got = rx
        .recv_timeout(IO_TIMEOUT + Duration::from_secs(5))
        .unwrap();
    let end = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("the head reached the origin")
        + 4;
    assert_eq!(
        String::from_utf8_lossy(&got[end..]),
        "",
        "body bytes went up before the error was found"
    );
}
