//! The access log through the request path: one line per request with its status and decision, in both formats; a full buffer drops and counts lines without slowing or failing requests.

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::*;

/// A fresh log path for this test process.
fn log_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("zgix-access-{tag}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// One zgix with every kind of answer reachable: listener 0 (`edge`) has a
/// connection limit of 1, the WAF, a redirect filter and a route to a dead
/// cluster; listener 1 (`rated`) a rate limit with a burst of 1.
fn start(origin: &Origin, path: &Path, format: &str) -> Zgix {
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    Zgix::start_json(&format!(
        r#"{{"cpus":[0],"access_log":{{"path":"{}","format":"{format}"}},
"listeners":[
 {{"bind":"127.0.0.1:0","name":"edge","http":{{"cluster":"api","conn_limit":{{"max":1}},
   "waf":{{"deny":["evil"],"status":403}},
   "request_filters":[
     {{"name":"to-new","match":{{"path":{{"prefix":"/redir"}}}},"action":{{"redirect":{{"status":301,"location":"/new"}}}}}},
     {{"match":{{"path":{{"prefix":"/dead"}}}},"action":{{"route":{{"cluster":"dead"}}}}}}]}}}},
 {{"bind":"127.0.0.1:0","name":"rated","http":{{"cluster":"api","rate_limit":{{"requests":1,"window_ms":3600000,"burst":1}}}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}},"dead":{{"endpoints":["{dead}"],"retries":0}}}}}}"#,
        path.display(),
        origin.addr()
    ))
}

/// Sends the traffic; returns the (status, decision) each line must carry, in order.
fn traffic(z: &Zgix) -> Vec<(u16, &'static str)> {
    let edge = z.listeners[0];
    let rated = z.listeners[1];
    let mut held = Client::connect(edge);
    assert_eq!(held.get("/").status, 200);
    let mut c = Client::connect(edge);
    assert_eq!(c.get("/").status, 503);
    assert_eq!(held.get("/redir/x").status, 301);
    assert_eq!(held.get("/dead/x").status, 502);
    drop(held);
    // The 502 closed the held connection; wait until its slot is free.
    let deadline = Instant::now() + IO_TIMEOUT;
    let waf = loop {
        let mut c = Client::connect(edge);
        let r = c.get("/evil");
        if r.status != 503 || Instant::now() > deadline {
            break r.status;
        }
    };
    assert_eq!(waf, 403);
    let mut bad = Client::connect(edge);
    let r = bad.request(b"GET / HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n");
    assert_eq!(r.status, 400);
    let mut r1 = Client::connect(rated);
    assert_eq!(r1.get("/").status, 200);
    let _ = r1.try_send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r1.read_response().status, 429);
    vec![
        (200, "forwarded"),
        (503, "conn_limited"),
        (301, "filter:to-new"),
        (502, "upstream_error:connect_refused"),
        (403, "waf"),
        (400, "bad_request:malformed"),
        (200, "forwarded"),
        (429, "rate_limited"),
    ]
}

#[test]
fn every_answer_is_one_json_line_with_its_status_and_decision() {
    let origin = Origin::start();
    let path = log_path("json");
    let z = start(&origin, &path, "json");
    let want = traffic(&z);
    // 503s retried while the slot was freeing are logged too: skip them.
    let got: Vec<serde_json::Value> = wait_json(&path, want.len());
    // Every answer counts the bytes it read: the refusals too (their head is
    // never consumed, the connection closes with it).
    for v in &got {
        assert!(v["bytes_in"].as_u64().unwrap() > 0, "{v}");
    }
    let by = |d: &str| got.iter().find(|v| v["decision"] == d).unwrap();
    assert_eq!(
        by("rate_limited")["bytes_in"],
        27,
        "GET / HTTP/1.1, Host: t"
    );
    // The same request as the first (GET /) but for its path.
    let head = by("forwarded")["bytes_in"].as_u64().unwrap() - 1;
    for (d, p) in [
        ("waf", "/evil"),
        ("upstream_error:connect_refused", "/dead/x"),
        ("conn_limited", "/"),
    ] {
        assert_eq!(by(d)["bytes_in"], head + p.len() as u64, "{d}");
    }
    // A head refused after its request line parsed still shows the line.
    let bad = by("bad_request:malformed");
    assert_eq!(
        (&bad["method"], &bad["path"], &bad["version"]),
        (&"GET".into(), &"/".into(), &"HTTP/1.1".into())
    );
    let got: Vec<(u16, String)> = got
        .iter()
        .map(|v| {
            (
                v["status"].as_u64().unwrap() as u16,
                v["decision"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let got = dedup_retry_503s(got);
    let want: Vec<(u16, String)> = want.into_iter().map(|(s, d)| (s, d.to_string())).collect();
    assert_eq!(got, want);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn every_answer_is_one_text_line_with_its_status_and_decision() {
    let origin = Origin::start();
    let path = log_path("text");
    let z = start(&origin, &path, "text");
    let want = traffic(&z);
    let deadline = Instant::now() + IO_TIMEOUT;
    let got = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let got: Vec<(u16, String)> = text.lines().map(text_status_decision).collect();
        let got = dedup_retry_503s(got);
        if got.len() >= want.len() || Instant::now() > deadline {
            break got;
        }
        std::thread::yield_now();
    };
    let want: Vec<(u16, String)> = want.into_iter().map(|(s, d)| (s, d.to_string())).collect();
    assert_eq!(got, want);
    let _ = std::fs::remove_file(&path);
}

/// Status and decision of a text line: `... "METHOD PATH VERSION" STATUS ... "DECISION"`.
fn text_status_decision(line: &str) -> (u16, String) {
    let decision = line.rsplit('"').nth(1).unwrap_or("").to_string();
    let after_request = line.split("\" ").find_map(|part| {
        let code = part.split(' ').next()?;
        (code.len() == 3)
            .then(|| code.parse::<u16>().ok())
            .flatten()
    });
    (after_request.unwrap_or(0), decision)
}

/// The WAF request may first meet the connection limit again (the held
/// connection's slot frees asynchronously): fold extra 503s after the first.
fn dedup_retry_503s(v: Vec<(u16, String)>) -> Vec<(u16, String)> {
    let mut out: Vec<(u16, String)> = Vec::new();
    for e in v {
        if e.0 == 503 && out.iter().any(|o| o.0 == 503) && out.iter().any(|o| o.0 == 502) {
            continue;
        }
        out.push(e);
    }
    out
}

fn wait_json(path: &Path, at_least: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let v: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        let useful = dedup_retry_503s(
            v.iter()
                .map(|x| (x["status"].as_u64().unwrap_or(0) as u16, String::new()))
                .collect(),
        )
        .len();
        if useful >= at_least || Instant::now() > deadline {
            return v;
        }
        std::thread::yield_now();
    }
}

#[test]
fn a_full_log_buffer_drops_and_counts_lines_and_never_fails_a_request() {
    let origin = Origin::start();
    let path = log_path("tiny");
    let z = Zgix::start_json(&format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0"}},"access_log":{{"path":"{}","buffer_bytes":512}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        path.display(),
        origin.addr()
    ));
    // 8 clients back to back: far more lines per flush than 512 bytes hold.
    let addr = z.addr();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for _ in 0..500 {
                    assert_eq!(c.get("/").status, 200);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let m = metrics_text(&z);
    let dropped = series(&m, "zgix_access_log_dropped_total");
    let written = series(&m, "zgix_access_log_lines_total");
    assert!(dropped > 0.0, "no line dropped:\n{m}");
    assert_eq!(dropped + written, 4000.0, "{m}");
    let _ = std::fs::remove_file(&path);
}

/// A zgix logging `fields` in `format` to `path`, forwarding to `origin`.
fn start_fields(origin: &Origin, path: &Path, format: &str, fields: &str) -> Zgix {
    Zgix::start_json(&format!(
        r#"{{"cpus":[0],"access_log":{{"path":"{}","format":"{format}","fields":{fields}}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        path.display(),
        origin.addr()
    ))
}

const FIELDS: &str = r#"["status","host","user_agent","header:X-Tenant","referer","request","upstream_status","protocol"]"#;
const FIELDS_REQUEST: &[u8] =
    b"GET /f?q=1 HTTP/1.1\r\nHost: api.example\r\nUser-Agent: t/1 \"q\"\r\nX-Tenant: acme\r\n\r\n";

#[test]
fn chosen_fields_come_in_order_with_captured_headers_in_both_formats() {
    let origin = Origin::start();
    let path = log_path("fields-json");
    let z = start_fields(&origin, &path, "json", FIELDS);
    let mut c = Client::connect(z.addr());
    assert_eq!(c.request(FIELDS_REQUEST).status, 200);
    // A second request without the headers: nothing left from the first.
    assert_eq!(c.request(b"GET /g HTTP/1.1\r\nHost: b\r\n\r\n").status, 200);
    let v = wait_json(&path, 2);
    // The keys in the configured order (serde_json's map sorts them).
    let raw = std::fs::read_to_string(&path).unwrap();
    let first = raw.lines().next().unwrap();
    let keys = [
        "status",
        "host",
        "user_agent",
        "header:x-tenant",
        "referer",
        "request",
        "upstream_status",
        "protocol",
    ];
    let at: Vec<usize> = keys
        .iter()
        .map(|k| first.find(&format!("\"{k}\":")).unwrap())
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{first}");
    assert_eq!(
        v[0],
        serde_json::json!({"status": 200, "host": "api.example", "user_agent": "t/1 \"q\"",
            "header:x-tenant": "acme", "referer": null, "request": "GET /f?q=1 HTTP/1.1",
            "upstream_status": 200, "protocol": "HTTP/1.1"})
    );
    assert_eq!(v[1]["host"], "b");
    assert_eq!(v[1]["user_agent"], serde_json::Value::Null);
    assert_eq!(v[1]["header:x-tenant"], serde_json::Value::Null);
    let _ = std::fs::remove_file(&path);
    drop(z);

    let path = log_path("fields-text");
    let z = start_fields(&origin, &path, "text", FIELDS);
    let mut c = Client::connect(z.addr());
    assert_eq!(c.request(FIELDS_REQUEST).status, 200);
    let text = wait_lines(&path, 1);
    assert_eq!(
        text,
        "200 \"api.example\" \"t/1 \\\"q\\\"\" \"acme\" - \"GET /f?q=1 HTTP/1.1\" 200 \"HTTP/1.1\"\n"
    );
    let _ = std::fs::remove_file(&path);
}

/// The file's text once it holds `n` lines (or at the deadline).
fn wait_lines(path: &Path, n: usize) -> String {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= n || Instant::now() > deadline {
            return text;
        }
        std::thread::yield_now();
    }
}

#[test]
fn a_bad_field_list_is_refused_with_its_paths() {
    let config = TempConfig::new(
        r#"{"cpus":[0],"access_log":{"path":"-","fields":["status","nope","header:a b","status"]},
"listeners":[{"bind":"127.0.0.1:0","http":{"cluster":"api"}}],
"clusters":{"api":{"endpoints":["127.0.0.1:1"]}}}"#,
    );
    let run = run_zgix(&["--check", "--config", &config.path.display().to_string()]);
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    let out = run.stderr;
    assert!(
        out.contains("access_log.fields[1]: unknown field \"nope\""),
        "{out}"
    );
    assert!(
        out.contains("access_log.fields[2]: \"header:a b\": a header name is"),
        "{out}"
    );
    assert!(
        out.contains("access_log.fields[3]: \"status\" is already at access_log.fields[0]"),
        "{out}"
    );
}

#[test]
fn refusals_of_a_head_whose_request_line_was_fine_log_that_line() {
    let origin = Origin::start();
    let path = log_path("refused-line");
    let z = Zgix::start_json(&format!(
        r#"{{"cpus":[0],"access_log":{{"path":"{}","format":"json"}},
"limits":{{"max_request_body":100,"max_header_bytes":8192}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        path.display(),
        origin.addr()
    ));
    let big = format!(
        "GET /h?x=1 HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "b".repeat(9000)
    );
    let cases: [(&[u8], u16); 4] = [
        (b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n", 413),
        (big.as_bytes(), 431),
        (b"POST /te HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"GET /x HTTP/1.1 extra\r\nHost: a\r\n\r\n", 400),
    ];
    for (req, status) in cases {
        let mut c = Client::connect(z.addr());
        assert_eq!(c.request(req).status, status);
    }
    let v = wait_json(&path, 4);
    let line = |i: usize| {
        let v: &serde_json::Value = &v[i];
        (
            v["status"].as_u64().unwrap(),
            v["method"].clone(),
            v["path"].clone(),
            v["query"].clone(),
            v["version"].clone(),
        )
    };
    use serde_json::Value::Null;
    assert_eq!(
        line(0),
        (413, "POST".into(), "/up".into(), Null, "HTTP/1.1".into())
    );
    assert_eq!(
        line(1),
        (
            431,
            "GET".into(),
            "/h".into(),
            "x=1".into(),
            "HTTP/1.1".into()
        )
    );
    assert_eq!(
        line(2),
        (400, "POST".into(), "/te".into(), Null, "HTTP/1.1".into())
    );
    assert_eq!(
        line(3),
        (400, Null, Null, Null, Null),
        "a bad request line stays -"
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn chosen_fields_with_captured_headers_allocate_nothing_per_request() {
    const REQUESTS: usize = 2000;
    let origin = Origin::start();
    let path = log_path("fields-alloc");
    let z = Zgix::start_json(&format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0"}},
"access_log":{{"path":"{}","format":"json","fields":["time","host","user_agent","header:x-tenant","request","status","upstream_ms"]}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}},"limits":{{"busy_poll_us":100000}}}}"#,
        path.display(),
        origin.addr()
    ));
    let request = |i: usize| {
        format!(
            "GET /a?i={i} HTTP/1.1\r\nHost: h{i}\r\nUser-Agent: ua/{i}\r\nX-Tenant: {}\r\n\r\n",
            "t".repeat(i % 1000)
        )
    };
    let mut client = Client::connect(z.addr());
    for i in 0..20 {
        assert_eq!(client.request(request(i).as_bytes()).status, 200);
    }
    let (busy, took) = allocation_window(&z, &mut client, REQUESTS, Duration::ZERO, request);
    let (idle, _) = allocation_window(&z, &mut client, 0, took, request);
    assert!(
        busy <= idle + REQUESTS as u64 / 20,
        "{REQUESTS} requests made {} more allocations than none ({busy} vs {idle})",
        busy.saturating_sub(idle)
    );
    // The admin scrapes are logged too (without captured headers).
    let want = format!("GET /a?i={} HTTP/1.1", REQUESTS - 1);
    let deadline = Instant::now() + IO_TIMEOUT;
    let last = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let found = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["request"] == want.as_str());
        match found {
            Some(v) => break v,
            None if Instant::now() > deadline => panic!("no line for {want}"),
            None => std::thread::yield_now(),
        }
    };
    assert_eq!(last["host"], format!("h{}", REQUESTS - 1));
    assert_eq!(last["user_agent"], format!("ua/{}", REQUESTS - 1));
    assert_eq!(
        last["header:x-tenant"].as_str().unwrap().len(),
        512,
        "capped"
    );
    let _ = std::fs::remove_file(&path);
}
