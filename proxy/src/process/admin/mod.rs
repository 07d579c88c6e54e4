//! The admin listener (shard 0 only): `/metrics`, `/ready`, `/live`, `/health`, the status page and `/status.json`, and `POST /endpoints/...` to drain, disable or enable an endpoint.
//!
//! The admin socket is an edge like any listener: at most
//! `admin.max_connections` connections at once (more wait in the backlog),
//! the whole request head within `admin.header_timeout_ms` of the accept,
//! each read and write within `admin.idle_timeout_ms`, one request per
//! connection (`Connection: close`), and each request in the access log
//! (listener `admin`). It keeps serving through the drain, so a scrape
//! sees `zgix_draining 1` and `/ready` answers 503 until the process exits;
//! after a hand-off (`--upgrade`) the new process answers on it instead.

mod api;
mod status;

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use zgix_parser::{RequestHead, Status};

use crate::conn::shard::Shard;
use crate::io::{Listener, Sock};
use crate::observe::access_log::{Names, Record, Target};
use crate::observe::decision::Decision;

/// Longest admin request head: a request line and a few fields.
const MAX_HEAD_BYTES: usize = 8192;

/// The `Record::listener` of admin requests (no listener has it).
const ADMIN_LISTENER: usize = usize::MAX;

/// Accepts admin connections until `stop` closes (the admin socket replaced
/// or removed by a reload, or handed to a new process); each is answered
/// from the shard state `shard` holds when it arrives (a reload swaps it).
pub async fn serve(
    shard: Rc<RefCell<Rc<Shard>>>,
    stop: Rc<glommio::sync::Semaphore>,
    listener: Listener,
) {
    let open = Rc::new(Cell::new(0usize));
    let freed = Rc::new(glommio::sync::Semaphore::new(0));
    loop {
        let (max, driver) = {
            let s = shard.borrow();
            (admin_cfg(&s).0, s.driver.clone())
        };
        if open.get() >= max {
            // At the cap: take nothing off the backlog until one closes.
            listener.pause();
            let resumed = futures_lite::future::or(
                async {
                    let _ = freed.acquire(1).await;
                    true
                },
                async {
                    let _ = stop.acquire(1).await;
                    false
                },
            )
            .await;
            listener.resume();
            if !resumed {
                return;
            }
            continue;
        }
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            let _ = stop.acquire(1).await;
            None
        })
        .await;
        match accepted {
            None => return,
            Some(Ok((s, peer))) => {
                let current = shard.borrow().clone();
                open.set(open.get() + 1);
                let (open, freed) = (open.clone(), freed.clone());
                glommio::spawn_local(async move {
                    handle(current, s, peer).await;
                    open.set(open.get() - 1);
                    freed.signal(1);
                })
                .detach();
            }
            Some(Err(_)) => driver.sleep(Duration::from_millis(10)).await,
        }
    }
}

/// `(max_connections, header timeout, idle timeout)` of the admin config.
fn admin_cfg(shard: &Shard) -> (usize, Duration, Duration) {
    match &shard.rt.config.admin {
        Some(a) => (
            a.max_connections,
            Duration::from_millis(a.header_timeout_ms),
            Duration::from_millis(a.idle_timeout_ms),
        ),
        None => (
            zgix_config::DEFAULT_ADMIN_MAX_CONNECTIONS,
            Duration::from_millis(zgix_config::DEFAULT_ADMIN_HEADER_TIMEOUT_MS),
            Duration::from_millis(zgix_config::DEFAULT_ADMIN_IDLE_TIMEOUT_MS),
        ),
    }
}

/// One admin answer.
pub(crate) struct Reply {
    pub status: u16,
    pub ctype: &'static str,
    pub body: String,
    /// Extra header lines, each ending in CRLF.
    pub extra: String,
    /// A HEAD answer: the fields of the GET one (its length), no content.
    pub omit_body: bool,
}

impl Reply {
    pub(crate) fn text(status: u16, body: impl Into<String>) -> Reply {
        Reply {
            status,
            ctype: "text/plain; charset=utf-8",
            body: body.into(),
            extra: String::new(),
            omit_body: false,
        }
    }
}

async fn handle(shard: Rc<Shard>, s: Sock, peer: SocketAddr) {
    let (_, header_timeout, idle) = admin_cfg(&shard);
    s.set_read_timeout(Some(idle));
    s.set_write_timeout(Some(idle));
    let started = Instant::now();
    let mut record = Record::new(ADMIN_LISTENER, peer.ip(), peer);
    let mut buf = vec![0u8; MAX_HEAD_BYTES];
    let mut head = RequestHead::new(&shard.rt.request_limits);
    // RFC 9112 §2.2 leaves the wait for a head to the server: the whole
    // head within the header timeout, whatever pace the bytes come at.
    let read = shard
        .driver
        .timeout(header_timeout, read_head(&shard, &s, &mut buf, &mut head))
        .await;
    let (reply, end) = match read {
        None => (Reply::text(408, "request timeout\n"), 0),
        Some(Err(())) => return,
        Some(Ok(Err(end))) => (Reply::text(400, "bad request\n"), end),
        Some(Ok(Ok(end))) => (api::route(&shard, &head, &buf[..end], peer), end),
    };
    let parsed = end > 0 && matches!(reply.status, 200..=399 | 401..=405 | 409 | 413 | 503);
    let bytes = response(&reply);
    // One request a connection: it closes after the answer.
    s.closing();
    let written = s.write_all(&bytes).await.is_ok();
    if let Some(log) = &shard.access_log {
        record.status = reply.status;
        record.bytes_in = end as u64;
        record.bytes_out = if written { bytes.len() as u64 } else { 0 };
        record.duration_us = started.elapsed().as_micros() as u64;
        record.decision = match reply.status {
            400 => Decision::BadRequest(zgix_parser::ParseError::Malformed),
            408 => Decision::ClientTimeout,
            _ => Decision::Admin,
        };
        let target = if parsed {
            record.version = Some(head.version);
            Target {
                method: head.method_span.get(&buf),
                path: &head.canonical_path,
                query: head.query.map(|q| q.get(&buf)),
                sni: None,
            }
        } else {
            Target::default()
        };
        log.emit(&AdminNames(&shard), &record, &target);
    }
}

/// Reads until a whole head parsed: `Ok(Ok(len))`, `Ok(Err(len))` for a
/// head that does not parse (or does not fit), `Err` when the peer left.
async fn read_head(
    shard: &Shard,
    s: &Sock,
    buf: &mut [u8],
    head: &mut RequestHead,
) -> Result<Result<usize, usize>, ()> {
    let mut end = 0;
    loop {
        match s.read(&mut buf[end..]).await {
            Ok(0) | Err(_) => return Err(()),
            Ok(n) => end += n,
        }
        match shard.req_parser.parse(&buf[..end], head) {
            Ok(Status::Complete(())) => return Ok(Ok(end)),
            Ok(Status::Partial) if end < buf.len() => continue,
            _ => return Ok(Err(end)),
        }
    }
}

/// The access log's names for admin requests: the listener is `admin`.
struct AdminNames<'a>(&'a Shard);

impl Names for AdminNames<'_> {
    fn logs(&self, listener: usize) -> bool {
        listener == ADMIN_LISTENER && self.0.rt.config.access_log.is_some()
    }
    fn listener_name(&self, _: usize) -> Option<&str> {
        Some("admin")
    }
    fn filter_name(&self, _: usize, _: u16) -> Option<&str> {
        None
    }
    fn endpoint(&self, _: usize) -> Option<SocketAddr> {
        None
    }
}

fn response(r: &Reply) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        r.status,
        crate::http::respond::reason(r.status)
    )
    .into_bytes();
    crate::http::respond::write_stamp(&mut out, false, false);
    out.extend_from_slice(
        format!(
            "content-type: {}\r\ncontent-length: {}\r\ncache-control: no-store\r\n{}connection: close\r\n\r\n{}",
            r.ctype,
            r.body.len(),
            r.extra,
            if r.omit_body { "" } else { &r.body }
        )
        .as_bytes(),
    );
    out
}
