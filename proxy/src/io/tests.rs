//! Tests of the driver itself on real loopback sockets: parking and cross-thread wake-ups, buffers given back by dropped sockets, multishot receives re-armed after `ENOBUFS`, an overflowing completion queue, deadlines, sends cancelled by a timeout or a dropped waiter, and inline sends (submitted with the park, waiting for room when the socket is full).

use std::io::{Read, Write};
use std::net::TcpStream as StdStream;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use super::{Driver, Kind, Listener, Options, Sock};

/// Runs `f` on a glommio executor with a driver of `opts` turning beside it
/// (the TLS client-side tests use it too).
pub(crate) fn on_driver<F, Fut>(opts: Options, f: F)
where
    F: FnOnce(Rc<Driver>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(crate::shard::IO_MEMORY)
        .preempt_timer(super::PREEMPT_EVERY)
        .spawn(move || async move {
            let d = Driver::new(&opts).expect("driver");
            let t = glommio::spawn_local(d.clone().run());
            f(d.clone()).await;
            d.stop();
            t.await;
        })
        .expect("executor")
        .join()
        .expect("join");
}

pub(super) fn kinds() -> [Kind; 2] {
    [Kind::Uring, Kind::Epoll]
}

/// A listener on the driver and a connected (driver socket, std peer) pair.
pub(super) async fn pair(d: &Rc<Driver>) -> (Sock, StdStream) {
    let fd = super::bind_listener("127.0.0.1:0".parse().unwrap()).unwrap();
    let l = Listener::from_fd(fd, d).unwrap();
    let addr = l.local_addr().unwrap();
    let peer = StdStream::connect(addr).unwrap();
    let (s, _) = d
        .timeout(Duration::from_secs(5), l.accept())
        .await
        .expect("accepted in time")
        .unwrap();
    (s, peer)
}

/// Waits on the driver's clock until `cond` holds (bounded).
pub(super) async fn until(d: &Rc<Driver>, what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        d.sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn a_parked_shard_wakes_for_another_threads_notify() {
    for kind in kinds() {
        let mut o = Options::new(kind);
        o.spin = Duration::ZERO;
        on_driver(o, move |d| async move {
            let n = d.notifier();
            let (tx, rx) = mpsc::channel::<()>();
            let t = std::thread::spawn(move || {
                rx.recv().unwrap();
                // The shard is (about to be) parked with no timer due soon.
                std::thread::sleep(Duration::from_millis(50));
                n.notify();
            });
            let parks = d.stats.parks.get();
            tx.send(()).unwrap();
            let woke = d.timeout(Duration::from_secs(10), d.notified()).await;
            assert!(woke.is_some(), "{kind:?}: the notification was lost");
            assert!(
                d.stats.parks.get() > parks,
                "{kind:?}: the driver never parked"
            );
            t.join().unwrap();
        });
    }
}

/// An accepted socket is TCP_NODELAY (inherited from its listener; no
/// setsockopt per connection) and in the blocking mode its backend wants
/// (no fcntl per connection): blocking on the ring, non-blocking on epoll.
#[test]
fn an_accepted_socket_has_nodelay_and_its_backends_mode_without_a_syscall_of_its_own() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let (s, mut peer) = pair(&d).await;
            let mut on: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt and fcntl on the socket's open descriptor,
            // into a c_int of the size passed.
            let (r, fl) = unsafe {
                let r = libc::getsockopt(
                    s.fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    (&mut on as *mut libc::c_int).cast(),
                    &mut len,
                );
                (r, libc::fcntl(s.fd(), libc::F_GETFL))
            };
            assert_eq!((r, on), (0, 1), "{kind:?}: TCP_NODELAY");
            assert_eq!(fl & libc::O_NONBLOCK != 0, kind == Kind::Epoll, "{kind:?}");
            peer.write_all(b"x").unwrap();
            let mut b = [0u8; 4];
            assert_eq!(s.read(&mut b).await.unwrap(), 1, "{kind:?}");
        });
    }
}

#[test]
fn a_read_times_out_at_its_deadline_and_leaves_nothing_armed() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let (s, _peer) = pair(&d).await;
            s.set_read_timeout(Some(Duration::from_millis(50)));
            let mut b = [0u8; 16];
            let e = s.read(&mut b).await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{kind:?}");
            assert_eq!(d.timers_armed(), 0, "{kind:?}");
        });
    }
}

#[test]
fn a_socket_dropped_with_unread_bytes_gives_its_buffers_back() {
    on_driver(Options::new(Kind::Uring), |d| async move {
        let before = d.slots_in_use();
        let (s, mut peer) = pair(&d).await;
        peer.write_all(&vec![7u8; 48 << 10]).unwrap();
        until(&d, "buffers to be held", || d.buffers_held() > 0).await;
        drop(s);
        assert_eq!(d.buffers_held(), 0, "a dropped socket kept its buffers");
        // The slot is freed once the kernel's receive is cancelled.
        until(&d, "the slot to be freed", || d.slots_in_use() == before).await;
    });
}

#[test]
fn receives_run_dry_with_enobufs_and_rearm_without_losing_a_byte() {
    let mut o = Options::new(Kind::Uring);
    o.recv_buffers = 16;
    o.recv_buffer_bytes = 1024;
    on_driver(o, |d| async move {
        const N: usize = 8;
        const LEN: usize = 24 << 10;
        let mut socks = Vec::new();
        let mut peers = Vec::new();
        for _ in 0..N {
            let (s, p) = pair(&d).await;
            socks.push(s);
            peers.push(p);
        }
        for (i, p) in peers.iter_mut().enumerate() {
            let data: Vec<u8> = (0..LEN).map(|k| (k * 7 + i) as u8).collect();
            p.write_all(&data).unwrap();
        }
        // 16 KiB of buffers for 192 KiB in flight: the ring runs dry.
        until(&d, "the buffer ring to run dry", || {
            d.stats.recv_rearm_nobufs.get() > 0
        })
        .await;
        for (i, s) in socks.iter().enumerate() {
            let mut got = vec![0u8; LEN];
            let mut at = 0;
            while at < LEN {
                let n = s.read(&mut got[at..]).await.unwrap();
                assert!(n > 0, "EOF after {at} bytes");
                at += n;
            }
            let want: Vec<u8> = (0..LEN).map(|k| (k * 7 + i) as u8).collect();
            assert!(got == want, "socket {i}: bytes lost or reordered");
        }
        assert_eq!(d.buffers_held(), 0);
    });
}

#[test]
fn an_overflowing_completion_queue_loses_no_completion() {
    let mut o = Options::new(Kind::Uring);
    o.cq_entries = 8;
    on_driver(o, |d| async move {
        const N: usize = 48;
        let mut socks = Vec::new();
        let mut peers = Vec::new();
        for i in 0..N {
            let (s, p) = d
                .timeout(Duration::from_secs(5), pair(&d))
                .await
                .unwrap_or_else(|| panic!("pair {i} not accepted"));
            s.set_read_timeout(Some(Duration::from_secs(5)));
            socks.push(s);
            peers.push(p);
        }
        // Every socket receives at once: more completions than the CQ holds.
        for (i, p) in peers.iter_mut().enumerate() {
            p.write_all(format!("message {i:03}").as_bytes()).unwrap();
        }
        for (i, s) in socks.iter().enumerate() {
            let mut got = [0u8; 11];
            let mut at = 0;
            while at < got.len() {
                at += s.read(&mut got[at..]).await.unwrap();
            }
            assert_eq!(&got, format!("message {i:03}").as_bytes());
        }
        assert!(
            d.stats.cq_overflows.get() > 0,
            "the completion queue never overflowed"
        );
        // Closing them: each peer sees its close (the cancels got through).
        // The peers read on their own thread; this one keeps the driver turning.
        socks.clear();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for p in peers.iter_mut() {
                p.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut b = [0u8; 1];
                let closed = loop {
                    match p.read(&mut b) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        r => break matches!(r, Ok(0)),
                    }
                };
                let _ = tx.send(closed);
            }
        });
        let mut closed = 0;
        until(&d, "every peer to see its close", || {
            while let Ok(c) = rx.try_recv() {
                assert!(c, "a peer timed out instead of seeing a close");
                closed += 1;
            }
            closed == N
        })
        .await;
    });
}

#[test]
fn a_send_to_a_peer_that_never_reads_times_out_and_is_cancelled() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let before = d.slots_in_use();
            let (s, peer) = pair(&d).await;
            s.set_write_timeout(Some(Duration::from_millis(100)));
            let big = vec![1u8; 64 << 20];
            let e = s.write_all(&big).await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{kind:?}");
            drop(s);
            drop(peer);
            until(&d, "the slot to be freed", || d.slots_in_use() == before).await;
        });
    }
}

#[test]
fn a_dropped_send_is_cancelled_and_frees_its_socket() {
    on_driver(Options::new(Kind::Uring), |d| async move {
        let before = d.slots_in_use();
        let (s, peer) = pair(&d).await;
        {
            let big = vec![2u8; 64 << 20];
            // One write sends at most a chunk of it.
            let n = s.write(&big).await.unwrap();
            assert!(n < big.len(), "64 MiB went in one send");
            let mut w = Box::pin(s.write_all(&big));
            // Started: the kernel holds the send, the peer reads nothing.
            assert!(futures_lite::future::poll_once(w.as_mut()).await.is_none());
            d.sleep(Duration::from_millis(20)).await;
            // Dropped mid-send (a tunnel or request cancelled): the drop
            // cancels; the driver owns the chunk the kernel reads, so `big`
            // can go right after.
            drop(w);
        }
        drop(s);
        drop(peer);
        until(&d, "the slot to be freed", || d.slots_in_use() == before).await;
    });
}

#[test]
fn a_park_submits_the_reply_and_sleeps_until_the_next_request() {
    on_driver(Options::new(Kind::Uring), |d| async move {
        const ROUNDS: u64 = 200;
        let (s, mut peer) = pair(&d).await;
        s.set_read_timeout(Some(Duration::from_secs(10)));
        // The peer sends a byte and waits for the answer, ROUNDS times.
        let t = std::thread::spawn(move || {
            peer.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut b = [0u8; 1];
            for i in 0..ROUNDS {
                peer.write_all(&[i as u8]).unwrap();
                peer.read_exact(&mut b).unwrap();
                assert_eq!(b[0], (i as u8).wrapping_add(1), "round {i}");
            }
        });
        let enters = d.stats.enters.get();
        let mut b = [0u8; 1];
        for _ in 0..ROUNDS {
            assert_eq!(s.read(&mut b).await.unwrap(), 1);
            s.write_all(&[b[0].wrapping_add(1)]).await.unwrap();
        }
        let per_round = (d.stats.enters.get() - enters) as f64 / ROUNDS as f64;
        // Each round is one event (the peer's byte); the reply's send rides
        // on the park that waits for it. A send submitted on its own, and
        // its completion waking the park, would make this 2 or more.
        assert!(
            per_round < 1.6,
            "{per_round:.2} enters per request-reply round"
        );
        assert_eq!(
            d.stats.sends_waited.get(),
            0,
            "a 1-byte send waited for room"
        );
        t.join().unwrap();
    });
}

/// An answer the shard closes after ([`Sock::closing`] first) reaches the
/// peer, FIN and all, without the park sleeping to the inline-send
/// backstop: it did not count the last send as riding on an event that
/// will not come (the peer waits for the FIN). The same exchange without
/// `closing` sleeps until the backstop, and that park is counted.
#[test]
fn an_answer_before_a_close_does_not_wait_for_the_backstop() {
    for marked in [true, false] {
        let mut o = Options::new(Kind::Uring);
        o.inline_backstop = Duration::from_millis(50);
        on_driver(o, move |d| async move {
            let (s, mut peer) = pair(&d).await;
            let t = std::thread::spawn(move || {
                peer.write_all(b"q").unwrap();
                let mut got = Vec::new();
                peer.read_to_end(&mut got).unwrap();
                got
            });
            let mut b = [0u8; 1];
            assert_eq!(s.read(&mut b).await.unwrap(), 1);
            if marked {
                s.closing();
            }
            let sent = d
                .timeout(Duration::from_secs(20), s.write_all(b"answer"))
                .await;
            assert!(sent.is_some(), "marked {marked}: the last send waited");
            s.shutdown_write();
            assert_eq!(t.join().unwrap(), b"answer");
            assert_eq!(
                d.stats.backstop_parks.get() > 0,
                !marked,
                "marked {marked}: {} parks slept to the backstop",
                d.stats.backstop_parks.get()
            );
        });
    }
}

#[test]
fn a_send_that_finds_the_socket_full_waits_for_room_and_loses_nothing() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            const LEN: usize = 16 << 20;
            let (s, mut peer) = pair(&d).await;
            s.set_write_timeout(Some(Duration::from_secs(20)));
            let data: Vec<u8> = (0..LEN).map(|k| (k % 251) as u8).collect();
            let (go, wait) = mpsc::channel::<()>();
            let reader = std::thread::spawn(move || {
                // Reads only once the sender has found the socket full.
                wait.recv().unwrap();
                let mut got = Vec::with_capacity(LEN);
                peer.set_read_timeout(Some(Duration::from_secs(20)))
                    .unwrap();
                let mut b = vec![0u8; 1 << 16];
                while got.len() < LEN {
                    let n = peer.read(&mut b).unwrap();
                    assert!(n > 0, "EOF after {} bytes", got.len());
                    got.extend_from_slice(&b[..n]);
                }
                got
            });
            let mut w = Box::pin(s.write_all(&data));
            let full = d
                .timeout(Duration::from_secs(10), async {
                    loop {
                        if futures_lite::future::poll_once(w.as_mut()).await.is_some() {
                            panic!("{kind:?}: 16 MiB fitted in the socket buffer");
                        }
                        if kind == Kind::Epoll || d.stats.sends_waited.get() > 0 {
                            return;
                        }
                        d.sleep(Duration::from_millis(5)).await;
                    }
                })
                .await;
            assert!(
                full.is_some(),
                "{kind:?}: no send ever found the socket full"
            );
            go.send(()).unwrap();
            w.await.unwrap();
            assert_eq!(s.bytes_written(), LEN as u64, "{kind:?}");
            let got = reader.join().unwrap();
            assert!(got == data, "{kind:?}: bytes lost or reordered");
        });
    }
}
