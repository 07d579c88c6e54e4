//! The admin API's writes and edges end to end: drain/disable/enable an endpoint (and the state across a reload), the bearer token and the loopback rule, the admin listener's timeouts, cap and access-log lines, lost access-log lines counted, and shards on the affinity mask (`taskset -c 1`).

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::*;

fn post(z: &Zgix, path: &str, auth: Option<&str>) -> Response {
    let mut c = Client::connect(z.admin.expect("admin configured"));
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    c.request(
        format!("POST {path} HTTP/1.1\r\nHost: admin\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
}

fn status(z: &Zgix) -> serde_json::Value {
    let mut c = Client::connect(z.admin.unwrap());
    let r = c.request(b"GET /status.json HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    serde_json::from_slice(&r.body).unwrap()
}

#[track_caller]
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Which origin answered each of `n` requests.
fn origins(z: &Zgix, n: usize) -> Vec<String> {
    let mut c = Client::connect(z.addr());
    (0..n)
        .map(|_| {
            let r = c.get("/");
            assert_eq!(r.status, 200, "{}", r.show());
            r.field("x-origin").unwrap_or("").to_string()
        })
        .collect()
}

#[test]
fn drain_disable_and_enable_steer_traffic_and_survive_a_reload() {
    let (a, b) = (Origin::named("a"), Origin::named("b"));
    let z = Zgix::start(&Config::new(&[a.addr(), b.addr()]).cpus(&[0]).admin());
    let seen = origins(&z, 4);
    assert!(
        seen.contains(&"a".into()) && seen.contains(&"b".into()),
        "{seen:?}"
    );
    let ea = a.addr().to_string();
    let r = post(&z, &format!("/endpoints/api/{ea}/drain"), None);
    assert_eq!(r.status, 200, "{}", r.show());
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["state"], "draining");
    assert_eq!(body["previous"], "enabled");
    assert!(
        origins(&z, 6).iter().all(|o| o == "b"),
        "drained: no new request to a"
    );
    assert_eq!(
        status(&z)["clusters"][0]["endpoints"][0]["state"],
        "draining"
    );
    // The last endpoint in service cannot be taken out.
    let eb = b.addr().to_string();
    let r = post(&z, &format!("/endpoints/api/{eb}/disable"), None);
    assert_eq!(r.status, 409, "{}", r.show());
    assert!(origins(&z, 2).iter().all(|o| o == "b"));
    // Precise refusals for what does not exist.
    assert_eq!(
        post(&z, "/endpoints/nope/1.2.3.4:1/drain", None).status,
        404
    );
    assert_eq!(post(&z, "/endpoints/api/1.2.3.4:1/drain", None).status, 404);
    assert_eq!(
        post(&z, &format!("/endpoints/api/{ea}/maint"), None).status,
        404
    );
    let mut c = Client::connect(z.admin.unwrap());
    let r =
        c.request(format!("GET /endpoints/api/{ea}/drain HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
    assert_eq!((r.status, r.field("allow")), (405, Some("POST")));
    // Enable a, disable b: everything goes to a.
    assert_eq!(
        post(&z, &format!("/endpoints/api/{ea}/enable"), None).status,
        200
    );
    assert_eq!(
        post(&z, &format!("/endpoints/api/{eb}/disable"), None).status,
        200
    );
    assert!(origins(&z, 6).iter().all(|o| o == "a"));
    // A reload keeps the operator's state.
    z.signal("HUP");
    wait_until("the reload", || z.stderr().contains("reload applied"));
    let s = status(&z);
    assert_eq!(s["generation"], 2);
    assert_eq!(s["clusters"][0]["endpoints"][1]["state"], "disabled");
    assert!(
        origins(&z, 6).iter().all(|o| o == "a"),
        "still disabled after the reload"
    );
    let m = metrics_text(&z);
    assert_eq!(
        series(&m, "zgix_admin_endpoint_changes_total{state=\"draining\"}"),
        1.0
    );
    assert_eq!(
        series(&m, "zgix_admin_endpoint_changes_total{state=\"disabled\"}"),
        1.0
    );
    assert_eq!(
        series(&m, "zgix_admin_endpoint_changes_total{state=\"enabled\"}"),
        1.0
    );
    let log = z.stderr();
    assert!(
        log.lines().any(
            |l| log_message(l).is_some_and(|(lvl, comp, msg)| lvl == "info"
                && comp == "admin"
                && msg.starts_with(&format!(
                    "clusters.api endpoint {eb}: enabled -> disabled (POST from 127.0.0.1:"
                )))
        ),
        "{log}"
    );
    assert_eq!(
        post(&z, &format!("/endpoints/api/{eb}/enable"), None).status,
        200
    );
    let seen = origins(&z, 4);
    assert!(seen.contains(&"b".into()), "enabled again: {seen:?}");
}

#[test]
fn posts_need_the_bearer_token_when_one_is_set() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    let token = "Zm9vYmFyLXRva2VuLTAxMjM0NTY3";
    let z = Zgix::start_json(&format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0","token":"{token}"}},
            "listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
            "clusters":{{"api":{{"endpoints":["{}","{}"]}}}}}}"#,
        a.addr(),
        b.addr()
    ));
    let path = format!("/endpoints/api/{}/drain", a.addr());
    let r = post(&z, &path, None);
    assert_eq!(r.status, 401, "{}", r.show());
    assert_eq!(
        r.field("www-authenticate"),
        Some("Bearer realm=\"zgix-admin\"")
    );
    assert_eq!(
        post(&z, &path, Some("Bearer Zm9vYmFyLXRva2VuLTAxMjM0NTY4")).status,
        401
    );
    assert_eq!(post(&z, &path, Some(&format!("Basic {token}"))).status, 401);
    assert_eq!(
        post(&z, &path, Some(&format!("Bearer {token}x"))).status,
        401
    );
    assert_eq!(
        status(&z)["clusters"][0]["endpoints"][0]["state"],
        "enabled"
    );
    assert_eq!(
        post(&z, &path, Some(&format!("bearer {token}"))).status,
        200
    );
    assert_eq!(
        status(&z)["clusters"][0]["endpoints"][0]["state"],
        "draining"
    );
    // GETs stay open.
    assert_eq!(
        series(&metrics_text(&z), "zgix_admin_refused_total{code=\"401\"}"),
        4.0
    );
}

#[test]
fn without_a_token_posts_are_refused_on_a_non_loopback_bind() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    // 0.0.0.0 is not a loopback address; the test reaches it over 127.0.0.1.
    let z = Zgix::start_json(&format!(
        r#"{{"cpus":[0],"admin":{{"bind":"0.0.0.0:0"}},
            "listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
            "clusters":{{"api":{{"endpoints":["{}","{}"]}}}}}}"#,
        a.addr(),
        b.addr()
    ));
    let port = z.admin.unwrap().port();
    let mut c = Client::connect(([127, 0, 0, 1], port).into());
    let r = c.request(
        format!(
            "POST /endpoints/api/{}/disable HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
            a.addr()
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 403, "{}", r.show());
    let mut c = Client::connect(([127, 0, 0, 1], port).into());
    let r = c.request(b"GET /ready HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(r.status, 200);
}

#[test]
fn the_admin_listener_times_out_slow_clients_caps_connections_and_logs_requests() {
    let origin = Origin::start();
    let dir = std::env::temp_dir().join(format!("zgix-admin-log-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let log = dir.join("access.log");
    let _ = std::fs::remove_file(&log);
    let z = Zgix::start_json(&format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0","max_connections":2,"header_timeout_ms":1500,"idle_timeout_ms":1000}},
            "listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
            "clusters":{{"api":{{"endpoints":["{}"]}}}},
            "access_log":{{"path":"{}","format":"json"}}}}"#,
        origin.addr(),
        log.display()
    ));
    let admin = z.admin.unwrap();
    // A slowloris: a byte every 300 ms is within the idle timeout each time,
    // but the whole head must come within 1.5 s.
    let started = Instant::now();
    let mut slow = Client::connect(admin);
    let mut answered = None;
    for b in b"GET /metrics HTTP/1.1\r\nHost: admin\r\n\r\n".iter() {
        if slow.try_send(&[*b]).is_err() {
            break;
        }
        let mut peek = [0u8; 1];
        slow.stream()
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        if let Ok(n) = slow.stream().peek(&mut peek) {
            answered = Some(n);
            break;
        }
    }
    let took = started.elapsed();
    assert!(answered.is_some(), "the slow client was not cut");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_millis(4000),
        "cut after {took:?}"
    );
    slow.stream()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let r = slow.read_response();
    assert_eq!(r.status, 408, "{}", r.show());
    // The cap: two silent connections hold both slots; a third waits in
    // the backlog and is answered only after they time out.
    let mut s1 = Client::connect(admin);
    let mut s2 = Client::connect(admin);
    let mut third = Client::connect(admin);
    let r = third.request(b"GET /live HTTP/1.1\r\nHost: admin\r\n\r\n");
    assert_eq!(r.status, 200);
    // Silent past the idle timeout: one of the two was closed (without an
    // answer) before the third connection was taken off the backlog; the
    // other, whose timer may come up a moment later, closes too.
    let closed = |s: &mut Client, wait: bool| {
        s.stream().set_nonblocking(!wait).unwrap();
        s.stream()
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 64];
        match s.stream().read(&mut b) {
            Ok(0) => true,
            Ok(_) => {
                assert!(b.starts_with(b"HTTP/1.1 408"), "{:?}", escape(&b));
                true
            }
            Err(_) => false,
        }
    };
    let first_closed = closed(&mut s1, false);
    let second_closed = closed(&mut s2, false);
    assert!(
        first_closed || second_closed,
        "the third connection was served while both held slots were open"
    );
    assert!(
        (first_closed || closed(&mut s1, true)) && (second_closed || closed(&mut s2, true)),
        "a held slot is still open 5 s after the third was served"
    );
    // Admin requests are in the access log, listener "admin".
    wait_until("the admin lines", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("\"/live\""))
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let line: serde_json::Value =
        serde_json::from_str(text.lines().find(|l| l.contains("\"/live\"")).unwrap()).unwrap();
    assert_eq!(line["listener"], "admin", "{line}");
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["decision"], "admin", "{line}");
    assert!(text.lines().any(|l| l.contains("\"status\":408")), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn access_log_lines_that_cannot_be_written_are_counted_as_dropped() {
    let origin = Origin::start();
    let z = Zgix::start_json(&format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0"}},
            "listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
            "clusters":{{"api":{{"endpoints":["{}"]}}}},
            "access_log":{{"path":"/dev/full"}}}}"#,
        origin.addr()
    ));
    let mut c = Client::connect(z.addr());
    for _ in 0..20 {
        assert_eq!(c.get("/").status, 200);
    }
    // Every write to /dev/full fails (ENOSPC): the lines are lost, and counted.
    wait_until("dropped lines", || {
        metric(&z, "zgix_access_log_dropped_total") >= 20.0
    });
    assert!(z.stderr().contains("cannot write /dev/full"));
}

/// A child process killed when dropped (a failed assertion leaves none behind).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts zgix under `taskset -c 1` and returns it with its stderr lines up to `ready`.
fn start_pinned(json: &str) -> (Killed, Vec<String>) {
    let config = TempConfig::new(&with_test_defaults(json));
    let mut child = Command::new("taskset")
        .args(["-c", "1", zgix_bin(), "--config"])
        .arg(&config.path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("taskset");
    let mut lines = Vec::new();
    let mut r = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap_or(0) == 0 || Instant::now() > deadline {
            let _ = child.kill();
            panic!("zgix under taskset did not get ready: {lines:?}");
        }
        let ready = l.contains(" ready (");
        lines.push(l);
        if ready {
            break;
        }
    }
    thread::spawn(move || for _ in r.lines() {});
    (Killed(child), lines)
}

#[test]
fn an_omitted_cpus_uses_the_affinity_mask_and_cpus_are_checked_against_it() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(cpus >= 2, "this test needs CPU 1");
    let origin = Origin::start();
    let json = |cpus: &str| {
        format!(
            r#"{{{cpus}"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
                "clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
            origin.addr()
        )
    };
    let (child, lines) = start_pinned(&json(""));
    assert!(
        lines.iter().any(|l| l.contains("ready (1 shards")),
        "{lines:?}"
    );
    let pid = child.0.id();
    let task = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .find(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("zgix-shard-0"))
        })
        .expect("a thread named zgix-shard-0-*");
    let st = std::fs::read_to_string(task.path().join("status")).unwrap();
    let allowed = st
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    assert_eq!(
        allowed.trim(),
        "1",
        "the shard runs on CPU 1, the mask's only CPU"
    );
    drop(child);
    // `"cpus": [1]` is what the mask allows; `[0]` is refused with its path.
    let (child, lines) = start_pinned(&json(r#""cpus":[1],"#));
    assert!(
        lines.iter().any(|l| l.contains("ready (1 shards")),
        "{lines:?}"
    );
    drop(child);
    let config = TempConfig::new(&json(r#""cpus":[0],"#));
    let out = Command::new("taskset")
        .args(["-c", "1", zgix_bin(), "--check", "--config"])
        .arg(&config.path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cpus[0]: CPU 0 is not in the process's affinity mask (CPUs 1)"),
        "{err}"
    );
}

#[test]
fn active_health_transitions_are_error_log_lines() {
    let origin = Origin::start();
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let z = Zgix::start_json(&format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0"}},
            "listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
            "clusters":{{"api":{{"endpoints":["{dead}","{}"],
                "health":{{"active":{{"path":"/","interval_ms":100,"timeout_ms":50,"unhealthy":2}}}}}}}}}}"#,
        origin.addr()
    ));
    let want = format!("clusters.api: {dead} failed 2 active checks (");
    wait_until("the down line", || z.stderr().contains(&want));
    let log = z.stderr();
    let line = log.lines().find(|l| l.contains(&want)).unwrap();
    let (level, component, msg) =
        log_message(line).unwrap_or_else(|| panic!("not in the log format: {line}"));
    // Issue 24 part 2: an endpoint taken out or brought back is an `info` line.
    assert_eq!((level, component), ("info", "upstream"), "{line}");
    assert!(msg.ends_with("); down"), "{line}");
    assert!(
        !log.lines().any(|l| l.starts_with("zgix: clusters.")),
        "no bare eprintln lines:\n{log}"
    );
    // Disabled by the operator: no more probes, so no more verdicts.
    let r = post(&z, &format!("/endpoints/api/{dead}/disable"), None);
    assert_eq!(r.status, 200);
    assert_eq!(status(&z)["clusters"][0]["endpoints"][0]["health"], "down");
}

#[test]
fn admin_methods_and_paths_get_precise_answers() {
    let origin = Origin::start();
    let z = Zgix::start(&Config::new(&[origin.addr()]).cpus(&[0]).admin());
    let admin = z.admin.unwrap();
    let raw = raw_request(admin, b"HEAD /ready HTTP/1.1\r\nHost: a\r\n\r\n");
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(
        text.contains("\r\ncontent-length: 6\r\n"),
        "the GET's length: {text}"
    );
    assert!(text.ends_with("\r\n\r\n"), "no content: {text}");
    let mut c = Client::connect(admin);
    let r = c.request(b"POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    assert_eq!((r.status, r.field("allow")), (405, Some("GET, HEAD")));
    let mut c = Client::connect(admin);
    assert_eq!(c.get("/nope").status, 404);
    let mut c = Client::connect(admin);
    let r = c.request(
        format!(
            "POST /endpoints/api/{}/drain HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{{}}",
            origin.addr()
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 413, "{}", r.show());
    let raw = raw_request(
        admin,
        b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    );
    assert!(raw.starts_with(b"HTTP/1.1 400 "), "{}", escape(&raw));
}
