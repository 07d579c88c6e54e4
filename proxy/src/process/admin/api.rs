//! Routing of admin requests, the POST authorisation (`admin.token`, or a loopback `admin.bind`) and the endpoint state changes.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::{AcqRel, Acquire};

use zgix_parser::{BodyKind, Method, RequestHead};

use super::Reply;
use crate::conn::shard::Shard;
use crate::observe::metrics::TableGauges;
use crate::process::lifecycle::LIFECYCLE;
use crate::upstream::health::admin::{self as admin_state, Refusal};
use crate::upstream::health::AdminState;

/// The answer to one admin request.
pub(super) fn route(shard: &Shard, head: &RequestHead, buf: &[u8], peer: SocketAddr) -> Reply {
    let path = std::str::from_utf8(&head.canonical_path).unwrap_or("");
    if let Some(rest) = path.strip_prefix("/endpoints/") {
        if head.method != Method::Post {
            return not_allowed("POST");
        }
        return post_endpoint(shard, head, buf, rest, peer);
    }
    let get = matches!(head.method, Method::Get | Method::Head);
    let reply = match path {
        "/metrics" => metrics(shard),
        "/health" | "/live" => Reply::text(200, "ok\n"),
        "/ready" => ready(),
        "/status" => super::status::html(shard),
        "/status.json" => super::status::json(shard),
        _ => return Reply::text(404, "not found\n"),
    };
    if !get {
        return not_allowed("GET, HEAD");
    }
    if head.method == Method::Head {
        // RFC 9110 §9.3.2: the same fields, no content (the length stays).
        return Reply {
            omit_body: true,
            ..reply
        };
    }
    reply
}

fn not_allowed(allow: &str) -> Reply {
    Reply {
        extra: format!("allow: {allow}\r\n"),
        ..Reply::text(405, "method not allowed\n")
    }
}

/// 200 once every shard accepts on its first generation and until the drain
/// starts, else 503: what an L4 balancer in front polls.
fn ready() -> Reply {
    if LIFECYCLE.draining.load(Acquire) {
        Reply::text(503, "draining\n")
    } else if !LIFECYCLE.ready.load(Acquire) {
        Reply::text(503, "starting\n")
    } else {
        Reply::text(200, "ready\n")
    }
}

fn metrics(shard: &Shard) -> Reply {
    let rt = &shard.rt;
    let now = zgix_admission::monotonic_now_ns();
    let gauges = TableGauges {
        rate_in_use: rt.rate_table.in_use(now),
        rate_capacity: rt.rate_table.capacity(),
        conn_in_use: rt.conn_table.in_use(),
        conn_capacity: rt.conn_table.capacity(),
        max_connections: rt.max_connections,
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
    let mut body = rt.metrics.render(&names, &gauges) + &crate::upstream::render::render(&rt.up);
    crate::process::lifecycle::render(&mut body);
    crate::fleet::render(&mut body);
    Reply {
        ctype: "text/plain; version=0.0.4; charset=utf-8",
        ..Reply::text(200, body)
    }
}

/// Equal in time that depends on `given`'s length only, not on where the
/// first difference is.
fn constant_time_eq(given: &[u8], want: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != want.len());
    for (i, &b) in given.iter().enumerate() {
        diff |= b ^ want.get(i).copied().unwrap_or(!b);
    }
    diff == 0
}

/// Whether a POST may change anything: `None` when it may, else the refusal.
fn authorise(shard: &Shard, head: &RequestHead, buf: &[u8]) -> Option<Reply> {
    let admin = shard.rt.config.admin.as_ref()?;
    match &admin.token {
        Some(token) => {
            let given = head
                .headers
                .iter()
                .find(|h| h.name.get(buf).eq_ignore_ascii_case(b"authorization"))
                .map(|h| h.value.get(buf))
                .unwrap_or(b"");
            // RFC 6750 §2.1: `Bearer <token>`, the scheme case-insensitive (RFC 9110 §11.1).
            let ok = given.len() > 7
                && given[..7].eq_ignore_ascii_case(b"bearer ")
                && constant_time_eq(&given[7..], token.as_bytes());
            if ok {
                return None;
            }
            LIFECYCLE.admin_refused[0].fetch_add(1, AcqRel);
            Some(Reply {
                extra: "www-authenticate: Bearer realm=\"zgix-admin\"\r\n".into(),
                ..Reply::text(
                    401,
                    "unauthorized: POST needs Authorization: Bearer <admin.token>\n",
                )
            })
        }
        None if admin.bind.ip().is_loopback() => None,
        None => {
            LIFECYCLE.admin_refused[1].fetch_add(1, AcqRel);
            Some(Reply::text(
                403,
                "forbidden: admin.bind is not a loopback address and admin.token is not set\n",
            ))
        }
    }
}

/// `POST /endpoints/{cluster}/{endpoint}/{drain|disable|enable}`.
fn post_endpoint(
    shard: &Shard,
    head: &RequestHead,
    buf: &[u8],
    rest: &str,
    peer: SocketAddr,
) -> Reply {
    if let Some(refusal) = authorise(shard, head, buf) {
        return refusal;
    }
    if !matches!(head.body, BodyKind::None | BodyKind::Length(0)) {
        return Reply::text(413, "the admin API takes no request body\n");
    }
    let parsed = rest.rsplit_once('/').and_then(|(ce, action)| {
        let (c, e) = ce.split_once('/')?;
        Some((percent_decode(c)?, percent_decode(e)?, action))
    });
    let Some((cluster, endpoint, action)) = parsed else {
        return Reply::text(
            404,
            "not found: POST /endpoints/{cluster}/{endpoint}/{drain|disable|enable}\n",
        );
    };
    let Some(to) = AdminState::from_action(action) else {
        return Reply::text(
            404,
            format!("not found: no action {action:?}; use drain, disable or enable\n"),
        );
    };
    let up = &shard.rt.up;
    match admin_state::set(up, &cluster, &endpoint, to) {
        Ok((_, before)) => {
            LIFECYCLE.endpoint_changes[to as usize].fetch_add(1, AcqRel);
            crate::log_info!(
                "admin",
                "clusters.{cluster} endpoint {endpoint}: {} -> {} (POST from {peer})",
                before.as_str(),
                to.as_str()
            );
            let body = serde_json::json!({
                "cluster": cluster,
                "endpoint": endpoint,
                "state": to.as_str(),
                "previous": before.as_str(),
            });
            Reply {
                ctype: "application/json",
                ..Reply::text(200, format!("{body}\n"))
            }
        }
        Err(Refusal::NoCluster) => Reply::text(404, format!("no cluster {cluster:?}\n")),
        Err(Refusal::NoEndpoint) => Reply::text(
            404,
            format!("cluster {cluster:?} has no endpoint {endpoint:?} (use the address as configured)\n"),
        ),
        Err(Refusal::LastInService) => Reply::text(
            409,
            format!("{endpoint} is the last endpoint of cluster {cluster:?} in service; enable another first\n"),
        ),
    }
}

/// `%XX` escapes decoded (an IPv6 endpoint's brackets, a name's colon);
/// `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_compare_and_percent_decoding() {
        assert!(constant_time_eq(b"abcdef0123456789", b"abcdef0123456789"));
        assert!(!constant_time_eq(b"abcdef0123456788", b"abcdef0123456789"));
        assert!(!constant_time_eq(b"abcdef012345678", b"abcdef0123456789"));
        assert!(!constant_time_eq(b"abcdef01234567890", b"abcdef0123456789"));
        assert!(!constant_time_eq(b"", b"a"));
        assert_eq!(
            percent_decode("%5B%3A%3A1%5D:80").as_deref(),
            Some("[::1]:80")
        );
        assert_eq!(
            percent_decode("127.0.0.1:9000").as_deref(),
            Some("127.0.0.1:9000")
        );
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
    }
}
