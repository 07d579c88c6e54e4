//! The admin listener (shard 0 only): `GET /metrics` in the Prometheus text format and `GET /health`.

use std::cell::RefCell;
use std::rc::Rc;

use zgix_parser::{RequestHead, Status};

use crate::conn::shard::Shard;
use crate::io::{Listener, Sock};
use crate::observe::metrics::TableGauges;

/// Accepts admin connections until `stop` closes (the drain, or the admin
/// socket replaced); each is answered from the shard state `shard` holds
/// when it arrives (a reload swaps it).
pub async fn serve(
    shard: Rc<RefCell<Rc<Shard>>>,
    stop: Rc<glommio::sync::Semaphore>,
    listener: Listener,
) {
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            let _ = stop.acquire(1).await;
            None
        })
        .await;
        match accepted {
            None => return,
            Some(Ok((s, _peer))) => {
                let current = shard.borrow().clone();
                glommio::spawn_local(handle(current, s)).detach();
            }
            Some(Err(_)) => {
                let driver = shard.borrow().driver.clone();
                driver.sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

async fn handle(shard: Rc<Shard>, s: Sock) {
    s.set_read_timeout(Some(shard.rt.timeouts.client_header));
    s.set_write_timeout(Some(shard.rt.timeouts.client_idle));
    let mut buf = vec![0u8; 8192];
    let mut head = RequestHead::new(&shard.rt.request_limits);
    let mut end = 0;
    loop {
        match s.read(&mut buf[end..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => end += n,
        }
        match shard.req_parser.parse(&buf[..end], &mut head) {
            Ok(Status::Complete(())) => break,
            Ok(Status::Partial) if end < buf.len() => continue,
            _ => {
                let _ = s
                    .write_all(&response(400, "text/plain", "bad request\n"))
                    .await;
                return;
            }
        }
    }
    let path = head.canonical_path.as_slice();
    let reply = match path {
        b"/metrics" => {
            let rt = &shard.rt;
            let now = zgix_admission::monotonic_now_ns();
            let gauges = TableGauges {
                rate_in_use: rt.rate_table.in_use(now),
                rate_capacity: rt.rate_table.capacity(),
                conn_in_use: rt.conn_table.in_use(),
                conn_capacity: rt.conn_table.capacity(),
            };
            let names = crate::observe::metrics::Labels {
                listeners: rt.listeners.iter().map(|l| l.name.as_str()).collect(),
                clusters: rt.up.clusters.iter().map(|c| c.name.as_str()).collect(),
                tls: rt
                    .listeners
                    .iter()
                    .map(|l| l.tls.as_ref().map(|t| t.expiry.as_slice()))
                    .collect(),
            };
            let mut body =
                rt.metrics.render(&names, &gauges) + &crate::upstream::render::render(&rt.up);
            crate::process::lifecycle::render(&mut body);
            crate::fleet::render(&mut body);
            response(200, "text/plain; version=0.0.4; charset=utf-8", &body)
        }
        b"/health" => response(200, "text/plain", "ok\n"),
        _ => response(404, "text/plain", "not found\n"),
    };
    let _ = s.write_all(&reply).await;
}

fn response(status: u16, ctype: &str, body: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\n",
        crate::http::respond::reason(status)
    )
    .into_bytes();
    crate::http::respond::write_stamp(&mut out, false, false);
    out.extend_from_slice(
        format!(
            "content-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    out
}
