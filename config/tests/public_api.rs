//! `Config::from_json` end to end through the public API: the issue's minimal config and error reporting.

use zgix_config::{Config, ConfigError, Limits};

const MINIMAL: &str = r#"{ "cpus": [0, 1], "admin": { "bind": "127.0.0.1:9901" },
  "listeners": [ { "bind": "0.0.0.0:8080", "http": { "cluster": "api" } } ],
  "clusters": { "api": { "endpoints": ["127.0.0.1:9000", "127.0.0.1:9001"], "lb": "round_robin" } } }"#;

#[test]
fn minimal_config_from_the_issue() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    match Config::from_json(MINIMAL) {
        Ok(c) => {
            assert_eq!(c.limits, Limits::default());
            assert_eq!(c.shard_cpus(), [0, 1]);
        }
        // Only a one-CPU machine may refuse it, and only for CPU 1.
        Err(e) => {
            assert_eq!(cpus, 1);
            assert_eq!(
                e,
                [ConfigError::new(
                    "cpus[1]",
                    "no CPU 1: 1 CPU is available, numbered 0 to 0"
                )]
            );
        }
    }
}

#[test]
fn shard_cpus_defaults_to_every_available_cpu() {
    let text = MINIMAL.replace(r#""cpus": [0, 1], "#, "");
    let c = Config::from_json(&text).unwrap();
    let n = std::thread::available_parallelism().unwrap().get();
    assert_eq!(c.shard_cpus(), (0..n).collect::<Vec<_>>());
}

#[test]
fn validate_reports_every_problem() {
    let text = r#"{
      "listeners": [
        { "bind": "0.0.0.0:80", "http": { "cluster": "apx",
            "rate_limit": { "requests": 0, "window_ms": 1000, "burst": 10 },
            "request_filters": [ { "action": { "redirect": { "status": 303, "location": "/" } } } ] } },
        { "bind": "0.0.0.0:80", "http": { "cluster": "api" } }
      ],
      "clusters": { "api": { "endpoints": [] } },
      "limits": { "drain_timeout_ms": 0 }
    }"#;
    let e: Vec<String> = Config::from_json(text)
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        e,
        [
            "listeners[0].http.cluster: no cluster named \"apx\"",
            "listeners[0].http.rate_limit.requests: must be between 1 and 1000000000, got 0",
            "listeners[0].http.request_filters[0].action.redirect.status: must be 301, 302, 307 or 308, got 303",
            "listeners[1].bind: 0.0.0.0:80 is already listeners[0].bind",
            "clusters.api.endpoints: must list at least one endpoint",
            "limits.drain_timeout_ms: must be between 1 and 3600000, got 0",
        ]
    );
}

#[test]
fn type_errors_carry_path_and_position() {
    let text = MINIMAL.replace(r#""lb": "round_robin""#, r#""lb": "random""#);
    let e = Config::from_json(&text).unwrap_err();
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].path, "clusters.api.lb");
    assert_eq!(
        e[0].rule,
        "unknown variant `random`, expected one of `round_robin`, `source_ip`, `least_conn` (line 3, column 90)"
    );
}
