//! End-to-end tests of what an operator observes: the error log's shape and level flag, `Date`/`Server` on zgix's own answers, names in metric labels, the access log file at start-up and SIGUSR1.

mod support;

use std::time::{Duration, Instant};

use support::*;

fn config(origin: &Origin, top: &str, listener_extra: &str) -> String {
    format!(
        r#"{{{top}"admin":{{"bind":"127.0.0.1:0"}},
"listeners":[{{"bind":"127.0.0.1:0"{listener_extra},"http":{{"cluster":"edge-api"}}}}],
"clusters":{{"edge-api":{{"endpoints":["{}"]}}}}}}"#,
        origin.addr()
    )
}

fn metrics(z: &Zgix) -> String {
    let mut c = Client::connect(z.admin.expect("admin"));
    let resp = c.request(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200, "{}", resp.show());
    // The admin endpoint's answers are zgix's own too.
    assert!(
        resp.field("date").is_some_and(is_imf_fixdate),
        "{}",
        resp.show()
    );
    assert_eq!(resp.field("server"), Some("zgix"));
    String::from_utf8(resp.body).unwrap()
}

#[test]
fn every_error_log_line_has_timestamp_level_and_component() {
    let origin = Origin::start();
    let mut z = Zgix::start_json(&config(&origin, "", ""));
    health_check(z.addr());
    z.signal("TERM");
    assert!(z
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    let log = z.stderr();
    assert!(log.lines().count() >= 4, "{log}");
    for line in log.lines() {
        let parsed = log_message(line);
        assert!(
            parsed.is_some(),
            "line without timestamp/level/component: {line:?}\n{log}"
        );
    }
    let messages: Vec<_> = log.lines().filter_map(log_message).collect();
    assert!(
        messages
            .iter()
            .any(|&(l, c, m)| (l, c) == ("info", "server") && m.starts_with("ready (")),
        "{log}"
    );
    assert!(messages.iter().any(|(_, _, m)| *m == "stopped"), "{log}");
}

#[test]
fn log_level_flag_is_checked() {
    let run = run_zgix(&["--log-level", "loud", "--config", "/nonexistent"]);
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("--log-level: \"loud\" is not error, warn, info or debug"),
        "{}",
        run.stderr
    );
    // With a valid level, a run-time config error is a log line at error level.
    let run = run_zgix(&["--log-level=warn", "--config", "/nonexistent/zgix.json"]);
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    let first = run.stderr.lines().next().unwrap_or("");
    let (level, component, msg) = log_message(first).unwrap_or_else(|| panic!("{first:?}"));
    assert_eq!((level, component), ("error", "config"));
    assert!(
        msg.starts_with("cannot read /nonexistent/zgix.json"),
        "{msg}"
    );
}

#[test]
fn zgix_answers_carry_date_and_server_and_server_can_be_turned_off() {
    let origin = Origin::start();
    let z = Zgix::start_json(&config(&origin, "", ""));
    // unstamped() checks date, then `server: zgix`.
    assert_refusal(
        z.addr(),
        b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        400,
        "Bad Request",
    );
    // Relayed answers are the origin's: zgix adds neither field.
    let resp = Client::connect(z.addr()).get("/");
    assert_eq!(resp.field("date"), None, "{}", resp.show());
    assert_eq!(resp.field("server"), None, "{}", resp.show());

    let z = Zgix::start_json(&config(&origin, r#""server_header":false,"#, ""));
    let raw = raw_request(
        z.addr(),
        b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    );
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.starts_with("HTTP/1.1 400 Bad Request\r\ndate: "),
        "{text}"
    );
    assert!(!text.to_ascii_lowercase().contains("\r\nserver:"), "{text}");

    let z = Zgix::start_json(&config(&origin, r#""server_header":"edge/2","#, ""));
    let raw = raw_request(z.addr(), b"GET / HTTP/1.1\r\n\r\n");
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("\r\nserver: edge/2\r\n"), "{text}");
}

#[test]
fn metric_labels_carry_listener_and_cluster_names_and_promtool_passes() {
    let origin = Origin::start();
    let z = Zgix::start_json(&config(&origin, "", r#","name":"public""#));
    health_check(z.addr());
    let want = "zgix_http_responses_total{listener=\"public\",code=\"200\"} 1";
    let deadline = Instant::now() + IO_TIMEOUT;
    let text = loop {
        let text = metrics(&z);
        if text.contains(want) || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(text.contains(want), "{text}");
    for series in [
        "zgix_connections_accepted_total{listener=\"public\"}",
        "zgix_connections_open{listener=\"public\"}",
        "zgix_upstream_duration_seconds_count{cluster=\"edge-api\"}",
        "zgix_cluster_upstream_errors_total{cluster=\"edge-api\",kind=\"reset\"} 0",
        "zgix_request_duration_seconds_sum{listener=\"public\",decision=\"waf\"} 0\n",
        "zgix_access_log_dropped_total 0",
        "zgix_build_info{version=\"",
        "process_start_time_seconds ",
    ] {
        assert!(text.contains(series), "no {series:?} in:\n{text}");
    }
    assert!(!text.contains(" -0\n"), "{text}");
    // The whole process's heap (mallinfo2): a running zgix holds its runtime,
    // tables and rings' bookkeeping, well over 100 KB, and well under 1 GB.
    let heap = support::series(&text, "zgix_heap_in_use_bytes");
    assert!((1e5..1e9).contains(&heap), "zgix_heap_in_use_bytes {heap}");
    let promtool = std::path::Path::new("/usr/bin/promtool");
    assert!(
        promtool.exists(),
        "/usr/bin/promtool is missing: run scripts/test.sh (it installs the `prometheus` package)"
    );
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}\n{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn access_log_file_is_opened_at_start_and_sigusr1_reopens_it() {
    let origin = Origin::start();
    let dir = std::env::temp_dir();
    let path = dir.join(format!("zgix-e2e-access-{}.log", std::process::id()));
    let rotated = path.with_extension("log.1");
    let _ = std::fs::remove_file(&path);
    let top = format!(
        r#""access_log":{{"path":"{}","format":"json"}},"#,
        path.display()
    );
    let z = Zgix::start_json(&config(&origin, &top, ""));
    assert!(path.exists(), "access log not created at start");
    std::fs::rename(&path, &rotated).unwrap();
    z.signal("USR1");
    // The writer reopens (creating the file again) and logs it.
    let deadline = Instant::now() + IO_TIMEOUT;
    while !path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        path.exists(),
        "SIGUSR1 did not reopen; stderr:\n{}",
        z.stderr()
    );
    health_check(z.addr());
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&rotated);

    // A path that cannot be opened stops start-up with the field's name.
    let cfg = TempConfig::new(&config(
        &origin,
        r#""access_log":{"path":"/nonexistent/dir/access.log"},"#,
        "",
    ));
    let run = run_zgix(&["--config", &cfg.path.display().to_string()]);
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("error server: access_log.path: cannot open /nonexistent/dir/access.log"),
        "{}",
        run.stderr
    );
}
