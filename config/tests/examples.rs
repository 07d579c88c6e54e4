//! Every example config under examples/ loads and validates through the public API.

use std::path::Path;

use zgix_config::{Action, Config, Lb};

#[test]
fn every_example_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut loaded = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/ exists") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            if let Err(errors) = Config::from_file(&path) {
                let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
                panic!("{}:\n{}", path.display(), lines.join("\n"));
            }
            loaded += 1;
        }
    }
    assert!(
        loaded >= 2,
        "expected demo.json and edge.json, loaded {loaded}"
    );
}

#[test]
fn demo_is_the_smallest_useful_config() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let c = Config::from_file(&dir.join("demo.json")).unwrap();
    assert_eq!(c.cpus, None);
    assert_eq!(c.listeners[0].bind, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(c.listeners[0].http.cluster, "origin");
    assert_eq!(
        c.clusters["origin"].endpoints,
        [zgix_config::Endpoint::new("127.0.0.1:9000")]
    );
    assert_eq!(c.admin.unwrap().bind, "127.0.0.1:9901".parse().unwrap());
}

#[test]
fn edge_uses_every_feature() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let c = Config::from_file(&dir.join("edge.json")).unwrap();
    let l = &c.listeners[0];
    assert!(l.proxy_protocol);
    assert!(l.clients.is_some());
    assert!(l.http.rate_limit.is_some());
    assert!(l.http.conn_limit.is_some());
    assert!(l.http.waf.is_some());
    assert_eq!(c.clusters["api"].lb, Lb::SourceIp);
    let web = &c.clusters["web"];
    assert_eq!(web.lb, Lb::LeastConn);
    assert_eq!(web.endpoints[2].weight, 2);
    assert!(web.health.active.is_some() && web.health.passive.is_some());
    let kinds: Vec<&str> = l
        .http
        .request_filters
        .iter()
        .map(|f| f.action.kind())
        .collect();
    for kind in [
        "allow",
        "reject",
        "redirect",
        "respond",
        "request_headers",
        "response_headers",
        "rewrite",
        "route",
    ] {
        assert!(kinds.contains(&kind), "edge.json has no {kind} filter");
    }
    assert!(matches!(
        l.http.request_filters[1].action,
        Action::Respond(_)
    ));
}

#[test]
fn unreadable_file_is_one_error_without_path() {
    let e = Config::from_file(Path::new("/nonexistent/zgix.json")).unwrap_err();
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].path, "");
    assert!(
        e[0].to_string()
            .starts_with("cannot read /nonexistent/zgix.json: "),
        "{}",
        e[0]
    );
}
