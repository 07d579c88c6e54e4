//! The driver's lend ([`super::Sock::read_lent`]) on real loopback sockets, both drivers: on the ring the received bytes are handed out where the kernel put them, what the caller leaves stays for the next read, used-up buffers go back to the ring, and EOF is reported; epoll lends nothing and says so.

use std::io::Write;
use std::time::Duration;

use super::tests::{kinds, on_driver, pair};
use super::{Kind, Lent, Options};

#[test]
fn a_lend_hands_out_received_bytes_in_place_and_keeps_what_was_not_consumed() {
    for kind in kinds() {
        on_driver(Options::new(kind), move |d| async move {
            let (s, mut peer) = pair(&d).await;
            s.set_read_timeout(Some(Duration::from_secs(5)));
            peer.write_all(b"hello world").unwrap();
            s.readable().await.unwrap();
            let mut seen = Vec::new();
            let r = s
                .read_lent(&mut |b| {
                    seen.extend_from_slice(b);
                    // A change past what is consumed shows whether the
                    // bytes were lent where they are, or a copy.
                    if b.len() > 5 {
                        b[5] = b'_';
                    }
                    5.min(b.len())
                })
                .await
                .unwrap();
            let mut rest = Vec::new();
            let mut buf = [0u8; 64];
            let want: &[u8] = match kind {
                Kind::Uring => {
                    assert_eq!(r, Lent::Bytes(5));
                    assert_eq!(seen, b"hello world", "one loopback write, one buffer");
                    assert_eq!(s.bytes_read(), 5, "only the consumed bytes count");
                    b"_world"
                }
                Kind::Epoll => {
                    assert_eq!(r, Lent::Copy, "epoll has no buffer of its own to lend");
                    assert!(seen.is_empty());
                    b"hello world"
                }
            };
            while rest.len() < want.len() {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "{kind:?}: EOF before the rest");
                rest.extend_from_slice(&buf[..n]);
            }
            assert_eq!(rest, want, "{kind:?}");
            assert_eq!(s.bytes_read(), 11, "{kind:?}");
            drop(peer);
            let end = s.read_lent(&mut |b| b.len()).await.unwrap();
            match kind {
                Kind::Uring => {
                    assert_eq!(end, Lent::Eof);
                    assert_eq!(d.buffers_held(), 0, "used-up buffers went back to the ring");
                }
                Kind::Epoll => {
                    assert_eq!(end, Lent::Copy);
                    assert_eq!(s.read(&mut buf).await.unwrap(), 0);
                }
            }
        });
    }
}
