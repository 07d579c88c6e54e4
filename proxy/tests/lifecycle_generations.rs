//! End-to-end reload hygiene (issue 18): a rejected reload leaves no socket bound, per-listener series follow the listener's name across a reorder, retired generations (with their upstream pools) go away after many reloads, and an idle keep-alive connection lets go of its generation at a reload.

mod lifecycle_support;
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use lifecycle_support::{free_port, Proc};
use support::{Client, Origin};

/// A config: listeners `(name, bind)` in this order, all to cluster `c` =
/// `origin`, with an admin endpoint on `admin`.
fn config(listeners: &[(&str, &str)], origin: SocketAddr, admin: &str) -> String {
    let ls: Vec<String> = listeners
        .iter()
        .map(|(n, b)| format!(r#"{{"bind": "{b}", "name": "{n}", "http": {{"cluster": "c"}}}}"#))
        .collect();
    format!(
        r#"{{"cpus": [0], "listeners": [{}], "admin": {{"bind": "{admin}"}},
            "clusters": {{"c": {{"endpoints": ["{origin}"]}}}}}}"#,
        ls.join(",")
    )
}

/// The text of `/metrics` on `admin`. Not retried: a scrape during a
/// reload must not fail (the admin socket's accept loop outlives reloads).
fn scrape(admin: SocketAddr) -> String {
    let once = || -> std::io::Result<String> {
        let mut s = TcpStream::connect(admin)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        if !out.starts_with("HTTP/1.1 200") {
            return Err(std::io::Error::other(out));
        }
        Ok(out)
    };
    once().unwrap_or_else(|e| panic!("GET /metrics on {admin}: {e}"))
}

/// The value of one series (name and labels as rendered).
#[track_caller]
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no series {series} in /metrics:\n{text}"))
}

fn addr(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

#[test]
fn a_rejected_reload_closes_every_socket_it_bound() {
    let o = Origin::start();
    let (pa, px) = (free_port(), free_port());
    let admin = addr(free_port());
    let zgix = Proc::start(&config(&[("A", &addr(pa))], o.addr(), &admin), &[]);
    // Another program holds Y's port.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let py = taken.local_addr().unwrap().port();
    zgix.write_config(&config(
        &[("A", &addr(pa)), ("X", &addr(px)), ("Y", &addr(py))],
        o.addr(),
        &admin,
    ));
    zgix.signal("HUP");
    zgix.wait_log("reload rejected", 1);
    assert!(
        zgix.stderr()
            .contains(&format!("cannot bind 127.0.0.1:{py}")),
        "{}",
        zgix.stderr()
    );
    // X was bound by the rejected reload: it is free again.
    let x = TcpListener::bind(addr(px));
    assert!(
        x.is_ok(),
        "port {px} still bound after the rejected reload: {:?}",
        x.err()
    );
    drop(x);
    // A still serves, on the same generation.
    let mut c = Client::connect(format!("127.0.0.1:{pa}").parse().unwrap());
    assert_eq!(c.get("/").status, 200);
    // And a good reload onto X works (its guard was let go as well).
    drop(taken);
    zgix.reload(
        &config(&[("A", &addr(pa)), ("X", &addr(px))], o.addr(), &admin),
        1,
    );
    let mut c = Client::connect(format!("127.0.0.1:{px}").parse().unwrap());
    assert_eq!(c.get("/").status, 200);
}

#[test]
fn listener_series_follow_the_name_across_a_reorder() {
    let o = Origin::start();
    let (pa, pb) = (addr(free_port()), addr(free_port()));
    let admin_bind = addr(free_port());
    let zgix = Proc::start(
        &config(&[("A", &pa), ("B", &pb)], o.addr(), &admin_bind),
        &[],
    );
    let admin = zgix.admin().expect("admin address");
    let b: SocketAddr = pb.parse().unwrap();
    let mut held: Vec<Client> = (0..3).map(|_| Client::connect(b)).collect();
    for c in &mut held {
        assert_eq!(c.get("/").status, 200);
    }
    let m = scrape(admin);
    assert_eq!(value(&m, "zgix_connections_open{listener=\"B\"}"), 3.0);
    assert_eq!(
        value(&m, "zgix_connections_accepted_total{listener=\"B\"}"),
        3.0
    );
    zgix.reload(&config(&[("B", &pb), ("A", &pa)], o.addr(), &admin_bind), 1);
    let m = scrape(admin);
    assert_eq!(
        value(&m, "zgix_connections_open{listener=\"B\"}"),
        3.0,
        "{m}"
    );
    assert_eq!(
        value(&m, "zgix_connections_accepted_total{listener=\"B\"}"),
        3.0
    );
    assert_eq!(value(&m, "zgix_connections_open{listener=\"A\"}"), 0.0);
    assert_eq!(
        value(&m, "zgix_http_responses_total{listener=\"B\",code=\"200\"}"),
        3.0
    );
    // A request after the reload on a held connection counts for B too.
    assert_eq!(held[0].get("/").status, 200);
    // A listener added by a reload starts from zero; a removed one's
    // series go.
    let pc = addr(free_port());
    zgix.reload(&config(&[("C", &pc), ("B", &pb)], o.addr(), &admin_bind), 2);
    let m = scrape(admin);
    assert_eq!(
        value(&m, "zgix_http_responses_total{listener=\"B\",code=\"200\"}"),
        4.0
    );
    assert_eq!(
        value(&m, "zgix_connections_accepted_total{listener=\"C\"}"),
        0.0
    );
    assert!(!m.contains("listener=\"A\""), "{m}");
    drop(held);
}

/// zgix's resident set, in bytes.
fn rss(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb * 1024.0)
}

/// Descriptors zgix holds now.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Polls `/metrics` until `series` is at most `max` (bounded); its last value.
fn settles(admin: SocketAddr, series: &str, max: f64) -> f64 {
    let deadline = std::time::Instant::now() + lifecycle_support::WAIT;
    loop {
        let v = value(&scrape(admin), series);
        if v <= max || std::time::Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reloads `json` and waits until generation `g` is in use (read from
/// `/metrics`: the log rate-limits the reload lines past a few a second).
#[track_caller]
fn reload_to(zgix: &Proc, admin: SocketAddr, json: &str, g: f64) {
    zgix.write_config(json);
    zgix.signal("HUP");
    let deadline = std::time::Instant::now() + lifecycle_support::WAIT;
    while value(&scrape(admin), "zgix_config_generation") < g {
        assert!(
            std::time::Instant::now() < deadline,
            "generation {g} not applied"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_hundred_reloads_with_an_idle_client_leave_one_generation_and_no_upstream_socket() {
    let o = Origin::start();
    let bind = addr(free_port());
    let admin_bind = addr(free_port());
    let json = config(&[("A", &bind)], o.addr(), &admin_bind);
    let zgix = Proc::start(&json, &[]);
    let admin = zgix.admin().expect("admin address");
    let a: SocketAddr = bind.parse().unwrap();
    // Held open and idle across every reload.
    let mut idle = Client::connect(a);
    assert_eq!(idle.get("/").status, 200);
    let mut busy = Client::connect(a);
    assert_eq!(busy.get("/").status, 200);
    // A few reloads with a request in flight: its upstream connection is
    // returned to a retired generation.
    for n in 1..=3 {
        busy.send(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n");
        o.wait_requests(2 + n);
        zgix.reload(&json, n);
        let r = busy.read_response();
        assert_eq!(r.status, 200, "{}", r.show());
    }
    let (fds_before, rss_before) = (fds(zgix.pid()), rss(zgix.pid()));
    for n in 4..=100 {
        reload_to(&zgix, admin, &json, (n + 1) as f64);
        assert_eq!(busy.get("/").status, 200, "after reload {n}");
        if n % 10 == 0 {
            let mut c = Client::connect(a);
            assert_eq!(
                c.request(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                    .status,
                200
            );
        }
    }
    // Idle clients follow each reload at once: only the current
    // generation is left.
    let live = settles(admin, "zgix_generations_live", 1.0);
    assert_eq!(live, 1.0, "{live} generations alive after 100 reloads");
    let rss_after = rss(zgix.pid());
    let fds_after = fds(zgix.pid());
    eprintln!(
        "100 reloads: generations {live}, fds {fds_before} -> {fds_after}, RSS {rss_before} -> {rss_after}, upstream connects {}",
        o.accepted()
    );
    assert!(
        fds_after <= fds_before + 2,
        "descriptors grew {fds_before} -> {fds_after}"
    );
    assert!(
        rss_after - rss_before < 4e6,
        "RSS grew {rss_before} -> {rss_after} over 97 reloads"
    );
    // The busy client's upstream connection went from pool to pool.
    assert!(
        o.accepted() <= 12,
        "{} upstream connects for 110 requests on one endpoint",
        o.accepted()
    );
    // The idle client, moved across every reload, is served.
    assert_eq!(idle.get("/").status, 200);
    let live = settles(admin, "zgix_generations_live", 1.0);
    assert_eq!(live, 1.0, "one generation after the idle client's request");
}

/// Issue 18: a keep-alive connection idle between requests lets go of its
/// last request's generation when a reload replaces it, without sending a
/// byte (before, it held it until its next request); the request it sends
/// afterwards is served on the new generation, on the same connection.
#[test]
fn an_idle_keep_alive_client_lets_go_of_its_generation_at_a_reload() {
    let o = Origin::start();
    let bind = addr(free_port());
    let admin_bind = addr(free_port());
    let json = config(&[("A", &bind)], o.addr(), &admin_bind);
    let zgix = Proc::start(&json, &[]);
    let admin = zgix.admin().expect("admin address");
    let mut idle = Client::connect(bind.parse().unwrap());
    assert_eq!(idle.get("/").status, 200);
    assert_eq!(value(&scrape(admin), "zgix_generations_live"), 1.0);
    // A reload that changes the config: the listener gets another name.
    let renamed = config(&[("B", &bind)], o.addr(), &admin_bind);
    for (n, cfg) in [(1, &renamed), (2, &json)] {
        zgix.reload(cfg, n);
        let live = settles(admin, "zgix_generations_live", 1.0);
        assert_eq!(
            live, 1.0,
            "after reload {n} the idle connection still holds its old generation"
        );
    }
    // The same connection, never closed, is served on the new generation.
    assert_eq!(idle.get("/again").status, 200);
    assert_eq!(value(&scrape(admin), "zgix_generations_live"), 1.0);
}
