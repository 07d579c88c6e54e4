//! End-to-end process and balancing behaviour: load balancing, pooled-connection retry, graceful drain, CLI.

mod support;

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

use support::{
    connect_from, health_check, run_zgix, Client, Config, Origin, Run, TempConfig, Zgix, OK_BODY,
};

/// Sends one `Connection: close` GET on `client` and returns the answering origin's name.
#[track_caller]
fn origin_of(mut client: Client) -> String {
    let resp = client.request(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert_eq!(resp.status, 200, "{}", resp.show());
    resp.field("x-origin")
        .unwrap_or_else(|| panic!("no x-origin in {}", resp.show()))
        .to_string()
}

#[test]
fn source_ip_sticks_to_one_origin_across_shards() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    let zgix = Zgix::start(
        &Config::new(&[a.addr(), b.addr()])
            .lb("source_ip")
            .cpus(&[0, 1]),
    );
    let SocketAddr::V4(dest) = zgix.addr() else {
        panic!("listener is not IPv4: {}", zgix.addr());
    };
    // Fresh connections get fresh source ports, so SO_REUSEPORT spreads them
    // over both shards; the pick must not depend on the shard.
    let first = origin_of(Client::connect(zgix.addr()));
    for i in 1..40 {
        assert_eq!(
            origin_of(Client::connect(zgix.addr())),
            first,
            "connection {i} from 127.0.0.1 went elsewhere"
        );
    }
    let mut seen = HashSet::from([first]);
    for last in 2..=17u8 {
        let source = Ipv4Addr::new(127, 0, 0, last);
        let open = || {
            Client::from_stream(
                connect_from(source, dest).unwrap_or_else(|e| panic!("connect from {source}: {e}")),
            )
        };
        let picked = origin_of(open());
        for i in 1..5 {
            assert_eq!(
                origin_of(open()),
                picked,
                "connection {i} from {source} went elsewhere"
            );
        }
        seen.insert(picked);
    }
    // 17 client addresses all hashing to one of two endpoints has probability
    // 2^-16 for a fair hash; seeing it means the hash ignores the address.
    assert_eq!(seen.len(), 2, "every client address went to {seen:?}");
}

#[test]
fn xff_carries_the_connection_source_address() {
    let a = Origin::named("a");
    let zgix = Zgix::start(&Config::new(&[a.addr()]).lb("source_ip"));
    let SocketAddr::V4(dest) = zgix.addr() else {
        panic!("listener is not IPv4");
    };
    let stream = connect_from(Ipv4Addr::new(127, 0, 0, 9), dest).expect("connect from 127.0.0.9");
    assert_eq!(origin_of(Client::from_stream(stream)), "a");
    support::assert_bytes(
        &a.only_request().head,
        b"GET / HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 127.0.0.9\r\nX-Forwarded-Proto: http\r\n\r\n",
    );
}

#[test]
fn round_robin_alternates_between_endpoints() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    let zgix = Zgix::start(&Config::new(&[a.addr(), b.addr()]).cpus(&[0]));
    let picks: Vec<String> = (0..10)
        .map(|_| origin_of(Client::connect(zgix.addr())))
        .collect();
    for pair in picks.windows(2) {
        assert_ne!(pair[0], pair[1], "not alternating: {picks:?}");
    }
    assert_eq!(a.requests().len(), 5, "{picks:?}");
    assert_eq!(b.requests().len(), 5, "{picks:?}");
}

#[test]
fn round_robin_on_one_keep_alive_connection() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    let zgix = Zgix::start(&Config::new(&[a.addr(), b.addr()]).cpus(&[0]));
    let mut client = Client::connect(zgix.addr());
    let picks: Vec<String> = (0..6)
        .map(|_| {
            let resp = client.get("/");
            assert_eq!(resp.status, 200, "{}", resp.show());
            resp.field("x-origin").unwrap_or("").to_string()
        })
        .collect();
    for pair in picks.windows(2) {
        assert_ne!(pair[0], pair[1], "not alternating: {picks:?}");
    }
    // Each origin saw one pooled connection.
    assert_eq!((a.accepted(), b.accepted()), (1, 1));
}

#[test]
fn retries_idempotent_request_once_when_pooled_connection_was_closed() {
    let origin = Origin::start();
    let zgix = Zgix::start(&Config::new(&[origin.addr()]).cpus(&[0]));
    let mut client = Client::connect(zgix.addr());
    // `/once` answers keep-alive, then the origin closes the socket silently.
    let resp = client.get("/once");
    assert_eq!(resp.status, 200, "{}", resp.show());
    assert_eq!(origin.accepted(), 1);
    // Let the origin's FIN reach zgix's pooled socket.
    thread::sleep(Duration::from_millis(100));
    let resp = client.get("/");
    assert_eq!(resp.status, 200, "{}", resp.show());
    support::assert_bytes(&resp.body, OK_BODY);
    assert_eq!(origin.accepted(), 2);
    assert_eq!(origin.requests().len(), 2);
    // And a third request on the same client connection reuses the fresh one.
    client.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    match client.try_read_response(false) {
        Ok(resp) => assert_eq!(resp.status, 200, "{}", resp.show()),
        Err(e) => panic!(
            "request after the retry failed: {e}; zgix stderr:\n{}",
            zgix.stderr()
        ),
    }
    assert_eq!(origin.accepted(), 2);
}

#[test]
fn sigterm_drains_in_flight_request_and_exits_zero() {
    const DRAIN_MS: u64 = 5000;
    let origin = Origin::start();
    let mut zgix = Zgix::start(&Config::new(&[origin.addr()]).limit("drain_timeout_ms", DRAIN_MS));
    let addr = zgix.addr();
    // An idle keep-alive connection must not hold the drain open past its timeout.
    let mut idle = Client::connect(addr);
    assert_eq!(idle.get("/").status, 200);
    let mut client = Client::connect(addr);
    client.send(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n");
    origin.wait_requests(2);
    zgix.signal("TERM");
    thread::sleep(Duration::from_millis(300));
    let late = TcpStream::connect_timeout(&addr, Duration::from_secs(2));
    assert!(
        late.is_err(),
        "a new connection was accepted 300 ms into the drain"
    );
    let resp = client.read_response();
    support::assert_bytes(
        &resp.raw,
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-origin: o\r\nConnection: close\r\n\r\nslow\n",
    );
    client.expect_closed();
    let status = zgix.wait_exit(Duration::from_millis(DRAIN_MS + 5000));
    let status = status.unwrap_or_else(|| {
        panic!(
            "zgix still running after the drain timeout; stderr:\n{}",
            zgix.stderr()
        )
    });
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        zgix.stderr()
    );
    idle.expect_closed();
}

#[test]
fn sigint_exits_zero() {
    let origin = Origin::start();
    let mut zgix = Zgix::start(&Config::new(&[origin.addr()]));
    health_check(zgix.addr());
    zgix.signal("INT");
    let status = zgix
        .wait_exit(Duration::from_secs(12))
        .unwrap_or_else(|| panic!("zgix ignored SIGINT; stderr:\n{}", zgix.stderr()));
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        zgix.stderr()
    );
}

fn check(json: &str) -> (Run, String) {
    let config = TempConfig::new(json);
    let path = config.path.display().to_string();
    (run_zgix(&["--check", "--config", &path]), path)
}

#[test]
fn check_accepts_a_valid_config() {
    let json = r#"{
        "cpus": [0, 1],
        "admin": {"bind": "127.0.0.1:0"},
        "listeners": [{"bind": "127.0.0.1:0", "http": {"cluster": "api"}}],
        "clusters": {
            "api": {"endpoints": ["127.0.0.1:9000", "127.0.0.1:9001"], "lb": "round_robin"},
            "sticky": {"endpoints": ["127.0.0.1:9002"], "lb": "source_ip"}
        },
        "limits": {
            "max_request_line": 8192, "max_header_bytes": 32768, "max_headers": 100,
            "max_request_body": 1073741824, "buffer_bytes": 16384,
            "client_header_timeout_ms": 10000, "client_idle_timeout_ms": 60000,
            "upstream_connect_timeout_ms": 3000, "upstream_header_timeout_ms": 30000,
            "upstream_idle_timeout_ms": 60000, "upstream_pool_idle_per_endpoint": 64,
            "drain_timeout_ms": 10000
        }
    }"#;
    let (run, path) = check(json);
    assert!(
        run.status.success(),
        "exit {}; stderr:\n{}",
        run.status,
        run.stderr
    );
    let expected = format!("zgix: configuration {path} is valid");
    assert!(
        run.stderr
            .lines()
            .chain(run.stdout.lines())
            .any(|l| l == expected),
        "no line {expected:?}; stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
}

#[test]
fn check_reports_every_error_with_its_path() {
    let json = r#"{
        "listeners": [{"bind": "127.0.0.1:0", "http": {"cluster": "apx"}}],
        "clusters": {"api": {"endpoints": [], "lb": "round_robin"}},
        "limits": {"buffer_bytes": 0, "upstream_header_timeout_ms": 0}
    }"#;
    let (run, _) = check(json);
    assert_eq!(run.status.code(), Some(1), "stderr:\n{}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert!(
        lines.contains(&r#"zgix: listeners[0].http.cluster: no cluster named "apx""#),
        "stderr:\n{}",
        run.stderr
    );
    for path in [
        "clusters.api.endpoints",
        "limits.buffer_bytes",
        "limits.upstream_header_timeout_ms",
    ] {
        let prefix = format!("zgix: {path}");
        assert!(
            lines.iter().any(|l| {
                l.strip_prefix(&prefix)
                    .and_then(|rest| rest.split_once(": "))
                    .is_some_and(|(_, rule)| !rule.is_empty())
            }),
            "no error line for {path}; stderr:\n{}",
            run.stderr
        );
    }
}

#[test]
fn check_rejects_unknown_fields() {
    let json = r#"{
        "listeners": [{"bind": "127.0.0.1:0", "http": {"cluster": "api"}}],
        "clusters": {"api": {"endpoints": ["127.0.0.1:9000"]}},
        "bogus_field": 1
    }"#;
    let (run, _) = check(json);
    assert_eq!(run.status.code(), Some(1), "stderr:\n{}", run.stderr);
    assert!(
        run.stderr
            .lines()
            .any(|l| l.starts_with("zgix: ") && l.contains("bogus_field")),
        "stderr:\n{}",
        run.stderr
    );
}

/// `--check` opens the files zgix would open: an access log in a directory that
/// does not exist is an error at `access_log.path`, as starting would be; one that
/// can be created is created (as `nginx -t` does).
#[test]
fn check_opens_the_access_log() {
    let dir = std::env::temp_dir().join(format!("zgix-check-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let json = |path: &str| {
        format!(
            r#"{{"listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "api"}}}}],
        "clusters": {{"api": {{"endpoints": ["127.0.0.1:9000"]}}}},
        "access_log": {{"path": "{path}"}}}}"#
        )
    };
    let missing = dir.join("no-such-dir").join("access.log");
    let (run, _) = check(&json(&missing.display().to_string()));
    assert_eq!(
        run.status.code(),
        Some(1),
        "stderr:
{}",
        run.stderr
    );
    let want = format!(
        "zgix: access_log.path: cannot open {} for appending: ",
        missing.display()
    );
    assert!(
        run.stderr.lines().any(|l| l.starts_with(&want)),
        "no line starting {want:?}; stderr:
{}",
        run.stderr
    );
    std::fs::create_dir_all(&dir).unwrap();
    let ok = dir.join("access.log");
    let (run, _) = check(&json(&ok.display().to_string()));
    assert!(
        run.status.success(),
        "stderr:
{}",
        run.stderr
    );
    assert!(ok.exists(), "--check did not open {}", ok.display());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_rejects_a_missing_file() {
    let run = run_zgix(&["--check", "--config", "/nonexistent/zgix-test.json"]);
    assert_eq!(run.status.code(), Some(1), "stderr:\n{}", run.stderr);
    assert!(
        run.stderr.lines().any(|l| l.starts_with("zgix: ")),
        "stderr:\n{}",
        run.stderr
    );
}

#[test]
fn help_exits_zero() {
    let run = run_zgix(&["--help"]);
    assert!(
        run.status.success(),
        "exit {}; stderr:\n{}",
        run.status,
        run.stderr
    );
    let text = format!("{}{}", run.stdout, run.stderr);
    assert!(
        text.contains("--config"),
        "help does not mention --config:\n{text}"
    );
    assert!(
        text.contains("--check"),
        "help does not mention --check:\n{text}"
    );
}

#[test]
fn version_prints_name_version_and_git_revision() {
    let run = run_zgix(&["--version"]);
    assert!(
        run.status.success(),
        "exit {}; stderr:\n{}",
        run.status,
        run.stderr
    );
    assert!(
        run.stdout
            .lines()
            .chain(run.stderr.lines())
            .any(|l| l.starts_with("zgix 0.1.0 (git ") && l.ends_with(')')),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
}
