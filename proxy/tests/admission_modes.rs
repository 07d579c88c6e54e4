//! End-to-end admission modes of issue 22: the shared overflow bucket against 100,000 rotating /64s, the probe-depth histogram, dry-run per control (counted, logged, switched by reload without losing the table), and rate keys taken from a header.

mod lifecycle_support;
mod support;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use lifecycle_support::{free_port, Proc};
use support::{connect_from, series, Client, Origin, Zgix};

/// One token per hour: nothing refills while a test runs.
const HOUR_MS: u64 = 3_600_000;
/// Longest any wait of these tests may take.
const WAIT: Duration = Duration::from_secs(30);

/// A PROXY v2 header (PROXY command, TCP over IPv6) claiming `src`.
fn v2_tcp6(src: Ipv6Addr) -> Vec<u8> {
    let mut out = vec![
        0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A, 0x21, 0x21,
    ];
    out.extend_from_slice(&36u16.to_be_bytes());
    out.extend_from_slice(&src.octets());
    out.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
    out.extend_from_slice(&40002u16.to_be_bytes());
    out.extend_from_slice(&443u16.to_be_bytes());
    out
}

/// The `i`th distinct /64 (its interface bits vary too, which must not matter).
fn net64(i: u64) -> Ipv6Addr {
    Ipv6Addr::from((0x2001_0db8_u128 << 96) | (u128::from(i) << 64) | 0xdead)
}

fn v4(addr: SocketAddr) -> SocketAddrV4 {
    match addr {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => panic!("listener {a} is not IPv4"),
    }
}

/// `/metrics` of an admin endpoint.
fn scrape(admin: SocketAddr) -> String {
    let mut c = Client::connect(admin);
    let r = c.request(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    assert_eq!(r.status, 200, "metrics: {}", r.show());
    String::from_utf8(r.body).expect("/metrics is UTF-8")
}

/// Waits until the scrape satisfies `f`, returning it.
fn scrape_until(admin: SocketAddr, what: &str, f: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let m = scrape(admin);
        if f(&m) {
            return m;
        }
        assert!(Instant::now() < deadline, "never {what}:\n{m}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Sends one request per distinct /64 `0..n` (each on its own connection, from a
/// few loopback sources so the ephemeral ports go round) and counts the statuses.
fn rotate(listener: SocketAddr, n: u64) -> (usize, usize) {
    let ok = Arc::new(AtomicUsize::new(0));
    let limited = Arc::new(AtomicUsize::new(0));
    let threads = 4u64;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (ok, limited) = (ok.clone(), limited.clone());
            thread::spawn(move || {
                let src = Ipv4Addr::new(127, 0, 1, 10 + t as u8);
                for i in (t..n).step_by(threads as usize) {
                    let stream = connect_from(src, v4(listener))
                        .unwrap_or_else(|e| panic!("connect {i}: {e}"));
                    let mut c = Client::from_stream(stream);
                    let mut req = v2_tcp6(net64(i));
                    req.extend_from_slice(
                        b"GET /r HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                    );
                    c.send(&req);
                    let r = c.read_response();
                    match r.status {
                        200 => ok.fetch_add(1, Ordering::Relaxed),
                        429 => limited.fetch_add(1, Ordering::Relaxed),
                        s => panic!("/64 #{i}: unexpected {s}: {}", r.show()),
                    };
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client thread");
    }
    (ok.load(Ordering::Relaxed), limited.load(Ordering::Relaxed))
}

fn rotating_config(origin: &Origin, overflow: &str, burst: u64) -> String {
    format!(
        r#"{{"admin":{{"bind":"127.0.0.1:0"}},
"listeners":[{{"bind":"127.0.0.1:0","proxy_protocol":true,"http":{{"cluster":"api",
  "rate_limit":{{"requests":1,"window_ms":{HOUR_MS},"burst":{burst}}}}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}},
"limits":{{"rate_limit_entries":4096,"rate_limit_overflow":"{overflow}"}}}}"#,
        origin.addr()
    )
}

/// The acceptance test of the overflow bucket: 100,000 distinct /64s, one request
/// each, against a 4,096-slot table whose buckets stay live for an hour. Fail-open
/// would admit all of them; the shared bucket admits at most one slot per identity
/// placed plus one listener's burst for all the rest.
#[test]
fn shared_overflow_holds_100k_rotating_64s_to_the_table_plus_one_burst() {
    let origin = Origin::start();
    let burst = 50;
    let z = Zgix::start_json(&rotating_config(&origin, "shared", burst));
    let admin = z.admin.expect("admin");
    let n = 100_000;
    let (ok, limited) = rotate(z.listeners[0], n);
    assert_eq!((ok + limited) as u64, n);
    let m = scrape(admin);
    let in_use = series(&m, "zgix_table_slots_in_use{table=\"rate\"}") as usize;
    let full = series(&m, "zgix_l7_rate_limit_full") as usize;
    // Every identity either got a slot (and its first request) or overflowed.
    assert_eq!(
        in_use + full,
        n as usize,
        "slots {in_use} + overflowed {full}"
    );
    assert!(in_use <= 4096, "{in_use} slots of 4096");
    // The table fills most of the way before windows start overflowing.
    assert!(in_use > 4096 / 2, "only {in_use} of 4096 slots used");
    assert_eq!(
        ok,
        in_use + burst as usize,
        "admitted: one per placed identity plus the shared burst"
    );
    assert_eq!(series(&m, "zgix_l7_rate_limited") as usize, limited);
    // Probe depth: every check recorded once; the overflowed ones past depth 7.
    let count = series(&m, "zgix_table_probe_depth_count{table=\"rate\"}") as usize;
    let le7 = series(&m, "zgix_table_probe_depth_bucket{table=\"rate\",le=\"7\"}") as usize;
    let le0 = series(&m, "zgix_table_probe_depth_bucket{table=\"rate\",le=\"0\"}") as usize;
    assert_eq!(count, n as usize);
    assert_eq!(count - le7, full);
    assert!(le0 > 0 && le0 <= le7, "le=0 {le0}, le=7 {le7}");
    // A placed identity still has its own bucket (49 of its 50 tokens left).
    let mut c = Client::connect(z.listeners[0]);
    let mut req = v2_tcp6(net64(0));
    req.extend_from_slice(b"GET /again HTTP/1.1\r\nHost: t\r\n\r\n");
    c.send(&req);
    assert_eq!(c.read_response().status, 200);
}

/// The default keeps today's behaviour: the same rotation (fewer identities) is
/// admitted whole, each overflow counted in `zgix_l7_rate_limit_full`.
#[test]
fn fail_open_admits_every_rotating_64_and_counts_the_overflow() {
    let origin = Origin::start();
    let z = Zgix::start_json(&rotating_config(&origin, "fail_open", 1));
    let admin = z.admin.expect("admin");
    let n = 12_000;
    let (ok, limited) = rotate(z.listeners[0], n);
    assert_eq!((ok, limited), (n as usize, 0));
    let m = scrape(admin);
    let in_use = series(&m, "zgix_table_slots_in_use{table=\"rate\"}") as usize;
    let full = series(&m, "zgix_l7_rate_limit_full") as usize;
    assert_eq!(in_use + full, n as usize);
    assert!(full >= n as usize - 4096, "only {full} overflowed");
}

fn log_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "zgix-admission-modes-{tag}-{}.log",
        std::process::id()
    ))
}

/// The access log's JSON lines once there are at least `n`.
fn wait_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} lines:\n{text}",
            lines.len()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Listener 0: a rate limit of burst 2; listener 1: a connection limit of 1;
/// listener 2: the WAF. Each control dry-run or not as `dry`.
/// Fixed ports: a reload matches listeners by their configured bind, and three
/// `127.0.0.1:0` would all match the first.
fn dry_config(origin: &Origin, log: &Path, ports: [u16; 3], dry: bool) -> String {
    let [p0, p1, p2] = ports;
    format!(
        r#"{{"cpus":[0],"admin":{{"bind":"127.0.0.1:0"}},
"access_log":{{"path":"{}","format":"json"}},
"listeners":[
 {{"bind":"127.0.0.1:{p0}","name":"rated","http":{{"cluster":"api",
   "rate_limit":{{"requests":1,"window_ms":{HOUR_MS},"burst":2,"dry_run":{dry}}}}}}},
 {{"bind":"127.0.0.1:{p1}","name":"conns","http":{{"cluster":"api","conn_limit":{{"max":1,"dry_run":{dry}}}}}}},
 {{"bind":"127.0.0.1:{p2}","name":"walled","http":{{"cluster":"api","waf":{{"deny":["evil"],"dry_run":{dry}}}}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        log.display(),
        origin.addr()
    )
}

fn dry(m: &str, listener: &str, control: &str) -> f64 {
    series(
        m,
        &format!("zgix_l7_dry_run_total{{listener=\"{listener}\",control=\"{control}\"}}"),
    )
}

/// Each control in dry run forwards what it would refuse, counts it under its
/// control and logs `dry_run:<decision>`; the dry-run rate limit spent the tokens,
/// so a reload to enforcing refuses at once (the table was kept), and a reload
/// back forwards again.
#[test]
fn dry_run_forwards_counts_logs_and_reload_switches_without_losing_the_table() {
    let origin = Origin::start();
    let log = log_path("dry");
    let _ = std::fs::remove_file(&log);
    let ports = [free_port(), free_port(), free_port()];
    let z = Proc::start(&dry_config(&origin, &log, ports, true), &[]);
    let admin = z.admin().expect("admin");
    let ls = z.listeners();
    let (rated, conns, walled) = (ls[0], ls[1], ls[2]);

    // Rate: burst 2, then two more that enforcing would refuse.
    let mut c = Client::connect(rated);
    for _ in 0..4 {
        assert_eq!(c.get("/r").status, 200);
    }
    // Connections: the second connection is over the limit of 1.
    let mut held = Client::connect(conns);
    assert_eq!(held.get("/c").status, 200);
    let mut second = Client::connect(conns);
    assert_eq!(second.get("/c").status, 200);
    assert_eq!(second.get("/c").status, 200, "counted once per connection");
    // WAF: a hit forwarded.
    let mut w = Client::connect(walled);
    assert_eq!(w.get("/evil").status, 200);
    assert_eq!(w.get("/fine").status, 200);

    let m = scrape_until(admin, "dry-run counts", |m| dry(m, "walled", "waf") == 1.0);
    assert_eq!(dry(&m, "rated", "rate_limit"), 2.0);
    assert_eq!(dry(&m, "conns", "conn_limit"), 1.0);
    assert_eq!(dry(&m, "rated", "waf"), 0.0);
    assert_eq!(series(&m, "zgix_l7_rate_limited"), 0.0);
    assert_eq!(series(&m, "zgix_l7_conn_limited"), 0.0);
    assert_eq!(series(&m, "zgix_l7_waf_blocked"), 0.0);
    assert_eq!(origin.requests().len(), 9, "all nine forwarded");
    // Occupancy: one probe per rate check, one per connection checked.
    assert_eq!(
        series(&m, "zgix_table_probe_depth_count{table=\"rate\"}"),
        4.0
    );
    assert_eq!(
        series(&m, "zgix_table_probe_depth_count{table=\"conn\"}"),
        2.0
    );
    assert_eq!(
        series(&m, "zgix_table_probe_depth_bucket{table=\"conn\",le=\"7\"}"),
        2.0,
        "both placed"
    );

    let lines = wait_lines(&log, 9);
    let decisions: Vec<(String, String)> = lines
        .iter()
        .map(|v| {
            (
                v["listener"].as_str().unwrap_or("?").to_string(),
                v["decision"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    let count = |l: &str, d: &str| decisions.iter().filter(|(a, b)| a == l && b == d).count();
    assert_eq!(count("rated", "dry_run:rate_limited"), 2, "{decisions:?}");
    assert_eq!(count("rated", "forwarded"), 2, "{decisions:?}");
    // Enforcing would have refused the over-limit connection's first request and
    // closed it: that request is the one marked, once.
    assert_eq!(count("conns", "dry_run:conn_limited"), 1, "{decisions:?}");
    assert_eq!(count("conns", "forwarded"), 2, "{decisions:?}");
    assert_eq!(count("walled", "dry_run:waf"), 1, "{decisions:?}");
    assert_eq!(count("walled", "forwarded"), 1, "{decisions:?}");
    drop((held, second, c, w));

    // Enforcing now: the bucket the dry run drained is the same bucket.
    z.reload(&dry_config(&origin, &log, ports, false), 1);
    let ls = z.listeners();
    let mut c = Client::connect(ls[0]);
    let _ = c.try_send(b"GET /r HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(
        c.read_response().status,
        429,
        "the table was lost on reload"
    );
    let mut w = Client::connect(ls[2]);
    assert_eq!(w.get("/evil").status, 403);
    let m = scrape_until(admin, "enforced counts", |m| {
        series(m, "zgix_l7_waf_blocked") == 1.0
    });
    assert_eq!(series(&m, "zgix_l7_rate_limited"), 1.0);
    assert_eq!(dry(&m, "rated", "rate_limit"), 2.0, "no dry run counted");

    // And back to dry run: forwarded again, counted again.
    z.reload(&dry_config(&origin, &log, ports, true), 2);
    let ls = z.listeners();
    let mut c = Client::connect(ls[0]);
    assert_eq!(c.get("/r").status, 200);
    scrape_until(admin, "a third dry-run rate refusal", |m| {
        dry(m, "rated", "rate_limit") == 3.0
    });
    let _ = std::fs::remove_file(&log);
}

/// `"key": {"header": "x-api-key"}`: one bucket per key value whatever the address,
/// and a request without the field falls back to its address's bucket.
#[test]
fn header_key_gives_each_api_key_its_bucket_and_falls_back_to_the_address() {
    let origin = Origin::start();
    let z = Zgix::start_json(&format!(
        r#"{{"admin":{{"bind":"127.0.0.1:0"}},
"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api",
  "rate_limit":{{"requests":1,"window_ms":{HOUR_MS},"burst":1,"key":{{"header":"x-api-key"}}}}}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        origin.addr()
    ));
    let l = v4(z.listeners[0]);
    let status = |src: u8, key: Option<&str>| {
        let s = connect_from(Ipv4Addr::new(127, 0, 2, src), l).expect("connect");
        let mut c = Client::from_stream(s);
        let key = key.map_or(String::new(), |k| format!("X-Api-Key: {k}\r\n"));
        let _ = c.try_send(format!("GET / HTTP/1.1\r\nHost: t\r\n{key}\r\n").as_bytes());
        c.read_response().status
    };
    assert_eq!(status(1, Some("alpha")), 200);
    // The same key from another address shares the bucket (any case of the name).
    let s = connect_from(Ipv4Addr::new(127, 0, 2, 2), l).expect("connect");
    let mut c = Client::from_stream(s);
    let _ = c.try_send(b"GET / HTTP/1.1\r\nHost: t\r\nx-API-key: alpha\r\n\r\n");
    assert_eq!(c.read_response().status, 429);
    assert_eq!(status(1, Some("beta")), 200, "another key, another bucket");
    // No key: the address's own bucket, untouched by the keyed requests.
    assert_eq!(status(1, None), 200);
    assert_eq!(status(1, None), 429);
    assert_eq!(status(3, None), 200, "another address");
    assert_eq!(status(3, Some("beta")), 429);
    let m = scrape(z.admin.expect("admin"));
    assert_eq!(series(&m, "zgix_l7_rate_limited"), 3.0);
    assert_eq!(series(&m, "zgix_table_slots_in_use{table=\"rate\"}"), 4.0);
}

/// `RateLimit` of `r`: its `r` and `t` parameters, after checking the policy name.
#[track_caller]
fn rate_fields(r: &support::Response) -> (u64, u64) {
    assert_eq!(
        r.fields_named("ratelimit-policy"),
        ["\"api\";q=3;w=60"],
        "{}",
        r.show()
    );
    let v = r.fields_named("ratelimit");
    assert_eq!(v.len(), 1, "{}", r.show());
    let rest = v[0]
        .strip_prefix("\"api\";r=")
        .unwrap_or_else(|| panic!("RateLimit {:?}", v[0]));
    let (rem, t) = rest.split_once(";t=").expect("r and t");
    (rem.parse().unwrap(), t.parse().unwrap())
}

/// `"headers": "draft-11"`: every response of the listener, forwarded, answered by a
/// filter or refused 429, carries both fields with the client's own bucket; another
/// client's numbers are its own, and a listener without `headers` writes none.
#[test]
fn draft_11_headers_on_every_response_with_the_clients_own_bucket() {
    let origin = Origin::start();
    let z = Zgix::start_json(&format!(
        r#"{{"listeners":[
 {{"bind":"127.0.0.1:0","name":"api","http":{{"cluster":"api",
   "rate_limit":{{"requests":1,"window_ms":60000,"burst":3,"headers":"draft-11"}},
   "request_filters":[{{"match":{{"path":{{"prefix":"/old"}}}},"action":{{"redirect":{{"status":301,"location":"/new"}}}}}}]}}}},
 {{"bind":"127.0.0.1:0","http":{{"cluster":"api",
   "rate_limit":{{"requests":1,"window_ms":60000,"burst":3}}}}}}],
"clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        origin.addr()
    ));
    let l = v4(z.listeners[0]);
    let from = |n: u8| Client::from_stream(connect_from(Ipv4Addr::new(127, 0, 3, n), l).unwrap());
    let mut c = from(1);
    // One token a minute: the next is (just under) 60 s away after each take.
    let r = c.get("/a");
    assert_eq!(r.status, 200);
    let (rem, t) = rate_fields(&r);
    assert_eq!(rem, 2);
    assert!((59..=60).contains(&t), "t={t}");
    let r = c.get("/old/x");
    assert_eq!(r.status, 301, "{}", r.show());
    assert_eq!(rate_fields(&r).0, 1);
    // Another client sees its own full bucket, not this one's.
    let mut other = from(2);
    let r = other.get("/a");
    assert_eq!(rate_fields(&r).0, 2);
    let r = c.get("/a");
    assert_eq!(rate_fields(&r).0, 0);
    let _ = c.try_send(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.read_response();
    assert_eq!(r.status, 429);
    let (rem, t) = rate_fields(&r);
    assert_eq!(rem, 0);
    assert_eq!(
        r.field("retry-after"),
        Some(t.to_string().as_str()),
        "{}",
        r.show()
    );
    // The listener without `headers` writes neither field.
    let mut plain = Client::connect(z.listeners[1]);
    let r = plain.get("/a");
    assert_eq!(r.status, 200);
    assert!(r.field("ratelimit").is_none() && r.field("ratelimit-policy").is_none());
}
