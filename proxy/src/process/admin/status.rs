//! The status page (`GET /status`, one HTML page that the browser reloads every 5 s, no script, no external asset) and the same data as `GET /status.json`.
//!
//! Rates (requests/s) are over the time since the previous status request
//! (of either form) on this process, or since the start for the first one:
//! each answer says the window (`rate_window_s`).

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use serde_json::{json, Value};

use super::Reply;
use crate::conn::shard::Shard;
use crate::observe::metrics::{Admission, STATUS_CODES};
use crate::process::lifecycle::LIFECYCLE;
use crate::upstream::health::now_ms;

/// Seconds between the browser's reloads of the page.
const REFRESH_S: u32 = 5;

/// A sample of the request counts: when, and each listener's by name.
type Sample = (Instant, Vec<(String, u64)>);

thread_local! {
    /// The previous sample.
    static LAST: RefCell<Option<Sample>> = const { RefCell::new(None) };
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Everything the page shows, as JSON.
pub(super) fn collect(shard: &Shard) -> Value {
    let rt = &shard.rt;
    let m = &rt.metrics;
    let now = Instant::now();
    let uptime = (unix_now() - m.start_time).max(0.0);
    let sum = |f: &dyn Fn(&crate::observe::metrics::ShardCounters) -> u64| -> u64 {
        m.shards.iter().map(|s| f(s)).sum()
    };
    let mut counts = Vec::new();
    let listeners: Vec<Value> = rt
        .listeners
        .iter()
        .enumerate()
        .map(|(li, l)| {
            let code = |c: u16| sum(&|s| s.listeners[li].codes[(c - STATUS_CODES.start()) as usize].get());
            let mut classes = [0u64; 5];
            for c in STATUS_CODES {
                classes[(c / 100 - 1) as usize] += code(c);
            }
            let requests: u64 = classes.iter().sum();
            counts.push((l.name.clone(), requests));
            let refusals: serde_json::Map<String, Value> = Admission::ALL
                .iter()
                .map(|a| {
                    let n = sum(&|s| s.listeners[li].admission[*a as usize].get());
                    (a.label().to_string(), json!(n))
                })
                .collect();
            json!({
                "name": l.name,
                "bind": l.bind.to_string(),
                "open_connections": m.shards.iter().map(|s| s.listeners[li].open.get()).sum::<i64>(),
                "requests": requests,
                "status": {"1xx": classes[0], "2xx": classes[1], "3xx": classes[2], "4xx": classes[3], "5xx": classes[4]},
                "admission_refusals": refusals,
            })
        })
        .collect();
    let (window, rates) = LAST.with(|last| {
        let mut last = last.borrow_mut();
        let (window, rates) = match last.as_ref() {
            Some((at, prev)) => {
                let w = now.duration_since(*at).as_secs_f64().max(0.001);
                let r: Vec<f64> = counts
                    .iter()
                    .map(|(n, c)| {
                        let before = prev.iter().find(|(p, _)| p == n).map_or(0, |p| p.1);
                        c.saturating_sub(before) as f64 / w
                    })
                    .collect();
                (w, r)
            }
            None => {
                let w = uptime.max(0.001);
                (w, counts.iter().map(|(_, c)| *c as f64 / w).collect())
            }
        };
        *last = Some((now, counts));
        (window, rates)
    });
    let listeners: Vec<Value> = listeners
        .into_iter()
        .zip(rates)
        .map(|(mut l, r)| {
            l["requests_per_s"] = json!((r * 10.0).round() / 10.0);
            l
        })
        .collect();
    json!({
        "generation": LIFECYCLE.generation.load(Relaxed),
        "uptime_s": uptime.floor(),
        "ready": LIFECYCLE.ready.load(Relaxed) && !LIFECYCLE.draining.load(Relaxed),
        "draining": LIFECYCLE.draining.load(Relaxed),
        "shards": m.shards.len(),
        "driver": rt.io_driver_name(),
        "rate_window_s": (window * 10.0).round() / 10.0,
        "connections": {
            "open": sum(&|s| s.active_connections.load(Relaxed).max(0) as u64),
            "max": rt.max_connections,
        },
        "tables": {
            "rate_limit": {"in_use": rt.rate_table.in_use(zgix_admission::monotonic_now_ns()), "capacity": rt.rate_table.capacity()},
            "conn_limit": {"in_use": rt.conn_table.in_use(), "capacity": rt.conn_table.capacity()},
        },
        "listeners": listeners,
        "clusters": clusters(shard),
    })
}

fn clusters(shard: &Shard) -> Vec<Value> {
    let up = &shard.rt.up;
    let stats = &up.upstream_stats;
    let now = now_ms();
    let ms = |s: Option<f64>| {
        s.map(|v| {
            if v.is_finite() {
                json!(v * 1000.0)
            } else {
                json!(">10000")
            }
        })
    };
    up.clusters
        .iter()
        .map(|c| {
            let endpoints: Vec<Value> = c
                .endpoints
                .iter()
                .map(|&ep| {
                    let u = &up.upstreams[ep];
                    json!({
                        "endpoint": u.label,
                        "address": u.addr.get().map(|a| a.to_string()),
                        "health": u.health.health_label(now),
                        "state": u.health.admin_state().as_str(),
                        "in_flight": stats.sum(ep, |s| u64::from(s.in_flight())),
                        "requests": stats.sum(ep, |s| s.requests.get()),
                        "ejections": u.health.ejections(),
                        "p50_ms": ms(stats.ttfb_quantile(ep, 0.5)),
                        "p99_ms": ms(stats.ttfb_quantile(ep, 0.99)),
                    })
                })
                .collect();
            json!({
                "name": c.name,
                "lb": match c.lb {
                    zgix_config::Lb::RoundRobin => "round_robin",
                    zgix_config::Lb::LeastConn => "least_conn",
                    zgix_config::Lb::SourceIp => "source_ip",
                },
                "panic": c.health.in_panic(),
                "endpoints": endpoints,
            })
        })
        .collect()
}

/// `GET /status.json`.
pub(super) fn json(shard: &Shard) -> Reply {
    Reply {
        ctype: "application/json",
        ..Reply::text(200, format!("{:#}\n", collect(shard)))
    }
}

/// HTML-escapes `s` (text and attribute values alike).
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// A JSON scalar as table-cell text.
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => esc(s),
        Value::Null => "-".into(),
        v => esc(&v.to_string()),
    }
}

/// `GET /status`.
pub(super) fn html(shard: &Shard) -> Reply {
    let d = collect(shard);
    let mut o = String::with_capacity(8192);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_S}\">\
         <title>zgix status</title><style>\
         body{{font:14px system-ui,sans-serif;margin:1.5em;color:#222}}\
         table{{border-collapse:collapse;margin:.5em 0 1.5em}}\
         th,td{{border:1px solid #ccc;padding:.25em .6em;text-align:right}}\
         th{{background:#f0f0f0}} td.l,th.l{{text-align:left}}\
         .up{{color:#070}} .bad{{color:#b00;font-weight:bold}} .warn{{color:#a60}}\
         </style></head><body>\n<h1>zgix</h1>\n<p id=\"summary\">generation <b id=\"generation\">{}</b> · up <b id=\"uptime\">{}</b> s · {} shard(s) on {} · connections <b id=\"connections\">{}</b> of {} · <span class=\"{}\" id=\"ready\">{}</span> · rates over the last {} s · refreshed every {REFRESH_S} s</p>\n",
        d["generation"],
        d["uptime_s"],
        d["shards"],
        cell(&d["driver"]),
        d["connections"]["open"],
        d["connections"]["max"],
        if d["ready"] == json!(true) { "up" } else { "bad" },
        if d["draining"] == json!(true) { "draining" } else if d["ready"] == json!(true) { "ready" } else { "starting" },
        d["rate_window_s"],
    );
    o.push_str("<h2>Listeners</h2>\n<table id=\"listeners\"><tr><th class=\"l\">listener</th><th class=\"l\">bind</th><th>open</th><th>requests</th><th>req/s</th><th>1xx</th><th>2xx</th><th>3xx</th><th>4xx</th><th>5xx</th><th class=\"l\">admission refusals</th></tr>\n");
    for l in d["listeners"].as_array().into_iter().flatten() {
        let refusals: Vec<String> = l["admission_refusals"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{} {}", esc(k), v))
            .collect();
        let _ = writeln!(
            o,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td class=\"requests\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
            cell(&l["name"]),
            cell(&l["bind"]),
            l["open_connections"],
            l["requests"],
            l["requests_per_s"],
            l["status"]["1xx"],
            l["status"]["2xx"],
            l["status"]["3xx"],
            l["status"]["4xx"],
            l["status"]["5xx"],
            refusals.join(", "),
        );
    }
    o.push_str("</table>\n<h2>Clusters</h2>\n");
    for c in d["clusters"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "<h3>{} <small>({}{})</small></h3>\n<table class=\"cluster\"><tr><th class=\"l\">endpoint</th><th class=\"l\">address</th><th class=\"l\">health</th><th class=\"l\">state</th><th>in flight</th><th>requests</th><th>ejections</th><th>p50 ms</th><th>p99 ms</th></tr>",
            cell(&c["name"]),
            cell(&c["lb"]),
            if c["panic"] == json!(true) { ", <span class=\"bad\">panic mode</span>" } else { "" },
        );
        for e in c["endpoints"].as_array().into_iter().flatten() {
            let health = e["health"].as_str().unwrap_or("");
            let state = e["state"].as_str().unwrap_or("");
            let _ = writeln!(
                o,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l {}\">{}</td><td class=\"l {}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                cell(&e["endpoint"]),
                cell(&e["address"]),
                if health == "up" { "up" } else { "bad" },
                esc(health),
                if state == "enabled" { "up" } else { "warn" },
                esc(state),
                e["in_flight"],
                e["requests"],
                e["ejections"],
                cell(&e["p50_ms"]),
                cell(&e["p99_ms"]),
            );
        }
        o.push_str("</table>\n");
    }
    let t = &d["tables"];
    let _ = write!(
        o,
        "<h2>Admission tables</h2>\n<table id=\"tables\"><tr><th class=\"l\">table</th><th>in use</th><th>capacity</th></tr>\n\
         <tr><td class=\"l\">rate_limit</td><td>{}</td><td>{}</td></tr>\n\
         <tr><td class=\"l\">conn_limit</td><td>{}</td><td>{}</td></tr>\n</table>\n\
         <p><a href=\"/status.json\">status.json</a> · <a href=\"/metrics\">metrics</a></p>\n</body></html>\n",
        t["rate_limit"]["in_use"],
        t["rate_limit"]["capacity"],
        t["conn_limit"]["in_use"],
        t["conn_limit"]["capacity"],
    );
    Reply {
        ctype: "text/html; charset=utf-8",
        ..Reply::text(200, o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_escapes_every_special_character() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(cell(&Value::Null), "-");
        assert_eq!(cell(&json!("<b>")), "&lt;b&gt;");
    }
}
