//! docs/grafana/zgix.json checked against Grafana's dashboard JSON model: required keys, unique panel ids, a grid without overlaps, defined variables, and every query naming a metric zgix exports and documented in docs/operations.md.

use std::collections::BTreeSet;

use serde_json::Value;
use zgix::observe::metrics::{Labels, Metrics, TableGauges};

fn repo_file(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every sample name `/metrics` can carry: a histogram family `x` exports
/// `x_bucket`, `x_sum` and `x_count`.
fn exported_names() -> BTreeSet<String> {
    let m = Metrics::new(1, 1, 1);
    let text = m.render(
        &Labels {
            listeners: vec!["l"],
            clusters: vec!["c"],
            tls: vec![Some(&[("n".to_string(), 0)])],
        },
        &TableGauges {
            rate_in_use: 0,
            rate_capacity: 1,
            conn_in_use: 0,
            conn_capacity: 1,
            max_connections: 1,
        },
    );
    // Plus the per-endpoint families, rendered from a one-endpoint runtime.
    let cfg = zgix_config::Config::from_json(
        r#"{"listeners":[{"bind":"127.0.0.1:0","http":{"cluster":"c"}}],"clusters":{"c":{"endpoints":["127.0.0.1:9"]}}}"#,
    )
    .expect("a valid config");
    let rt = zgix::runtime::Runtime::new(cfg, 1);
    let text = text + &zgix::upstream::render::render(&rt.up);
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            names.insert(name.to_string());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    names
}

/// Identifiers in a PromQL expression that look like metric names.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_string = false;
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c == '"' {
            in_string = !in_string;
        }
        if !in_string && (c.is_ascii_alphanumeric() || c == '_') {
            cur.push(c);
        } else {
            if cur.starts_with("zgix_") || cur.starts_with("process_") {
                out.push(std::mem::take(&mut cur));
            }
            cur.clear();
        }
    }
    out
}

fn int(v: &Value, what: &str) -> i64 {
    v.as_i64()
        .unwrap_or_else(|| panic!("{what} is not an integer: {v}"))
}

#[test]
fn dashboard_matches_the_model_and_the_exported_metrics() {
    let dash: Value = serde_json::from_str(&repo_file("docs/grafana/zgix.json"))
        .expect("docs/grafana/zgix.json is JSON");
    let docs = repo_file("docs/operations.md");
    for key in [
        "title",
        "uid",
        "schemaVersion",
        "panels",
        "templating",
        "time",
        "version",
    ] {
        assert!(dash.get(key).is_some(), "dashboard has no {key:?}");
    }
    assert!(int(&dash["schemaVersion"], "schemaVersion") >= 36);
    assert!(dash["uid"]
        .as_str()
        .is_some_and(|u| !u.is_empty() && u.len() <= 40));
    assert!(dash["time"]["from"].is_string() && dash["time"]["to"].is_string());

    let vars: BTreeSet<&str> = dash["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| {
            assert!(v["type"].is_string(), "variable without type: {v}");
            v["name"].as_str().expect("variable name")
        })
        .collect();
    assert!(vars.contains("datasource"), "{vars:?}");

    let exported = exported_names();
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10);
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    let mut used = BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().expect("panel title");
        assert!(
            ids.insert(int(&p["id"], "id")),
            "panel id repeated: {title}"
        );
        assert!(
            ["timeseries", "stat", "gauge", "table", "bargauge"]
                .contains(&p["type"].as_str().unwrap_or("")),
            "{title}: unknown panel type {}",
            p["type"]
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            int(&g["x"], "x"),
            int(&g["y"], "y"),
            int(&g["w"], "w"),
            int(&g["h"], "h"),
        );
        assert!(
            x >= 0 && y >= 0 && w > 0 && h > 0 && x + w <= 24,
            "{title}: gridPos {g}"
        );
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "{title} overlaps another panel at {cx},{cy}"
                );
            }
        }
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(
                refs.insert(t["refId"].as_str().expect("refId")),
                "{title}: refId repeated"
            );
            let expr = t["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{title}: {expr} names no zgix metric");
            for n in names {
                assert!(
                    exported.contains(&n),
                    "{title}: {n} is not exported by zgix"
                );
                used.insert(n);
            }
            for var in expr.split('$').skip(1) {
                let name: String = var
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    name.starts_with("__") || vars.contains(name.as_str()),
                    "{title}: ${name} undefined"
                );
            }
        }
        assert!(
            docs.contains(&format!("### {title}\n")),
            "panel {title:?} has no `### {title}` section in docs/operations.md"
        );
    }
    // The headline families are all on the dashboard.
    for family in [
        "zgix_http_responses_total",
        "zgix_request_duration_seconds_bucket",
        "zgix_admission_events_total",
        "zgix_upstream_duration_seconds_bucket",
        "zgix_cluster_upstream_errors_total",
        "zgix_connections_open",
        "zgix_access_log_dropped_total",
        "zgix_table_slots_in_use",
        "zgix_tls_handshakes_total",
        "zgix_upstream_tls_failures_total",
    ] {
        assert!(used.contains(family), "{family} is on no panel");
    }
}

#[test]
fn metric_name_extraction_skips_label_values() {
    assert_eq!(
        metric_names(r#"sum by (le) (rate(zgix_a_bucket{decision="zgix_not"}[5m])) / zgix_b"#),
        ["zgix_a_bucket", "zgix_b"]
    );
}
