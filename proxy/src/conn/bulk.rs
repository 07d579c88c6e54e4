//! The bulk path: a body (or tunnel direction) that zgix only relays, of [`BULK_MIN`] bytes or more (see [`takes_bulk`]), moves socket to socket through a pipe with splice, without passing through the exchange's buffers or user space.
//!
//! It applies where zgix neither reads nor changes the bytes: a
//! Content-Length body (RFC 9112 §6.2: the length alone frames it, so the
//! bytes after the head are relayed as they come, exactly that many), the
//! data of a large chunk (RFC 9112 §7.1: its chunk-size frames it the same
//! way, from 256 KiB on, see [`takes_bulk_chunk`]) and a
//! tunnel after `101` (RFC 9110 §7.8), both sockets plaintext. A TLS client, the framing of a chunked body
//! (chunk lines, trailers, the last chunk: scanned by the parser's decoder,
//! which is told how many data bytes went past it), the data of a response
//! de-chunked for an HTTP/1.0 client, and the first bytes that came in with
//! a head stay on the copy path of `body.rs`.
//!
//! - epoll: non-blocking `splice(2)` from the source socket into a pipe
//!   from the shard's pool, then from the pipe into the destination, on the
//!   driver's readiness.
//! - uring: the same two splices as `IORING_OP_SPLICE` entries (the kernel
//!   runs them in the ring's workers, since a splice may block), over two
//!   pipes so that the next splice in runs while the last bytes go out.
//!   The source's receive is held off as soon as the head is parsed, before
//!   it is written on, and the buffers it had queued are sent on as they
//!   are (`sendmsg` over them), so the bytes keep their order; the receive
//!   resumes when the relay ends, one buffer at a time until the next head
//!   (`io/uring/one.rs`): a multishot receive would have pulled most of the
//!   next body into buffers before that head was parsed.
//!
//! Tunnels on the ring take the relayed-buffer path below, never a splice:
//! their idle rule goes on after a read timeout, and a splice in that the
//! timeout cancels may already have moved bytes into its pipe.
//!
//! A shard has at most `io::PIPES_MAX` pipes out; past that (or if `pipe2`
//! fails) the relay runs without one: on the ring the received buffers are
//! sent as they are, several per `sendmsg`, while the source may keep
//! `RQ_BULK` buffers unread (bounded per connection, and per shard by its
//! buffer ring); on epoll it copies through the exchange's buffer.

use std::cell::Cell;
use std::io;
use std::time::Instant;

use super::client::ClientConn;
use crate::io::{Pipe, Relayed, Sock};
use crate::upstream::conn::UpConn;

/// A Content-Length (from the head) from which a body takes the bulk path
/// on epoll, and the bytes still owed above which it takes it on the ring.
const BULK_MIN: u64 = 64 << 10;

/// Bytes that must still be owed, after those that came with the head, for
/// the bulk path to be worth its pipe on epoll (one receive buffer's worth).
const BULK_REST: u64 = 16 << 10;

/// Whether a Content-Length body of `n` bytes with `remaining` still to
/// move takes the bulk path. On epoll it is decided from the head's length,
/// so a 64 KiB body whose first bytes came with the head is spliced too
/// (two `splice(2)` calls instead of a read and a write per buffer). On the
/// ring the rest itself must pass 64 KiB: its splices are punted to the
/// ring's kernel workers, and for a 64 KiB response that cost more CPU than
/// the copies it saves (BENCHMARKS.md, "Bodies").
///
/// A body with under 16 KiB still owed is decided by one comparison, as
/// before this rule (no driver lookup on the small-request path).
pub(super) fn takes_bulk(n: u64, remaining: u64, sock: &Sock) -> bool {
    remaining >= BULK_REST
        && match sock.driver().kind() {
            crate::io::Kind::Uring => remaining > BULK_MIN,
            _ => n >= BULK_MIN,
        }
}

/// The rest of a chunk's data from which it takes the bulk path: one
/// pipe's worth (`io::PIPE_BYTES`), on both drivers. Each spliced chunk
/// takes a pipe and (on the ring) holds the receive off and waits for its
/// first splice in a kernel worker, and a rest that fits one pipe gets no
/// overlap of its two legs from a second pipe: with 1 MiB responses in 80,
/// 128 and 256 KiB chunks spliced from 64 KiB on, req/s on the ring was
/// 0.78×, 0.86× and 0.95× the copy path's (CPU per MB +10 %, −9 %, −4 %),
/// and on epoll with 80 KiB chunks 0.62–0.67× (CPU per MB −4 %); from 512
/// KiB chunks on both gained (BENCHMARKS.md, "Chunked bodies on the bulk
/// path").
const BULK_CHUNK: u64 = 256 << 10;

/// Whether the rest of a chunk's data, `owed` bytes, takes the bulk path:
/// RFC 9112 §7.1, the chunk-size frames them as a Content-Length frames a
/// body, so they can be relayed without being looked at. A smaller chunk
/// stays on the copy path with the framing around it.
pub(super) fn takes_bulk_chunk(owed: u64) -> bool {
    owed >= BULK_CHUNK
}

/// The most one relay step asks for (the ring caps it further by
/// `RELAY_BUFS` buffers, epoll by the pipe's size).
const STEP_MAX: u64 = 1 << 20;

/// Why a relay ended before its bytes were all moved.
#[derive(Debug)]
pub(super) enum RelayEnd {
    /// Reading the source failed or timed out.
    Src(io::Error),
    /// The source closed before the bytes it owed.
    SrcEof,
    /// Writing the destination failed or timed out.
    Dst(io::Error),
}

/// The client's socket when the connection is plaintext (the bulk path
/// never sees TLS: the record layer must decrypt and encrypt every byte).
pub(super) fn plain(client: &ClientConn) -> Option<&Sock> {
    client.tls().is_none().then(|| client.sock()).flatten()
}

/// The upstream's socket when the connection to it is plaintext: only then
/// may the bulk path move its bytes (TLS records are zgix's to decrypt).
pub(super) fn plain_up(up: &UpConn) -> Option<&Sock> {
    (!up.is_tls()).then(|| up.sock())
}

/// Progress of a relay: the time of the last bytes (tunnel idleness) and
/// what to count them in.
pub(super) struct Progress<'a> {
    pub last: Option<&'a Cell<Instant>>,
    pub bytes: Option<&'a crate::observe::counter::Counter>,
}

impl Progress<'_> {
    pub(super) const NONE: Progress<'static> = Progress {
        last: None,
        bytes: None,
    };

    fn moved(&self, src: &Sock, n: usize) {
        if let Some(l) = self.last {
            l.set(src.driver().now());
        }
        if let Some(b) = self.bytes {
            b.add(n as u64);
        }
    }
}

/// What a relay splices through: a pipe from the shard's pool and the hold
/// on the source's ring receive, taken together, before the head the body
/// follows is written, so that no receive runs between the head and the
/// splices (`io/uring/one.rs`).
pub(super) struct Lane<'a> {
    pipe: Pipe,
    hold: Hold<'a>,
}

/// A lane for relaying from `src`, or `None`: the shard's pipes are all
/// out or `pipe2` failed (counted in `splice_fallbacks`; the relay then
/// goes without one), or `ring_splice` is false on the ring (tunnels: a
/// splice in that a read timeout cancels may already have moved bytes into
/// its pipe, which a relay that goes on after the timeout would lose).
pub(super) fn lane(src: &Sock, ring_splice: bool) -> Option<Lane<'_>> {
    if src.driver().kind() == crate::io::Kind::Uring && !ring_splice {
        return None;
    }
    match Pipe::take(src.driver()) {
        Some(pipe) => Some(Lane {
            pipe,
            hold: Hold::new(src),
        }),
        None => {
            let c = &src.driver().stats.splice_fallbacks;
            c.set(c.get() + 1);
            None
        }
    }
}

/// Relays `n` bytes (`None`: until the source's EOF) from `src` to `dst`,
/// through `lane` if there is one ([`lane`]); `buf` carries what cannot be
/// relayed as it is. Returns the bytes moved.
pub(super) async fn relay(
    src: &Sock,
    dst: &Sock,
    n: Option<u64>,
    buf: &mut [u8],
    progress: &Progress<'_>,
    lane: Option<Lane<'_>>,
) -> Result<u64, RelayEnd> {
    let mut left = n.unwrap_or(u64::MAX);
    let mut moved = 0u64;
    let (pipe, _hold) = match lane {
        Some(l) => (Some(l.pipe), Some(l.hold)),
        None => (None, None),
    };
    // Without a pipe, everything; with one, what the ring's receive had
    // queued before it was held off (the bytes keep their order).
    while left > 0 && (pipe.is_none() || !src.receive_idle()) {
        let max = left.min(STEP_MAX) as usize;
        let k = match dst.relay_from(src, max).await.map_err(RelayEnd::Dst)? {
            Relayed::Sent(k) => k,
            Relayed::Empty if pipe.is_some() => {
                // Wakes with bytes, at EOF, or when the held receive stopped.
                src.readable().await.map_err(RelayEnd::Src)?;
                continue;
            }
            Relayed::Empty => {
                src.readable().await.map_err(RelayEnd::Src)?;
                match dst.relay_from(src, max).await.map_err(RelayEnd::Dst)? {
                    Relayed::Sent(k) => k,
                    _ => copy(src, dst, max, buf).await?,
                }
            }
            Relayed::Copy => copy(src, dst, max, buf).await?,
        };
        if k == 0 {
            return eof(n, moved);
        }
        progress.moved(src, k);
        left -= k as u64;
        moved += k as u64;
    }
    let Some(pipe) = pipe else {
        return Ok(moved);
    };
    let spliced = splice(src, dst, left, pipe, progress).await?;
    if spliced.1 {
        return eof(n, moved + spliced.0);
    }
    Ok(moved + spliced.0)
}

/// Splices up to `left` bytes from `src` to `dst` through `pipe`; returns
/// the bytes moved and whether the source's EOF came first.
///
/// On the ring a second pipe, taken once the first splice in has brought
/// bytes (a relay still waiting for its first byte holds one pipe), lets
/// the next splice in run while the last one's bytes go out: each splice
/// waits in a kernel worker, and with one pipe the two legs alternated,
/// the core idle while either waited (1 MiB responses, 8 connections: 0.72×
/// the req/s of relaying received buffers, BENCHMARKS.md "Bodies"). On
/// epoll the splices are calls on the shard thread, and the legs alternate.
async fn splice(
    src: &Sock,
    dst: &Sock,
    mut left: u64,
    mut pipe: Pipe,
    progress: &Progress<'_>,
) -> Result<(u64, bool), RelayEnd> {
    let mut moved = 0u64;
    let mut next: Option<Pipe> = None;
    let ring = src.driver().kind() == crate::io::Kind::Uring;
    let mut k = 0usize;
    loop {
        if k == 0 {
            if left == 0 {
                return Ok((moved, false));
            }
            let max = left.min(STEP_MAX) as usize;
            k = src.splice_in(&mut pipe, max).await.map_err(RelayEnd::Src)?;
            if k == 0 {
                return Ok((moved, true));
            }
            left -= k as u64;
            if ring && next.is_none() && left > 0 {
                next = Pipe::take(src.driver());
            }
        }
        let (out, got) = match next.as_mut().filter(|_| left > 0) {
            Some(other) => {
                let max = left.min(STEP_MAX) as usize;
                let (out, got) =
                    futures_lite::future::zip(dst.splice_out(&mut pipe), src.splice_in(other, max))
                        .await;
                (out, Some(got))
            }
            None => (dst.splice_out(&mut pipe).await, None),
        };
        out.map_err(RelayEnd::Dst)?;
        progress.moved(src, k);
        moved += k as u64;
        k = 0;
        if let Some(got) = got {
            let got = got.map_err(RelayEnd::Src)?;
            if got == 0 {
                return Ok((moved, true));
            }
            left -= got as u64;
            k = got;
            // The full pipe goes out next; the empty one takes the next bytes.
            std::mem::swap(&mut pipe, next.as_mut().expect("the other pipe"));
        }
    }
}

/// One read of up to `max` bytes into `buf` and its write; 0 at EOF.
async fn copy(src: &Sock, dst: &Sock, max: usize, buf: &mut [u8]) -> Result<usize, RelayEnd> {
    let want = max.min(buf.len());
    let k = src.read(&mut buf[..want]).await.map_err(RelayEnd::Src)?;
    if k > 0 {
        dst.write_all(&buf[..k]).await.map_err(RelayEnd::Dst)?;
    }
    Ok(k)
}

/// The source's ring receive held off while splices read the socket,
/// resumed when the relay ends (whichever way). The socket's next head is
/// then received one buffer at a time: the body behind it may take this
/// path too.
struct Hold<'a>(&'a Sock);

impl<'a> Hold<'a> {
    fn new(s: &'a Sock) -> Hold<'a> {
        s.hold_receiving(true);
        s.receive_one(true);
        Hold(s)
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.0.hold_receiving(false);
    }
}

/// The source's EOF: the end of a relay until EOF, else a short body.
fn eof(n: Option<u64>, moved: u64) -> Result<u64, RelayEnd> {
    match n {
        None => Ok(moved),
        Some(_) => Err(RelayEnd::SrcEof),
    }
}
