//! The admin API end to end: `/ready` and `/live` (and the admin socket answering through the drain), the status page and `/status.json` with numbers that move (parsed, and rendered by headless chromium), process metrics (promtool-clean) and counters that survive a reload.

mod support;

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::browser::chromium_dom;
use support::*;

/// GET `path` on zgix's admin socket.
pub fn admin_get(z: &Zgix, path: &str) -> Response {
    let mut c = Client::connect(z.admin.expect("admin configured"));
    c.request(format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes())
}

/// `/status.json`, parsed.
fn status(z: &Zgix) -> serde_json::Value {
    let r = admin_get(z, "/status.json");
    assert_eq!(r.status, 200, "{}", r.show());
    assert_eq!(r.field("content-type"), Some("application/json"));
    serde_json::from_slice(&r.body).expect("status.json is JSON")
}

/// Polls `cond` until it holds, for at most 10 s.
#[track_caller]
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn ready_and_live_answer_and_the_admin_socket_stays_up_through_the_drain() {
    // An endpoint that never answers keeps one request in flight, so the
    // drain lasts until its deadline.
    let hang = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hang_addr = hang.local_addr().unwrap();
    let mut z = Zgix::start_json(&format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0"}},
            "listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
            "clusters":{{"api":{{"endpoints":["{hang_addr}"]}}}},
            "limits":{{"drain_timeout_ms":4000,"upstream_header_timeout_ms":8000}}}}"#
    ));
    let r = admin_get(&z, "/ready");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"ready\n"[..]),
        "{}",
        r.show()
    );
    assert_eq!(admin_get(&z, "/live").status, 200);
    assert_eq!(series(&metrics_text(&z), "zgix_ready"), 1.0);
    let mut stuck = Client::connect(z.addr());
    stuck.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n");
    let (_held, _) = hang.accept().unwrap();
    z.signal("TERM");
    // The drain has begun: /ready says so, the gauges are scrapeable.
    wait_until("/ready to answer 503", || {
        admin_get(&z, "/ready").status == 503
    });
    let r = admin_get(&z, "/ready");
    assert_eq!(r.body, b"draining\n");
    let m = metrics_text(&z);
    assert_eq!(series(&m, "zgix_draining"), 1.0, "{m}");
    assert_eq!(series(&m, "zgix_ready"), 0.0);
    assert_eq!(admin_get(&z, "/live").status, 200);
    let status = z
        .wait_exit(Duration::from_secs(10))
        .expect("exits after the drain");
    assert_eq!(status.code(), Some(3), "the drain deadline cut the request");
}

#[test]
fn status_json_and_page_show_traffic_and_chromium_renders_live_numbers() {
    let origin = Origin::start();
    let z = Zgix::start(&Config::new(&[origin.addr()]).cpus(&[0]).admin());
    let before = status(&z);
    assert_eq!(before["generation"], 1);
    assert_eq!(before["ready"], true);
    let l0 = &before["listeners"][0];
    assert_eq!(l0["requests"], 0, "{before:#}");
    let ep = &before["clusters"][0]["endpoints"][0];
    assert_eq!(ep["endpoint"], origin.addr().to_string());
    assert_eq!(ep["health"], "up");
    assert_eq!(ep["state"], "enabled");
    assert_eq!(ep["p50_ms"], serde_json::Value::Null);
    let mut c = Client::connect(z.addr());
    for _ in 0..25 {
        assert_eq!(c.get("/").status, 200);
    }
    let refused = raw_request(z.addr(), b"GET / HTTP/1.1\r\n\r\n");
    assert!(refused.starts_with(b"HTTP/1.1 400"), "no Host: 400");
    let after = status(&z);
    let l0 = &after["listeners"][0];
    assert_eq!(l0["requests"], 26, "{after:#}");
    assert_eq!(l0["status"]["2xx"], 25);
    assert_eq!(l0["status"]["4xx"], 1);
    assert!(l0["requests_per_s"].as_f64().unwrap() > 0.0, "{after:#}");
    let ep = &after["clusters"][0]["endpoints"][0];
    assert_eq!(ep["requests"], 25);
    assert!(ep["p50_ms"].as_f64().unwrap() > 0.0, "{after:#}");
    assert!(ep["p99_ms"].as_f64().unwrap() >= ep["p50_ms"].as_f64().unwrap());
    assert!(after["tables"]["conn_limit"]["capacity"].as_u64().unwrap() > 0);
    // The page: plain HTML that refreshes itself, with the same numbers.
    let page = admin_get(&z, "/status");
    assert_eq!(page.status, 200);
    assert_eq!(page.field("content-type"), Some("text/html; charset=utf-8"));
    let html = String::from_utf8(page.body).unwrap();
    assert!(
        html.contains("<meta http-equiv=\"refresh\" content=\"5\">"),
        "{html}"
    );
    assert!(
        !html.contains("<script") && !html.contains("src=\"http"),
        "no script, no external asset"
    );
    assert!(html.contains("<td class=\"requests\">26</td>"), "{html}");
    // A real browser renders it (Debian's chromium, headless).
    let dom = chromium_dom(&format!("http://{}/status", z.admin.unwrap()), &[]);
    assert!(dom.contains("<td class=\"requests\">26</td>"), "{dom}");
    assert!(dom.contains(&origin.addr().to_string()), "{dom}");
    assert!(dom.contains("<b id=\"generation\">1</b>"), "{dom}");
    for _ in 0..4 {
        assert_eq!(c.get("/").status, 200);
    }
    let dom = chromium_dom(&format!("http://{}/status", z.admin.unwrap()), &[]);
    assert!(
        dom.contains("<td class=\"requests\">30</td>"),
        "numbers move: {dom}"
    );
}

#[test]
fn process_metrics_are_promtool_clean_and_counters_survive_a_reload() {
    let origin = Origin::start();
    // A dead first endpoint: every request it gets is retried on the live one.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let json = format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0"}},
            "listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
            "clusters":{{"api":{{"endpoints":["{dead}","{}"]}}}}}}"#,
        origin.addr()
    );
    let z = Zgix::start_json(&json);
    let mut c = Client::connect(z.addr());
    for _ in 0..10 {
        assert_eq!(c.get("/").status, 200);
    }
    let m = metrics_text(&z);
    // CPU time counts in clock ticks (10 ms): a short test may not have one yet.
    assert!(series(&m, "process_cpu_seconds_total") >= 0.0);
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "zgix_max_connections",
    ] {
        assert!(series(&m, name) > 0.0, "{name} in\n{m}");
    }
    let start = series(&m, "process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        start <= now + 1.0 && start > now - 600.0,
        "{start} vs {now}"
    );
    assert!(series(&m, "process_max_fds") >= series(&m, "process_open_fds"));
    promtool_check(&m);
    let retries = "zgix_upstream_retries_total{reason=\"connect\"}";
    assert!(series(&m, retries) >= 1.0, "{m}");
    // Reload the same file: no counter goes back.
    z.signal("HUP");
    wait_until("the reload", || z.stderr().contains("reload applied"));
    let after = metrics_text(&z);
    assert_eq!(series(&after, "zgix_config_generation"), 2.0);
    let mut compared = 0;
    for line in m.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, v)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = key.split('{').next().unwrap();
        if !(name.ends_with("_total") || name.ends_with("_count") || name.ends_with("_bucket")) {
            continue;
        }
        let Some(now) = after
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        else {
            continue;
        };
        let (was, now): (f64, f64) = (v.parse().unwrap(), now.parse().unwrap());
        assert!(now >= was, "{key} went from {was} to {now} on reload");
        compared += 1;
    }
    assert!(compared > 100, "only {compared} counters compared");
    assert!(series(&after, retries) >= 1.0);
    promtool_check(&after);
}

fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
