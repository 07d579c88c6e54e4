//! Tests for the access log: both formats, escaping, drops, the writer and reopen.

use super::*;
use crate::observe::decision::UpstreamError;
use crate::runtime::Runtime;
use zgix_config::Config;
use zgix_parser::ParseError;

const CONFIG: &str = r#"{ "cpus": [0],
  "access_log": { "path": "-", "buffer_bytes": 512 },
  "listeners": [
    { "bind": "127.0.0.1:8080", "name": "public", "http": { "cluster": "api",
      "request_filters": [
        { "name": "old \"api\"", "match": { "path": { "prefix": "/old" } },
          "action": { "redirect": { "status": 302, "location": "/new" } } },
        { "match": { "path": { "prefix": "/gone" } }, "action": { "reject": { "status": 410 } } } ] } },
    { "bind": "127.0.0.1:8081", "access_log": false, "http": { "cluster": "api" } } ],
  "clusters": { "api": { "endpoints": ["127.0.0.1:9000"] } } }"#;

fn runtime(edit: impl FnOnce(&mut Config)) -> Runtime {
    let mut c = Config::from_json(CONFIG).unwrap();
    edit(&mut c);
    Runtime::new(c, 1)
}

fn forwarded() -> Record {
    Record {
        start_unix_ms: 1_798_761_600_042,
        client: "192.0.2.7".parse().unwrap(),
        peer: "10.0.0.1:40000".parse().unwrap(),
        listener: 0,
        version: Some(Version::Http11),
        h2: false,
        status: 200,
        bytes_in: 78,
        bytes_out: 1234,
        duration_us: 1_500,
        upstream: Some(0),
        upstream_us: Some(1_234),
        retries: 1,
        decision: Decision::Forwarded,
        tls: None,
        request_id: Default::default(),
    }
}

const GET: Target<'static> = Target {
    method: b"GET",
    path: b"/a/b",
    query: Some(b"x=1&y=\"2\""),
    sni: None,
};

fn line(rt: &Runtime, format: AccessLogFormat, query: bool, r: &Record, t: &Target) -> String {
    let mut out = Vec::new();
    write_line(&mut out, format, query, rt, &SecondCache::new(), r, t);
    String::from_utf8(out).unwrap()
}

#[test]
fn text_line_is_combined_log_style() {
    let rt = runtime(|_| {});
    assert_eq!(
        line(&rt, AccessLogFormat::Text, true, &forwarded(), &GET),
        "2027-01-01T00:00:00.042Z 192.0.2.7 10.0.0.1:40000 \"public\" \"GET /a/b?x=1&y=\\\"2\\\" HTTP/1.1\" 200 78 1234 1.500 \"127.0.0.1:9000\" 1.234 1 \"forwarded\" - - - - -\n"
    );
    // Query dropped by config; a refusal has no upstream; control bytes and
    // non-ASCII are escaped so the line stays one line.
    let r = Record {
        status: 400,
        upstream: None,
        upstream_us: None,
        retries: 0,
        decision: Decision::BadRequest(ParseError::BadFraming),
        ..forwarded()
    };
    let t = Target {
        method: b"GET",
        path: b"/\n\xff\\",
        query: Some(b"q"),
        sni: None,
    };
    assert_eq!(
        line(&rt, AccessLogFormat::Text, false, &r, &t),
        "2027-01-01T00:00:00.042Z 192.0.2.7 10.0.0.1:40000 \"public\" \"GET /\\x0A\\xFF\\\\ HTTP/1.1\" 400 78 1234 1.500 - - 0 \"bad_request:bad_framing\" - - - - -\n"
    );
    // No request line understood: the request field is "-".
    let r = Record { version: None, ..r };
    let l = line(&rt, AccessLogFormat::Text, true, &r, &Target::default());
    assert!(l.contains(" \"public\" \"-\" 400 "), "{l}");
    // A named filter's quotes are escaped inside the decision.
    let r = Record {
        decision: Decision::Filter(0),
        status: 302,
        ..r
    };
    let l = line(&rt, AccessLogFormat::Text, true, &r, &GET);
    assert!(
        l.ends_with(" \"filter:old \\\"api\\\"\" - - - - -\n"),
        "{l}"
    );
}

fn parsed(l: &str) -> serde_json::Value {
    assert!(
        l.ends_with('\n') && !l[..l.len() - 1].contains('\n'),
        "{l:?}"
    );
    serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))
}

#[test]
fn tls_fields_close_the_line_in_both_formats() {
    let rt = runtime(|_| {});
    let r = Record {
        tls: Some(crate::observe::access_log::TlsFacts {
            version: "TLSv1.3",
            cipher: "TLS13_AES_128_GCM_SHA256",
            resumed: true,
        }),
        ..forwarded()
    };
    let t = Target {
        sni: Some(b"site.example"),
        ..GET
    };
    let l = line(&rt, AccessLogFormat::Text, true, &r, &t);
    assert!(
        l.ends_with(" \"forwarded\" TLSv1.3 TLS13_AES_128_GCM_SHA256 site.example 1 -\n"),
        "{l}"
    );
    let v = parsed(&line(&rt, AccessLogFormat::Json, true, &r, &t));
    assert_eq!(v["tls_version"], "TLSv1.3");
    assert_eq!(v["tls_cipher"], "TLS13_AES_128_GCM_SHA256");
    assert_eq!(v["sni"], "site.example");
    assert_eq!(v["tls_resumed"], true);
    let no_sni = Target { sni: None, ..GET };
    let l = line(&rt, AccessLogFormat::Text, true, &r, &no_sni);
    assert!(l.ends_with(" TLS13_AES_128_GCM_SHA256 - 1 -\n"), "{l}");
}

#[test]
fn the_request_id_closes_the_line_in_both_formats() {
    let rt = runtime(|_| {});
    let mut r = forwarded();
    r.request_id.choose(
        zgix_config::RequestIdMode::Generate,
        [&b"req-\"7\""[..]].into_iter(),
    );
    let l = line(&rt, AccessLogFormat::Text, true, &r, &GET);
    assert!(l.ends_with(" - - - - req-\\\"7\\\"\n"), "{l}");
    let v = parsed(&line(&rt, AccessLogFormat::Json, true, &r, &GET));
    assert_eq!(v["request_id"], "req-\"7\"");
}

#[test]
fn json_line_parses_with_every_field() {
    let rt = runtime(|_| {});
    let v = parsed(&line(&rt, AccessLogFormat::Json, true, &forwarded(), &GET));
    let want = serde_json::json!({
        "time": "2027-01-01T00:00:00.042Z", "client": "192.0.2.7", "peer": "10.0.0.1:40000",
        "listener": "public", "method": "GET", "path": "/a/b", "query": "x=1&y=\"2\"",
        "version": "HTTP/1.1", "status": 200, "bytes_in": 78, "bytes_out": 1234,
        "duration_ms": 1.5, "upstream": "127.0.0.1:9000", "upstream_ms": 1.234,
        "retries": 1, "decision": "forwarded",
        "tls_version": null, "tls_cipher": null, "sni": null, "tls_resumed": null,
        "request_id": null
    });
    assert_eq!(v, want);

    let r = Record {
        status: 502,
        upstream_us: None,
        decision: Decision::UpstreamError(UpstreamError::ConnectRefused),
        ..forwarded()
    };
    let t = Target {
        method: b"GET",
        path: b"/\x01caf\xc3\xa9",
        query: None,
        sni: None,
    };
    let v = parsed(&line(&rt, AccessLogFormat::Json, true, &r, &t));
    assert_eq!(v["path"], "/\u{1}café", "valid UTF-8 stays as it is");
    assert_eq!(v["query"], serde_json::Value::Null);
    assert_eq!(v["upstream_ms"], serde_json::Value::Null);
    assert_eq!(v["decision"], "upstream_error:connect_refused");

    let t = Target {
        method: b"GET",
        path: b"/\xff",
        query: Some(b"a"),
        sni: None,
    };
    let r = Record {
        decision: Decision::Filter(1),
        ..r
    };
    let v = parsed(&line(&rt, AccessLogFormat::Json, false, &r, &t));
    assert_eq!(
        v["path"], "/\u{ff}",
        "a non-UTF-8 byte becomes its code point"
    );
    assert_eq!(v["query"], serde_json::Value::Null, "query off");
    assert_eq!(v["decision"], "filter:#1", "an unnamed filter by index");
    let v = parsed(&line(
        &rt,
        AccessLogFormat::Json,
        true,
        &Record {
            decision: Decision::Filter(0),
            ..r
        },
        &Target::default(),
    ));
    assert_eq!(v["decision"], "filter:old \"api\"");
    assert_eq!(v["method"], serde_json::Value::Null);
}

/// An access log without a writer thread, so the ring fills deterministically.
fn detached(rt: &Runtime) -> (AccessLog, ShardLog) {
    let cfg = rt.config.access_log.as_ref().unwrap();
    let shared = Arc::new(Shared {
        path: cfg.path.clone(),
        format: cfg.format,
        query: cfg.query,
        fields: None,
        rings: vec![Arc::new(Ring::new(cfg.buffer_bytes))],
        reopen: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        woken: AtomicBool::new(false),
        writer: OnceLock::new(),
    });
    let log = AccessLog {
        shared,
        thread: Mutex::new(None),
    };
    let shard = log.shard(0, rt.metrics.shards[0].clone(), 8192);
    (log, shard)
}

#[test]
fn a_full_ring_drops_and_counts_lines_without_growing_the_buffer() {
    let rt = runtime(|_| {});
    let (log, shard) = detached(&rt);
    let len = line(&rt, AccessLogFormat::Text, true, &forwarded(), &GET).len();
    let cap_before = shard.line.borrow().capacity();
    for _ in 0..10 {
        shard.emit(&rt, &forwarded(), &GET);
    }
    let c = &rt.metrics.shards[0];
    let fit = (512 / len) as u64;
    assert_eq!(c.access_log_lines.get(), fit);
    assert_eq!(c.access_log_dropped.get(), 10 - fit);
    assert_eq!(shard.line.borrow().capacity(), cap_before);
    // Listener 1 has `access_log: false`: nothing queued, nothing dropped.
    shard.emit(
        &rt,
        &Record {
            listener: 1,
            ..forwarded()
        },
        &GET,
    );
    assert_eq!(c.access_log_lines.get() + c.access_log_dropped.get(), 10);
    // Drained, the ring takes lines again.
    let n = log.shared.rings[0].drain(|_, _| {});
    assert_eq!(n, fit as usize * len);
    shard.emit(&rt, &forwarded(), &GET);
    assert_eq!(c.access_log_lines.get(), fit + 1);
}

fn temp_path(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "zgix-access-{tag}-{}-{}.log",
        std::process::id(),
        crate::observe::clock::unix_ms()
    ))
}

#[test]
fn the_writer_appends_every_line_and_reopens_after_rotation() {
    let path = temp_path("rotate");
    let rotated = path.with_extension("log.1");
    let rt = runtime(|c| {
        let log = c.access_log.as_mut().unwrap();
        log.path = path.to_string_lossy().into_owned();
        log.format = AccessLogFormat::Json;
        log.buffer_bytes = 64 << 10;
    });
    let log = AccessLog::start(rt.config.access_log.as_ref().unwrap(), 1).unwrap();
    let shard = log.shard(0, rt.metrics.shards[0].clone(), 8192);
    shard.emit(&rt, &forwarded(), &GET);
    std::fs::rename(&path, &rotated).unwrap();
    log.reopen();
    shard.emit(
        &rt,
        &Record {
            status: 429,
            decision: Decision::RateLimited,
            ..forwarded()
        },
        &GET,
    );
    log.stop();
    let new = std::fs::read_to_string(&path).unwrap();
    let old = std::fs::read_to_string(&rotated).unwrap();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&rotated);
    let statuses = |s: &str| -> Vec<u64> {
        s.lines()
            .map(|l| parsed(&format!("{l}\n"))["status"].as_u64().unwrap())
            .collect()
    };
    let (new, old) = (statuses(&new), statuses(&old));
    // The second line was emitted after the reopen: it is in the new file.
    // The first is in whichever file was open when the writer drained it.
    assert_eq!(new.last(), Some(&429), "new {new:?} old {old:?}");
    let mut all = [old, new].concat();
    all.sort();
    assert_eq!(all, [200, 429]);
}

#[test]
fn an_unopenable_path_fails_at_start() {
    let rt = runtime(|c| c.access_log.as_mut().unwrap().path = "/nonexistent/dir/a.log".into());
    let err = AccessLog::start(rt.config.access_log.as_ref().unwrap(), 1)
        .err()
        .unwrap();
    assert!(
        err.starts_with("access_log.path: cannot open /nonexistent/dir/a.log: "),
        "{err}"
    );
}

fn with_fields(
    format: AccessLogFormat,
    names: &[&str],
    headers: &[(&[u8], &[u8])],
    r: &Record,
    t: &Target,
) -> String {
    let rt = runtime(|_| {});
    let names: Vec<String> = names.iter().map(|&n| n.into()).collect();
    let f = Fields::compile(&names).unwrap();
    let mut c = Captured::new();
    c.capture(f.headers(), headers.iter().copied());
    let mut out = Vec::new();
    write_fields(
        &mut out,
        format,
        true,
        &f,
        &rt,
        &SecondCache::new(),
        (r, t, &c),
    );
    String::from_utf8(out).unwrap()
}

const HEADERS: &[(&[u8], &[u8])] = &[
    (b"Host", b"api.example"),
    (b"User-Agent", b"curl/8 \"x\"\n"),
    (b"X-Tenant", b"t1"),
    (b"x-tenant", b"t2"),
];

#[test]
fn fields_choose_and_order_the_text_line() {
    // The headers first, then every named field in its documented order.
    let all: Vec<&str> = ["host", "user_agent", "referer", "header:X-Tenant"]
        .into_iter()
        .chain(zgix_config::ACCESS_LOG_FIELD_NAMES.iter().copied())
        .collect();
    assert_eq!(
        with_fields(AccessLogFormat::Text, &all, HEADERS, &forwarded(), &GET),
        "\"api.example\" \"curl/8 \\\"x\\\"\\x0A\" - \"t1\" 2027-01-01T00:00:00.042Z 192.0.2.7 10.0.0.1:40000 \"public\" \"GET /a/b?x=1&y=\\\"2\\\" HTTP/1.1\" \"GET\" \"/a/b\" \"x=1&y=\\\"2\\\"\" \"HTTP/1.1\" 200 78 1234 1.500 127.0.0.1:9000 200 1.234 1 \"forwarded\" - - - - -\n"
    );
    // A refusal before the request line: `-` for the request, no upstream.
    let r = Record {
        status: 400,
        version: None,
        upstream: None,
        upstream_us: None,
        ..forwarded()
    };
    assert_eq!(
        with_fields(
            AccessLogFormat::Text,
            &["request", "upstream_status", "host"],
            &[],
            &r,
            &Target::default()
        ),
        "- - -\n"
    );
}

#[test]
fn fields_in_json_are_strict_and_capped() {
    let long = vec![b'a'; 2000];
    let headers: &[(&[u8], &[u8])] = &[(b"referer", b"\x01\xff\""), (b"x-long", &long)];
    let r = Record {
        tls: Some(crate::observe::access_log::TlsFacts {
            version: "TLSv1.3",
            cipher: "TLS13_AES_128_GCM_SHA256",
            resumed: false,
        }),
        ..forwarded()
    };
    let l = with_fields(
        AccessLogFormat::Json,
        &[
            "time",
            "referer",
            "header:x-long",
            "host",
            "request",
            "tls_resumed",
            "status",
            "upstream_ms",
        ],
        headers,
        &r,
        &GET,
    );
    let v = parsed(&l);
    assert_eq!(v["time"], "2027-01-01T00:00:00.042Z");
    assert_eq!(v["referer"], "\u{1}\u{ff}\"");
    assert_eq!(v["header:x-long"].as_str().unwrap().len(), 512, "capped");
    assert_eq!(v["host"], serde_json::Value::Null);
    assert_eq!(v["request"], "GET /a/b?x=1&y=\"2\" HTTP/1.1");
    assert_eq!(v["tls_resumed"], false);
    assert_eq!(v["status"], 200);
    assert_eq!(v["upstream_ms"], 1.234);
    assert_eq!(v.as_object().unwrap().len(), 8);
    // The keys come in the configured order.
    assert!(l.starts_with("{\"time\":"), "{l}");
}

#[test]
fn capturing_reuses_one_buffer_and_keeps_the_first_value() {
    let names: Vec<String> = vec!["header:x-tenant".into(), "host".into()];
    let f = Fields::compile(&names).unwrap();
    let mut c = Captured::new();
    c.capture(f.headers(), HEADERS.iter().copied());
    assert_eq!(c.get(0), Some(&b"t1"[..]));
    assert_eq!(c.get(1), Some(&b"api.example"[..]));
    let cap = c.buf.capacity();
    let long = vec![b'z'; 5000];
    for _ in 0..3 {
        c.capture(
            f.headers(),
            [(&b"X-Tenant"[..], &long[..]), (b"host", &long[..])].into_iter(),
        );
    }
    assert_eq!(c.get(0).unwrap().len(), 512);
    assert_eq!(c.buf.capacity(), cap, "no growth after the first request");
    c.capture(f.headers(), std::iter::empty());
    assert_eq!((c.get(0), c.get(1)), (None, None));
}

#[test]
fn no_fields_keep_the_default_line_byte_for_byte() {
    let rt = runtime(|_| {});
    let (log, shard) = detached(&rt);
    assert!(shard.captures().is_empty());
    shard.emit(&rt, &forwarded(), &GET);
    let mut got = Vec::new();
    log.shared.rings[0].drain(|a, b| {
        got.extend_from_slice(a);
        got.extend_from_slice(b);
    });
    assert_eq!(
        String::from_utf8(got).unwrap(),
        "2027-01-01T00:00:00.042Z 192.0.2.7 10.0.0.1:40000 \"public\" \"GET /a/b?x=1&y=\\\"2\\\" HTTP/1.1\" 200 78 1234 1.500 \"127.0.0.1:9000\" 1.234 1 \"forwarded\" - - - - -\n"
    );
}
