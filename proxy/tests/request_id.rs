//! Request IDs and `Forwarded` end to end: what the origin sees, what zgix's own answers carry and what the access log says, for `"generate"`, `"replace"` and `false`.

mod support;

use std::path::Path;
use std::time::Instant;

use support::*;

fn start(origin: &Origin, log: &Path, http_extra: &str) -> Zgix {
    Zgix::start_json(&format!(
        r#"{{"cpus":[0],"access_log":{{"path":"{}","format":"json"}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"{http_extra},
  "rate_limit":{{"requests":1,"window_ms":3600000,"burst":2}},
  "request_filters":[{{"match":{{"path":{{"prefix":"/deny"}}}},"action":{{"reject":{{"status":403}}}}}}]}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        log.display(),
        origin.addr()
    ))
}

/// The values of `name` in a head the origin recorded.
fn fields(head: &[u8], name: &str) -> Vec<String> {
    String::from_utf8_lossy(head)
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_string())
        .collect()
}

/// The access log's JSON lines, once there are `n`.
fn log_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let v: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if v.len() >= n {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} lines:\n{text}",
            v.len()
        );
        std::thread::yield_now();
    }
}

fn is_generated(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[test]
fn generate_keeps_a_good_client_id_names_the_rest_and_zgix_answers_carry_it() {
    let origin = Origin::start();
    let log = std::env::temp_dir().join(format!("zgix-rid-gen-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let z = start(&origin, &log, r#","request_id":"generate""#);
    let mut c = Client::connect(z.addr());
    // 1: no ID; 2: a good one kept; 3: a bad one (a space) replaced.
    assert_eq!(c.get("/a").status, 200);
    let r = c.request(b"GET /b HTTP/1.1\r\nHost: t\r\nX-Request-ID: trace-42\r\n\r\n");
    assert_eq!(r.status, 200);
    let seen = origin.wait_requests(2);
    let first = fields(&seen[0].head, "x-request-id");
    assert_eq!(first.len(), 1, "{}", String::from_utf8_lossy(&seen[0].head));
    assert!(is_generated(&first[0]), "{first:?}");
    assert_eq!(fields(&seen[1].head, "x-request-id"), ["trace-42"]);
    // The rate limit (burst 2) refuses the third: zgix's 429 carries a new ID.
    let r = c.request(b"GET /c HTTP/1.1\r\nHost: t\r\nX-Request-ID: has space\r\n\r\n");
    assert_eq!(r.status, 429);
    let refused = r
        .field("x-request-id")
        .expect("the 429 names its request")
        .to_string();
    assert!(is_generated(&refused), "{refused}");
    // A filter's own answer and a head that does not parse carry one too.
    let mut c = Client::connect(z.addr());
    let r = c.request(b"GET /deny HTTP/1.1\r\nHost: t\r\nX-Request-ID: mine\r\n\r\n");
    assert_eq!(
        r.status, 429,
        "the bucket is empty: refused before the filter"
    );
    let mut bad = Client::connect(z.addr());
    let r = bad.request(b"GET / HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n");
    assert_eq!(r.status, 400);
    let bad_id = r
        .field("x-request-id")
        .expect("a 400 names its request")
        .to_string();
    assert!(is_generated(&bad_id));
    // The log says the same IDs.
    let lines = log_lines(&log, 5);
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids[0], first[0]);
    assert_eq!(ids[1], "trace-42");
    assert_eq!(ids[2], refused);
    assert_eq!(ids[3], "mine");
    assert_eq!(ids[4], bad_id);
    let _ = std::fs::remove_file(&log);
}

#[test]
fn replace_and_off_and_forwarded() {
    let origin = Origin::start();
    let log = std::env::temp_dir().join(format!("zgix-rid-rep-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let z = start(&origin, &log, r#","request_id":"replace","forwarded":true"#);
    let mut c = Client::connect(z.addr());
    let r = c.request(b"GET /a HTTP/1.1\r\nHost: site.example\r\nX-Request-ID: trace-42\r\n\r\n");
    assert_eq!(r.status, 200);
    let seen = origin.wait_requests(1);
    let ids = fields(&seen[0].head, "x-request-id");
    assert_eq!(ids.len(), 1);
    assert!(is_generated(&ids[0]), "replaced: {ids:?}");
    assert_eq!(
        fields(&seen[0].head, "forwarded"),
        ["for=127.0.0.1;proto=http;host=site.example"]
    );
    // A filter's reject answer carries the ID.
    let r = c.request(b"GET /deny HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 403);
    assert!(
        r.field("x-request-id").is_some_and(is_generated),
        "{}",
        r.show()
    );
    drop(z);
    let _ = std::fs::remove_file(&log);

    let origin = Origin::start();
    let log = std::env::temp_dir().join(format!("zgix-rid-off-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let z = start(&origin, &log, r#","request_id":false"#);
    let mut c = Client::connect(z.addr());
    let r =
        c.request(b"GET /a HTTP/1.1\r\nHost: t\r\nX-Request-ID: a b\r\nx-request-id: two\r\n\r\n");
    assert_eq!(r.status, 200);
    let seen = origin.wait_requests(1);
    assert_eq!(
        fields(&seen[0].head, "x-request-id"),
        ["a b", "two"],
        "passed as sent"
    );
    assert!(fields(&seen[0].head, "forwarded").is_empty());
    let r = c.request(b"GET /deny HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 403);
    assert_eq!(r.field("x-request-id"), None);
    let lines = log_lines(&log, 2);
    assert!(lines.iter().all(|l| l["request_id"].is_null()), "{lines:?}");
    let _ = std::fs::remove_file(&log);
}
