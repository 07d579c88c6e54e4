//! An upgraded connection (the origin answered `101 Switching Protocols`): bytes relayed both ways until either side closes or the tunnel idles past `limits.tunnel_idle_timeout_ms`.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures_lite::future::zip;

use super::bulk::{lane, plain, plain_up, relay, Progress, RelayEnd};
use super::client::Stream;
use super::{is_timeout, Conn, Exchange, Next};
use crate::io::{Buf, Sock};
use crate::observe::counter::Counter;
use crate::upstream::conn::UpConn;

/// One direction of a tunnel: reads `from`, writes `to`; on EOF half-closes
/// `to`. A read that times out ends the direction only if the other one was
/// idle too (the tunnel's idle timeout counts both directions).
async fn pump(
    from: &impl Stream,
    to: &impl Stream,
    buf: &mut [u8],
    pending: usize,
    last: &Cell<Instant>,
    idle: std::time::Duration,
    bytes: &Counter,
) {
    if pending > 0 {
        if to.write_all(&buf[..pending]).await.is_err() {
            return;
        }
        bytes.add(pending as u64);
    }
    from.set_read_timeout(Some(idle));
    to.set_write_timeout(Some(idle));
    loop {
        match from.read(buf).await {
            Ok(0) => break,
            Ok(n) => {
                last.set(from.now());
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                bytes.add(n as u64);
            }
            Err(e) if is_timeout(&e) => {
                if from.now().duration_since(last.get()) < idle {
                    continue;
                }
                break;
            }
            Err(_) => break,
        }
    }
    to.close_write().await;
}

/// One direction of a plaintext tunnel on the bulk path (`bulk.rs`: spliced
/// on epoll, received buffers sent as they are on the ring, where a splice
/// cut by the idle timeout could lose bytes), with the same idle rule as
/// [`pump`].
async fn pump_bulk(
    from: &Sock,
    to: &Sock,
    buf: &mut [u8],
    pending: usize,
    last: &Cell<Instant>,
    idle: std::time::Duration,
    bytes: &Counter,
) {
    if pending > 0 {
        if to.write_all(&buf[..pending]).await.is_err() {
            return;
        }
        bytes.add(pending as u64);
    }
    from.set_read_timeout(Some(idle));
    to.set_write_timeout(Some(idle));
    // Never spliced on the ring: the multishot receive, not one buffer a turn.
    from.receive_one(false);
    let progress = Progress {
        last: Some(last),
        bytes: Some(bytes),
    };
    loop {
        match relay(from, to, None, buf, &progress, lane(from, false)).await {
            Err(RelayEnd::Src(e)) if is_timeout(&e) => {
                if from.now().duration_since(last.get()) < idle {
                    continue;
                }
                break;
            }
            _ => break,
        }
    }
    to.shutdown_write();
}

impl Conn {
    /// Relays the client and `up` until the tunnel ends; the connection then closes.
    pub(super) async fn tunnel(&mut self, x: &mut Exchange, up: UpConn) -> Next {
        let shard = self.shard.clone();
        let e = &shard.counters.engine;
        e.tunnels_opened.inc();
        e.tunnels_active.fetch_add(1, Ordering::Relaxed);
        let idle = std::time::Duration::from_millis(shard.rt.config.limits.tunnel_idle_timeout_ms);
        // Bytes either side sent after its head belong to the tunnel.
        let up_pending = x.cl.drain_to_front();
        let down_pending = x.uend - x.ustart;
        x.ubuf.copy_within(x.ustart..x.uend, 0);
        let (cbuf, ubuf): (&mut [u8], &mut Buf) = (x.cl.scratch(), &mut x.ubuf);
        let last = Cell::new(shard.driver.now());
        if let (Some(c), Some(u)) = (plain(&self.client), plain_up(&up)) {
            zip(
                pump_bulk(
                    c,
                    u,
                    &mut cbuf[..],
                    up_pending,
                    &last,
                    idle,
                    &e.tunnel_bytes_up,
                ),
                pump_bulk(
                    u,
                    c,
                    &mut ubuf[..],
                    down_pending,
                    &last,
                    idle,
                    &e.tunnel_bytes_down,
                ),
            )
            .await;
            e.tunnels_active.fetch_sub(1, Ordering::Relaxed);
            return Next::Close;
        }
        zip(
            pump(
                &self.client,
                &up,
                cbuf,
                up_pending,
                &last,
                idle,
                &e.tunnel_bytes_up,
            ),
            pump(
                &up,
                &self.client,
                &mut ubuf[..],
                down_pending,
                &last,
                idle,
                &e.tunnel_bytes_down,
            ),
        )
        .await;
        e.tunnels_active.fetch_sub(1, Ordering::Relaxed);
        Next::Close
    }
}

impl Stream for UpConn {
    async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        UpConn::read(self, buf).await
    }
    async fn write_all(&self, buf: &[u8]) -> std::io::Result<()> {
        UpConn::write_all(self, buf).await
    }
    fn set_read_timeout(&self, d: Option<std::time::Duration>) {
        UpConn::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<std::time::Duration>) {
        UpConn::set_write_timeout(self, d)
    }
    async fn close_write(&self) {
        self.shutdown().await
    }
    fn now(&self) -> Instant {
        self.driver().now()
    }
}
