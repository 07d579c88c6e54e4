//! Gathered sends ([`super::Sock::write_all_gather`]) on real loopback sockets, both drivers: framing and ranges of a shared buffer arrive in order byte for byte through many short writes, and a forgotten send on the ring keeps the buffer alive (its `Rc`) and sends all of it before letting go, while epoll never touches it after the future.

use std::io::Read;
use std::net::TcpStream as StdStream;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use zgix_parser::Piece;

use super::tests::{kinds, on_driver, pair, until};
use super::{uring, Backend, Buf, Driver, Gather, Kind, Options, GATHER_IOVS};

fn pattern(k: usize) -> u8 {
    (k % 251) as u8
}

/// A shared buffer of `len` pattern bytes.
fn shared(len: usize) -> Rc<Buf> {
    let mut b = Buf::new(len);
    b.iter_mut().enumerate().for_each(|(k, v)| *v = pattern(k));
    Rc::new(b)
}

/// Reads `peer` to EOF on a thread; the bytes come on the channel.
fn drain(mut peer: StdStream, slow: bool) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        peer.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut got = Vec::new();
        let mut b = vec![0u8; if slow { 4096 } else { 1 << 16 }];
        loop {
            match peer.read(&mut b) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(e) => panic!("peer read: {e}"),
            }
            if slow && got.len() % (1 << 20) < 4096 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        tx.send(got).unwrap();
    });
    rx
}

/// Waits on the driver's clock (the close needs its turns) for the peer's bytes.
async fn peer_got(d: &Rc<Driver>, rx: &mpsc::Receiver<Vec<u8>>) -> Vec<u8> {
    let mut got = None;
    until(d, "the peer to see the close", || {
        got = rx.try_recv().ok();
        got.is_some()
    })
    .await;
    got.unwrap()
}

fn ops_in_flight(d: &Driver) -> usize {
    match &d.backend {
        Backend::Uring(_) => uring::Ring::ops_in_flight(&d.st.borrow()),
        Backend::Epoll(_) => 0,
    }
}

/// What `g` stands for, concatenated.
fn flat(g: &Gather<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    for p in g.pieces {
        match p {
            Piece::Framing(r) => v.extend_from_slice(&g.framing[r.clone()]),
            Piece::Data(r) => v.extend_from_slice(&g.shared[g.base + r.start..g.base + r.end]),
        }
    }
    v
}

#[test]
fn a_gathered_send_arrives_in_order_through_short_writes() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let (s, peer) = pair(&d).await;
            s.set_write_timeout(Some(Duration::from_secs(30)));
            const LEN: usize = 24 << 20;
            let buf = shared(LEN + 100);
            let framing: Vec<u8> = (0..1000u32).map(|k| b'A' + (k % 26) as u8).collect();
            // The most pieces one send takes, odd sizes, an empty one, data
            // from offset 7 of the buffer on.
            let mut pieces = Vec::new();
            let (mut f, mut at) = (0, 0);
            while pieces.len() + 2 <= GATHER_IOVS {
                let k = pieces.len();
                let fl = (k * 7) % 31;
                pieces.push(Piece::Framing(f..f + fl));
                f += fl;
                let dl = if k % 10 == 0 { 0 } else { LEN / 40 + k * 13 };
                pieces.push(Piece::Data(at..at + dl));
                at += dl;
            }
            assert!(at <= LEN && f <= framing.len());
            let g = Gather {
                shared: &buf,
                base: 7,
                framing: &framing,
                pieces: &pieces,
            };
            let want = flat(&g);
            let rx = drain(peer, true);
            let sends = d.stats.gathered_sends.get();
            s.write_all_gather(g).await.unwrap();
            assert_eq!(d.stats.gathered_sends.get(), sends + 1);
            assert_eq!(s.bytes_written(), want.len() as u64);
            drop(s);
            let got = peer_got(&d, &rx).await;
            assert_eq!(got.len(), want.len(), "{kind:?}");
            let bad = got.iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(bad, None, "{kind:?}: wrong bytes from this offset");
            assert_eq!(
                Rc::strong_count(&buf),
                1,
                "{kind:?}: the send kept its hold"
            );
        });
    }
}

#[test]
fn a_forgotten_gathered_send_holds_its_buffer_until_the_kernel_is_done() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let (s, peer) = pair(&d).await;
            s.set_write_timeout(Some(Duration::from_secs(30)));
            const LEN: usize = 32 << 20;
            let buf = shared(LEN);
            let framing = b"head|tail".to_vec();
            let pieces = [
                Piece::Framing(0..5),
                Piece::Data(0..LEN),
                Piece::Framing(5..9),
            ];
            let g = Gather {
                shared: &buf,
                base: 0,
                framing: &framing,
                pieces: &pieces,
            };
            let want = flat(&g);
            let mut w = Box::pin(s.write_all_gather(g));
            // The peer reads nothing yet: the send cannot complete.
            for _ in 0..20 {
                let pending = futures_lite::future::poll_once(w.as_mut()).await.is_none();
                assert!(pending, "{kind:?}: 32 MiB fitted in the socket");
                d.sleep(Duration::from_millis(2)).await;
            }
            // Leaked mid-send (safe code may do this): the borrows end, and
            // the caller's own hold on the buffer goes.
            std::mem::forget(w);
            let weak = Rc::downgrade(&buf);
            drop(buf);
            assert_eq!(
                weak.upgrade().is_some(),
                kind == Kind::Uring,
                "{kind:?}: only the ring's send holds the buffer"
            );
            let rx = drain(peer, false);
            until(&d, "the forgotten send to complete", || {
                ops_in_flight(&d) == 0
            })
            .await;
            // The completed operation's box stays with the slot until its
            // next operation or its release, which lets the buffer go.
            drop(s);
            assert!(weak.upgrade().is_none(), "{kind:?}: the buffer was kept");
            let got = peer_got(&d, &rx).await;
            let bad = got.iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(
                bad,
                None,
                "{kind:?}: of {} bytes, wrong from here",
                got.len()
            );
            match kind {
                // The driver sent on by itself, every byte.
                Kind::Uring => assert_eq!(got.len(), want.len()),
                // Nothing after the future: a prefix.
                Kind::Epoll => assert!(!got.is_empty() && got.len() < want.len()),
            }
        });
    }
}
