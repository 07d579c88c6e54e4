//! End-to-end reload hygiene (issue 18): a rejected reload leaves no socket bound, per-listener series follow the listener's name across a reorder, and retired generations (with their upstream pools) go away after many reloads.

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

/// The text of `/metrics` on `admin`.
fn scrape(admin: SocketAddr) -> String {
    let mut s = TcpStream::connect(admin).expect("connect to admin");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read /metrics");
    out
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
