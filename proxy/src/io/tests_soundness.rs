//! Soundness tests of the driver: a released socket's unsubmitted receive never reaches a descriptor that reuses its number, forgotten and dropped sends never let the kernel read the caller's memory nor block the shard, an owned send goes out whole without a copy, the connect timeout holds on both backends, and deadline expiry costs the expired waits, not every socket.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream as StdStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::sync::mpsc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use super::tests::{kinds, on_driver, pair, until};
use super::{uring, Backend, Driver, Kind, Options, Sock, RD};

/// Sends and connects the kernel has not completed yet (0 on epoll).
fn ops_in_flight(d: &Driver) -> usize {
    match &d.backend {
        Backend::Uring(_) => uring::Ring::ops_in_flight(&d.st.borrow()),
        Backend::Epoll(_) => 0,
    }
}

/// Starts `write_all` of `data` and polls it until the socket is full (the
/// peer never reads): on the ring, until a send waits in the kernel for
/// room; on epoll, until the write is pending on `EAGAIN`.
async fn fill<'a>(
    d: &Rc<Driver>,
    s: &'a Sock,
    data: &'a [u8],
) -> std::pin::Pin<Box<impl std::future::Future<Output = std::io::Result<()>> + 'a>> {
    let mut w = Box::pin(s.write_all(data));
    let waited = d.stats.sends_waited.get();
    let full = d
        .timeout(Duration::from_secs(10), async {
            loop {
                let pending = futures_lite::future::poll_once(w.as_mut()).await.is_none();
                assert!(pending, "the whole buffer fitted in the socket");
                if d.kind() == Kind::Epoll || d.stats.sends_waited.get() > waited {
                    return;
                }
                d.sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
    assert!(full.is_some(), "no send ever found the socket full");
    w
}

#[test]
fn a_released_sockets_queued_receive_never_lands_on_a_reused_descriptor() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let before = d.slots_in_use();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = StdStream::connect(l.local_addr().unwrap()).unwrap();
            let fd = l.accept().unwrap().0.into_raw_fd();
            // Registered (its receive queued, not submitted) and released
            // before the driver turns.
            drop(Sock::from_fd(fd, &d).unwrap());
            // The lowest free number: the released socket's, were it closed.
            let (a, mut b) = UnixStream::pair().unwrap();
            b.write_all(b"hello").unwrap();
            until(&d, "the released slot to be freed", || {
                d.slots_in_use() == before
            })
            .await;
            a.set_nonblocking(true).unwrap();
            let mut got = [0u8; 8];
            let n = (&a).read(&mut got).unwrap_or_else(|e| {
                panic!(
                    "{kind:?}: the new socket's bytes were taken ({e}); fds {fd} and {}",
                    a.as_raw_fd()
                )
            });
            assert_eq!(&got[..n], b"hello", "{kind:?}");
            // And the released socket did close: its peer sees EOF.
            peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            assert_eq!(peer.read(&mut got).unwrap(), 0, "{kind:?}: no FIN");
        });
    }
}

#[test]
fn a_forgotten_send_never_sends_bytes_the_caller_overwrote() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            const LEN: usize = 32 << 20;
            let (s, mut peer) = pair(&d).await;
            s.set_write_timeout(Some(Duration::from_secs(30)));
            let pattern = |k: usize| (k % 251) as u8;
            let mut data: Vec<u8> = (0..LEN).map(pattern).collect();
            let w = fill(&d, &s, &data).await;
            // Leaked mid-send (safe code may do this): the borrow of `data`
            // ends here, and the caller overwrites the memory (kept mapped
            // until the end, so a kernel still reading it would send 0xEE
            // rather than fail with EFAULT).
            std::mem::forget(w);
            data.iter_mut().for_each(|b| *b = 0xEE);
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                peer.set_read_timeout(Some(Duration::from_secs(20)))
                    .unwrap();
                let mut got = Vec::new();
                let mut b = vec![0u8; 1 << 16];
                loop {
                    match peer.read(&mut b) {
                        Ok(0) => break,
                        Ok(n) => got.extend_from_slice(&b[..n]),
                        Err(e) => panic!("peer read: {e}"),
                    }
                }
                tx.send(got).unwrap();
            });
            // The peer drains; the forgotten send completes; then the close.
            until(&d, "the forgotten send to complete", || {
                ops_in_flight(&d) == 0
            })
            .await;
            drop(s);
            let mut got = None;
            until(&d, "the peer to see the close", || {
                got = rx.try_recv().ok();
                got.is_some()
            })
            .await;
            let got = got.unwrap();
            assert!(!got.is_empty(), "{kind:?}: nothing arrived");
            let bad = got.iter().enumerate().position(|(k, b)| *b != pattern(k));
            assert_eq!(
                bad,
                None,
                "{kind:?}: of {} bytes, garbage from this offset",
                got.len()
            );
            drop(data);
        });
    }
}

#[test]
fn a_dropped_send_does_not_block_the_shard_and_others_are_served() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let before = d.slots_in_use();
            let (a, peer_a) = pair(&d).await;
            let (b, mut peer_b) = pair(&d).await;
            b.set_read_timeout(Some(Duration::from_secs(5)));
            let data = vec![3u8; 32 << 20];
            let w = fill(&d, &a, &data).await;
            assert_eq!(ops_in_flight(&d), usize::from(kind == Kind::Uring));
            peer_b.write_all(b"ping").unwrap();
            let enters = d.stats.enters.get();
            drop(w);
            // The drop neither entered the kernel nor waited for the send:
            // its completion (the cancel) is still to come.
            assert_eq!(
                d.stats.enters.get(),
                enters,
                "{kind:?}: the drop turned the driver"
            );
            assert_eq!(
                ops_in_flight(&d),
                usize::from(kind == Kind::Uring),
                "{kind:?}"
            );
            drop(data);
            let mut got = [0u8; 4];
            let n = b.read(&mut got).await.unwrap();
            assert_eq!(&got[..n], b"ping", "{kind:?}");
            until(&d, "the cancelled send to complete", || {
                ops_in_flight(&d) == 0
            })
            .await;
            // The socket is still usable afterwards? Its stream has a hole;
            // zgix closes such a connection, as here.
            drop(a);
            drop(b);
            drop(peer_a);
            until(&d, "the slots to be freed", || d.slots_in_use() == before).await;
        });
    }
}

/// A listener on 127.0.0.1 whose accept queue is full (backlog 0, one
/// connection never accepted): Linux drops further SYNs, so a connect to it
/// hangs in SYN-SENT. Returns the listener, its address and the filler.
pub(super) fn syn_dropping_listener() -> (OwnedFd, SocketAddr, Vec<StdStream>) {
    // SAFETY: plain syscalls; results checked; the fd is owned at once.
    let l = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        OwnedFd::from_raw_fd(fd)
    };
    let sa = super::addr::sockaddr("127.0.0.1:0".parse().unwrap());
    // SAFETY: sa is a valid address of sa.len() bytes; the fd is open.
    unsafe {
        assert_eq!(libc::bind(l.as_raw_fd(), sa.as_ptr(), sa.len()), 0);
        assert_eq!(libc::listen(l.as_raw_fd(), 0), 0);
    }
    let addr = super::local_addr(l.as_raw_fd()).unwrap();
    let mut fillers = Vec::new();
    loop {
        match StdStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => fillers.push(s),
            Err(_) => break,
        }
        assert!(fillers.len() < 16, "the accept queue never filled");
    }
    (l, addr, fillers)
}

#[test]
fn a_connect_to_a_listener_that_drops_syns_times_out_on_both_drivers() {
    let (_l, addr, _fillers) = syn_dropping_listener();
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let before = d.slots_in_use();
            let t = Instant::now();
            let r = Sock::connect(&d, addr, Duration::from_millis(300)).await;
            let took = t.elapsed();
            let e = r
                .err()
                .unwrap_or_else(|| panic!("{kind:?}: connected after {took:?}"));
            assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{kind:?}: {e}");
            assert!(
                took >= Duration::from_millis(280) && took < Duration::from_secs(2),
                "{kind:?}: timed out after {took:?}"
            );
            until(&d, "the slot to be freed", || d.slots_in_use() == before).await;
        });
    }
}

#[test]
fn expiry_visits_the_expired_waits_not_every_socket() {
    let d = Driver::new(&Options::new(Kind::Epoll)).unwrap();
    const N: u32 = 10_000;
    const DUE: u32 = 10;
    let cx = Context::from_waker(Waker::noop());
    let now = Instant::now();
    {
        let mut st = d.st.borrow_mut();
        for t in 0..N {
            st.slots.push(super::Slot {
                in_use: true,
                fd: -1,
                ..Default::default()
            });
            // Every 1000th socket's read is due in 1 ms, the rest in an hour.
            let at = if t % (N / DUE) == 0 {
                now + Duration::from_millis(1)
            } else {
                now + Duration::from_secs(3600)
            };
            st.wait_side(t, RD, &cx, Some(at), now).unwrap();
        }
    }
    assert_eq!(d.expire(now), 0, "nothing is due yet");
    assert_eq!(d.stats.deadline_visits.get(), 0, "an idle expiry did work");
    let fired = d.expire(now + Duration::from_millis(2));
    assert_eq!(fired, DUE as usize);
    let visits = d.stats.deadline_visits.get();
    assert!(
        visits <= DUE as u64,
        "{visits} entries visited to expire {DUE} of {N}"
    );
    assert_eq!(d.next_wake(), Some(now + Duration::from_secs(3600)));
    // Waits that ended early leave stale entries; they are skipped once
    // due, and compacted away long before they could pile up.
    {
        let mut st = d.st.borrow_mut();
        for round in 0..20u32 {
            for t in 0..N {
                let at = now + Duration::from_secs(7200 + round as u64);
                // (The ten that timed out report it once, then wait again.)
                let _ = st.wait_side(t, RD, &cx, Some(at), now);
            }
        }
        assert!(
            st.deadlines.len() < 4 * N as usize,
            "{} entries",
            st.deadlines.len()
        );
    }
    let mut st = d.st.borrow_mut();
    st.slots.iter_mut().for_each(|s| s.in_use = false);
}

#[test]
fn a_buffer_the_kernel_cannot_map_is_an_error_not_a_panic() {
    // More address space than any process gets: mmap says ENOMEM.
    let e = super::Buf::try_new(usize::MAX / 2)
        .err()
        .expect("an impossible mapping succeeded");
    assert_eq!(e.raw_os_error(), Some(libc::ENOMEM), "{e}");
    let mut b = super::Buf::try_new(4096).unwrap();
    b[4095] = 1;
    assert_eq!(b.len(), 4096);
}

/// A reply written in pieces that each fit an inline send while the peer
/// reads slowly: some inline sends come back short inside the park that
/// counted them, and the rest still goes out without any other event (the
/// park's backstop), on both drivers. Before the backstop the shard slept
/// until an unrelated event (none comes here) with bytes unsent.
#[test]
fn short_inline_sends_finish_without_another_event() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let (s, mut peer) = pair(&d).await;
            // A small send buffer makes inline sends come back short.
            let small: libc::c_int = 4096;
            // SAFETY: setsockopt on an open socket with a c_int option.
            unsafe {
                libc::setsockopt(
                    s.fd(),
                    libc::SOL_SOCKET,
                    libc::SO_SNDBUF,
                    (&small as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
            let total = 8 * 16 * 1024;
            let reader = std::thread::spawn(move || {
                let mut got = 0;
                let mut b = [0u8; 1024];
                while got < total {
                    match peer.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                }
                got
            });
            let piece = vec![9u8; 16 * 1024];
            let done = d
                .timeout(Duration::from_secs(20), async {
                    for _ in 0..8 {
                        s.write_all(&piece).await.unwrap();
                    }
                })
                .await;
            assert!(done.is_some(), "{kind:?}: the writes stalled");
            for _ in 0..2000 {
                if reader.is_finished() {
                    break;
                }
                d.sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(reader.join().unwrap(), total, "{kind:?}");
        });
    }
}

/// Send chunks idle in the ring's pool (0 on epoll).
fn chunks_idle(d: &Driver) -> usize {
    match &d.backend {
        Backend::Uring(r) => r.chunks_idle(),
        Backend::Epoll(_) => 0,
    }
}

/// Sets `SO_SNDBUF` (or `SO_RCVBUF`) of `fd` to `bytes`.
fn set_buf(fd: std::os::fd::RawFd, opt: libc::c_int, bytes: libc::c_int) {
    // SAFETY: fd is an open socket; the option value is an int.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setsockopt: {}", std::io::Error::last_os_error());
}

/// A buffer handed over with `write_all_owned` reaches the peer whole and
/// byte-exact through the short sends of small socket buffers (on the ring
/// the driver sends on from where the kernel stopped), and the buffer
/// itself, not a copy, comes back to the send-buffer pool; a dropped owned
/// send leaves the buffer with the driver until its cancel completes, and
/// the shard goes on.
#[test]
fn an_owned_send_goes_out_whole_through_short_sends_and_its_buffer_comes_back() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let (a, peer) = pair(&d).await;
            set_buf(a.fd(), libc::SO_SNDBUF, 16 << 10);
            let mut buf = super::take_send_buffer();
            buf.extend((0..200_000u32).map(|i| (i * 7 % 251) as u8));
            let want = buf.clone();
            let ptr = buf.as_ptr();
            let (tx, rx) = mpsc::channel();
            let reader = std::thread::spawn(move || {
                let mut peer = peer;
                let mut got = vec![0u8; want.len()];
                peer.read_exact(&mut got).unwrap();
                tx.send(got == want).unwrap();
                peer
            });
            let waited = d.stats.sends_waited.get();
            let chunks = chunks_idle(&d);
            let r = d
                .timeout(Duration::from_secs(10), a.write_all_owned(buf))
                .await;
            assert!(matches!(r, Some(Ok(()))), "{kind:?}: {r:?}");
            assert!(rx.recv().unwrap(), "{kind:?}: the bytes differ");
            let peer = reader.join().unwrap();
            if kind == Kind::Uring {
                assert!(
                    d.stats.sends_waited.get() > waited,
                    "no short send: the test did not reach the send-on path"
                );
                until(&d, "the send's completion", || ops_in_flight(&d) == 0).await;
                assert_eq!(chunks_idle(&d), chunks, "a send chunk was used: a copy");
            }
            let back = super::take_send_buffer();
            assert_eq!(back.as_ptr(), ptr, "{kind:?}: not the buffer handed over");
            // Dropped while the peer does not read: the shard goes on, and
            // the buffer stays with the driver until the cancel completes.
            let mut big = back;
            big.resize(1 << 20, 9);
            let mut w = Box::pin(a.write_all_owned(big));
            let pending = futures_lite::future::poll_once(w.as_mut()).await.is_none();
            assert!(pending, "{kind:?}: 1 MiB fitted in the socket's buffers");
            drop(w);
            until(&d, "the dropped send to complete", || {
                ops_in_flight(&d) == 0
            })
            .await;
            drop(a);
            drop(peer);
        });
    }
}
