//! HTTP/2 from clients end to end with real clients (curl, h2load, headless chromium) on loopback: ALPN h2 on a TLS listener and prior knowledge on a plain one, bodies both ways (length, chunked, close-delimited answers), several streams per connection, one rate token and one WAF scan per stream, one access-log line per stream with protocol HTTP/2.0, the connection limit counting connections, a reload that moves an open connection's new streams to the new configuration, and a drain that sends GOAWAY and finishes the streams in flight.

mod http2_support;
mod lifecycle_support;
mod support;

use std::process::Command;

use http2_support::*;
use support::browser::chromium_dom;
use support::{metrics_text, pattern, series, Origin, Zgix};

fn log_path(tag: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("zgix-h2-{tag}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// curl's output body for `url` (`args` before it).
fn curl_body(args: &[&str], url: &str) -> Vec<u8> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn curl_speaks_h2_by_alpn_and_by_prior_knowledge_and_each_stream_is_one_log_line() {
    let o = Origin::start();
    let cert = Cert::new("curl");
    let log = log_path("curl");
    let z = Zgix::start_json(&config(o.addr(), &cert.tls(""), "", "", Some(&log)));
    let (tls, base) = tls_args(&z, &cert);
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    let h2c = format!("http://127.0.0.1:{}", z.listeners[1].port());

    // The default alpn offers h2: curl takes it without being told.
    let (code, version, err) = curl(&tls, &format!("{base}/a"));
    assert_eq!((code, version.as_str()), (200, "2"), "{err}");
    let (code, version, err) = curl(&[&tls[..], &["--http2"]].concat(), &format!("{base}/b"));
    assert_eq!((code, version.as_str()), (200, "2"), "{err}");
    // HTTP/1.1 still works on the same listener.
    let (code, version, err) = curl(&[&tls[..], &["--http1.1"]].concat(), &format!("{base}/c"));
    assert_eq!((code, version.as_str()), (200, "1.1"), "{err}");
    let (code, version, err) = curl(&["--http2-prior-knowledge"], &format!("{h2c}/d"));
    assert_eq!((code, version.as_str()), (200, "2"), "{err}");
    // Without prior knowledge a plain client still speaks HTTP/1.1 there.
    let (code, version, err) = curl(&[], &format!("{h2c}/e"));
    assert_eq!((code, version.as_str()), (200, "1.1"), "{err}");

    // Bodies: a request body with a length, one without (chunked towards
    // the origin), answers with a length, chunked and close-delimited.
    let pk = ["--http2-prior-knowledge"];
    let echo = curl_body(
        &[&pk[..], &["--data-binary", "hello h2"]].concat(),
        &format!("{h2c}/echo"),
    );
    assert_eq!(echo, b"hello h2");
    let file = cert.dir().join("up.bin");
    std::fs::write(&file, pattern(100_000)).unwrap();
    let up = format!("@{}", file.display());
    let echoed = curl_body(
        &[
            &tls[..],
            &["--data-binary", &up, "-H", "transfer-encoding: chunked"],
        ]
        .concat(),
        &format!("{base}/echo"),
    );
    assert!(
        echoed == pattern(100_000),
        "a 100 kB body echoed back whole"
    );
    assert_eq!(
        curl_body(&pk, &format!("{h2c}/cl/300000")),
        pattern(300_000)
    );
    assert!(!curl_body(&pk, &format!("{h2c}/chunked")).is_empty());
    assert!(!curl_body(&pk, &format!("{h2c}/close")).is_empty());
    let heads: Vec<String> = o
        .requests()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.head).into_owned())
        .collect();
    // :authority became Host; the body without a length went chunked.
    assert!(
        heads.iter().any(|h| h.starts_with("GET /a HTTP/1.1\r\n")
            && h.to_ascii_lowercase().contains("\r\nhost: site.example:")),
        "{heads:?}"
    );
    assert!(
        heads.iter().any(|h| h.starts_with("POST /echo")
            && h.to_ascii_lowercase()
                .contains("transfer-encoding: chunked")),
        "{heads:?}"
    );

    let lines = wait_lines(&log, 10);
    assert_eq!(lines.len(), 10, "{lines:#?}");
    let h2 = lines
        .iter()
        .filter(|l| l.contains(" HTTP/2.0\" 200 "))
        .count();
    let h1 = lines
        .iter()
        .filter(|l| l.contains(" HTTP/1.1\" 200 "))
        .count();
    assert_eq!((h2, h1), (8, 2), "{lines:#?}");
    assert!(lines
        .iter()
        .any(|l| l.contains("\"GET /a HTTP/2.0\"") && l.contains("TLSv1.3")));
    let m = metrics_text(&z);
    assert_eq!(
        series(&m, "zgix_h2_connections_total{listener=\"tls\"}"),
        3.0,
        "{m}"
    );
    assert_eq!(
        series(&m, "zgix_h2_streams_total{listener=\"h2c\"}"),
        5.0,
        "{m}"
    );
    let _ = std::fs::remove_file(&log);
}

/// A browser: headless chromium loads a page over TLS, takes h2 by ALPN
/// (the page's script reads the protocol from Navigation and Resource
/// Timing), and the page, its script and its images are streams on one
/// connection, each its own access-log line.
#[test]
fn chromium_loads_a_page_and_its_resources_over_h2() {
    let o = Origin::start();
    let cert = Cert::new("chromium");
    let log = log_path("chromium");
    let z = Zgix::start_json(&config(o.addr(), &cert.tls(""), "", "", Some(&log)));
    let port = z.listeners[0].port();
    let dom = chromium_dom(
        &format!("https://site.example:{port}/page"),
        &[
            "--ignore-certificate-errors",
            "--host-resolver-rules=MAP site.example 127.0.0.1",
        ],
    );
    assert!(dom.contains("page h2 script h2"), "{dom}");
    assert_eq!(dom.matches("<img src=").count(), 2, "{dom}");
    let lines = wait_lines(&log, 4);
    for path in ["/page", "/page.js", "/cl/100", "/cl/200"] {
        let want = format!("\"GET {path} HTTP/2.0\" 200 ");
        assert!(
            lines.iter().any(|l| l.contains(&want)),
            "{want}: {lines:#?}"
        );
    }
    assert!(
        lines.iter().all(|l| l.contains(" HTTP/2.0\" ")),
        "{lines:#?}"
    );
    let m = metrics_text(&z);
    let conns = series(&m, "zgix_h2_connections_total{listener=\"tls\"}");
    let streams = series(&m, "zgix_h2_streams_total{listener=\"tls\"}");
    assert!(
        streams >= 4.0 && streams > conns,
        "{conns} {streams} {lines:#?}"
    );
    // The page's streams came over one connection (one client port);
    // chromium may open a spare connection it does not use.
    let peer = |l: &String| l.split(' ').nth(2).map(str::to_string);
    let page = ["/page ", "/page.js ", "/cl/100 ", "/cl/200 "];
    let peers: std::collections::HashSet<_> = lines
        .iter()
        .filter(|l| page.iter().any(|p| l.contains(p)))
        .map(peer)
        .collect();
    assert_eq!(peers.len(), 1, "{lines:#?}");
    let _ = std::fs::remove_file(&log);
}

#[test]
fn h2load_sends_200_streams_over_two_connections_ten_at_a_time_all_2xx() {
    let o = Origin::start();
    let cert = Cert::new("h2load");
    let log = log_path("h2load");
    let z = Zgix::start_json(&config(o.addr(), &cert.tls(""), "", "", Some(&log)));
    let tls = format!("https://127.0.0.1:{}/", z.listeners[0].port());
    let h2c = format!("http://127.0.0.1:{}/", z.listeners[1].port());
    for url in [&tls, &h2c] {
        let (codes, failed, out) = h2load(&["-n", "200", "-c", "2", "-m", "10", url]);
        assert_eq!((codes, failed), ([200, 0, 0, 0], 0), "{out}");
    }
    let m = metrics_text(&z);
    for l in ["tls", "h2c"] {
        assert_eq!(
            series(
                &m,
                &format!("zgix_h2_connections_total{{listener=\"{l}\"}}")
            ),
            2.0
        );
        assert_eq!(
            series(&m, &format!("zgix_h2_streams_total{{listener=\"{l}\"}}")),
            200.0
        );
    }
    // One access-log line per stream.
    let lines = wait_lines(&log, 400);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains(" HTTP/2.0\" 200 "))
            .count(),
        400
    );
    // The origin saw 400 requests over pooled connections, not one each.
    assert_eq!(o.requests().len(), 400);
    assert!(o.accepted() <= 40, "{} upstream connections", o.accepted());
    let _ = std::fs::remove_file(&log);
}

#[test]
fn each_stream_spends_a_rate_token_and_meets_the_waf_on_one_connection() {
    let o = Origin::start();
    let cert = Cert::new("admission");
    let z = Zgix::start_json(&config(
        o.addr(),
        &cert.tls(""),
        "",
        r#", "rate_limit": {"requests": 1, "window_ms": 3600000, "burst": 3},
             "conn_limit": {"max": 1}"#,
        None,
    ));
    let h2c = format!("http://127.0.0.1:{}/", z.listeners[1].port());
    // One connection, one stream at a time: three tokens, then 429s; the
    // connection limit of 1 counts the connection, not its streams.
    let (codes, failed, out) = h2load(&["-n", "10", "-c", "1", "-m", "1", &h2c]);
    assert_eq!((codes, failed), ([3, 0, 7, 0], 0), "{out}");
    let m = metrics_text(&z);
    assert_eq!(
        series(
            &m,
            "zgix_admission_events_total{listener=\"h2c\",event=\"rate_limited\"}"
        ),
        7.0,
        "{m}"
    );

    let z = Zgix::start_json(&config(
        o.addr(),
        &cert.tls(""),
        "",
        r#", "waf": {"deny": ["evil"], "status": 403}"#,
        None,
    ));
    let tls = format!("https://127.0.0.1:{}", z.listeners[0].port());
    let (codes, failed, out) = h2load(&[
        "-n",
        "20",
        "-c",
        "1",
        "-m",
        "4",
        &format!("{tls}/ok"),
        &format!("{tls}/evil?q=1"),
    ]);
    // Every other stream is refused, and the connection carries on.
    assert_eq!((codes, failed), ([10, 0, 10, 0], 0), "{out}");
    let m = metrics_text(&z);
    assert_eq!(
        series(
            &m,
            "zgix_admission_events_total{listener=\"tls\",event=\"waf_blocked\"}"
        ),
        10.0,
        "{m}"
    );
    assert_eq!(
        series(&m, "zgix_h2_connections_total{listener=\"tls\"}"),
        1.0,
        "{m}"
    );
}

#[test]
fn a_drain_sends_goaway_with_the_last_stream_finishes_it_then_closes() {
    let o = Origin::start();
    let mut z = Zgix::start_json(&h2c_config(o.addr(), "", ""));
    let streams = "zgix_h2_streams_total{listener=\"h2c\"}";
    let mut c = Raw::open(z.addr());
    // A stream in flight: its body is still to come.
    let mut post = Vec::new();
    lit(&mut post, b":method", b"POST");
    lit(&mut post, b":scheme", b"http");
    lit(&mut post, b":path", b"/echo");
    lit(&mut post, b":authority", b"site.example");
    lit(&mut post, b"content-length", b"4");
    c.headers(1, &post, false);
    assert_eq!(wait_series(&z, streams, 1.0), 1.0);
    z.signal("TERM");
    // GOAWAY (RFC 9113 §6.8: first with the highest id and a PING, then,
    // once the PING is answered, with the last stream zgix took).
    let last = loop {
        let f = c
            .until(|f| f.kind == GOAWAY || (f.kind == PING && f.flags & 1 == 0))
            .expect("a GOAWAY");
        if f.kind == PING {
            c.frame(PING, 1, 0, &f.payload);
            continue;
        }
        assert_eq!(f.code(), 0, "NO_ERROR");
        if f.last_stream() < 0x7fff_ffff {
            break f.last_stream();
        }
    };
    assert_eq!(last, 1);
    // The stream finishes after the GOAWAY.
    c.frame(DATA, END_STREAM, 1, b"ping");
    assert_eq!(c.answer(1), Some(Ok(200)));
    let end = c.answer_end(1).expect("the answer ends");
    assert_eq!((end.kind, end.payload.as_slice()), (DATA, &b"ping"[..]));
    assert!(
        c.closed(),
        "the connection closes once its streams are done"
    );
    let status = z.wait_exit(WAIT).expect("zgix exits after the drain");
    assert_eq!(status.code(), Some(0), "{}", z.stderr());
}

#[test]
fn after_a_reload_the_new_streams_of_an_open_connection_run_on_the_new_config() {
    let a = Origin::named("a");
    let b = Origin::named("b");
    let port = lifecycle_support::free_port();
    let conf = |o: &Origin| {
        format!(
            r#"{{"cpus": [0], "listeners": [{{"bind": "127.0.0.1:{port}", "name": "h2c",
                 "http2": {{"prior_knowledge": true}}, "http": {{"cluster": "c"}}}}],
                 "clusters": {{"c": {{"endpoints": ["{}"]}}}}}}"#,
            o.addr()
        )
    };
    let p = lifecycle_support::Proc::start(&conf(&a), &[]);
    let mut c = Raw::open(format!("127.0.0.1:{port}").parse().unwrap());
    c.headers(1, &get_block("/"), true);
    assert_eq!(c.answer(1), Some(Ok(200)));
    c.answer_end(1).expect("stream 1 ends");
    p.reload(&conf(&b), 1);
    c.headers(3, &get_block("/"), true);
    assert_eq!(c.answer(3), Some(Ok(200)));
    c.answer_end(3).expect("stream 3 ends");
    assert_eq!((a.requests().len(), b.requests().len()), (1, 1));
}

/// An origin that answers every request on its connections with `answer`.
fn scripted_origin(answer: &'static [u8]) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut b = [0u8; 2048];
                loop {
                    while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        head.drain(..end + 4);
                        if s.write_all(answer).is_err() {
                            return;
                        }
                    }
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn an_origins_100_and_103_reach_the_h2_client_as_informational_headers() {
    let origin = scripted_origin(
        b"HTTP/1.1 100 Continue\r\n\r\n\
          HTTP/1.1 103 Early Hints\r\nlink: </s.css>; rel=preload\r\n\r\n\
          HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n",
    );
    let z = Zgix::start_json(&h2c_config(origin, "", ""));
    let out = Command::new("curl")
        .args(["-sS", "-v", "--max-time", "10", "--http2-prior-knowledge"])
        .arg(format!("http://127.0.0.1:{}/hints", z.listeners[0].port()))
        .output()
        .expect("run curl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let got: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("< HTTP/2 ") || l.starts_with("< link:"))
        .collect();
    assert_eq!(
        got,
        [
            "< HTTP/2 100 ",
            "< HTTP/2 103 ",
            "< link: </s.css>; rel=preload",
            "< HTTP/2 200 "
        ],
        "{err}"
    );
    assert_eq!(out.stdout, b"ok\n");
}

/// A stream's head reaches the request loop parsed already (assembled from
/// its fields), or as text when the assembler leaves it to the parser
/// (here: more fields than `max_headers`); either way a stream gets the
/// answer its head gets from an HTTP/1.1 client, and the connection goes on.
#[test]
fn stream_heads_get_the_parsers_answers_whether_assembled_or_parsed() {
    let o = Origin::start();
    let z = Zgix::start_json(&h2c_config(
        o.addr(),
        "",
        r#", "limits": {"max_headers": 8}"#,
    ));
    let url = format!("http://127.0.0.1:{}", z.listeners[0].port());
    let get = |args: &[&str], path: &str| {
        let args = [&["--http2-prior-knowledge"][..], args].concat();
        let (code, version, err) = curl(&args, &format!("{url}{path}"));
        assert_eq!(version, "2", "{err}");
        code
    };
    assert_eq!(get(&[], "/a/../b"), 200);
    // RFC 9110 §10.1.1: an expectation zgix cannot meet.
    assert_eq!(get(&["-H", "expect: fancy"], "/a"), 417);
    // A lone "%" is no pct-encoding (RFC 3986 §2.1).
    assert_eq!(get(&["--path-as-is"], "/a%zz"), 400);
    let many: Vec<String> = (0..10).map(|i| format!("x-f{i}: v")).collect();
    let mut args = Vec::new();
    for h in &many {
        args.extend(["-H", h.as_str()]);
    }
    assert_eq!(get(&args, "/a"), 431);
    let m = metrics_text(&z);
    for (code, n) in [("200", 1.0), ("400", 1.0), ("417", 1.0), ("431", 1.0)] {
        assert_eq!(
            series(
                &m,
                &format!("zgix_http_responses_total{{listener=\"h2c\",code=\"{code}\"}}")
            ),
            n,
            "{m}"
        );
    }
    assert_eq!(get(&[], "/c"), 200, "the listener still serves");
}

/// A proxied answer goes to its stream as the response parser read it:
/// field names lowered (RFC 9113 §8.2.1), Connection, the field it names,
/// Keep-Alive and Transfer-Encoding dropped (§8.2.2), a chunked body
/// de-chunked into DATA, the filters' response edits, RateLimit fields and
/// Via added; `bytes_out` counts the stream's HEADERS frames and DATA
/// payload, as the client received them.
#[test]
fn an_origins_answer_reaches_the_stream_lowercased_without_hop_by_hop_fields() {
    let origin = scripted_origin(
        b"HTTP/1.1 200 OK\r\nX-Mixed-Case: One\r\nConnection: X-Named\r\nX-Named: gone\r\n\
          Keep-Alive: timeout=5\r\nX-Remove-Me: 1\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    );
    let log = log_path("parsed");
    let z = Zgix::start_json(&format!(
        r#"{{"cpus": [0], "admin": {{"bind": "127.0.0.1:0"}}, "via": "edge-7",
            "access_log": {{"path": "{}", "format": "json"}},
            "listeners": [{{"bind": "127.0.0.1:0", "name": "h2c",
                "http2": {{"prior_knowledge": true}},
                "http": {{"cluster": "c",
                  "rate_limit": {{"requests": 100, "window_ms": 60000, "burst": 100,
                                  "headers": "draft-11"}},
                  "request_filters": [{{"match": {{"path": {{"prefix": "/"}}}},
                    "action": {{"response_headers": {{"set": [["X-Served-By", "zgix"]],
                                                     "remove": ["x-remove-me"]}}}}}}]}}}}],
            "clusters": {{"c": {{"endpoints": ["{origin}"]}}}}}}"#,
        log.display()
    ));
    let url = format!("http://127.0.0.1:{}/p", z.listeners[0].port());
    let out = Command::new("curl")
        .args([
            "-sS",
            "-v",
            "--max-time",
            "10",
            "--http2-prior-knowledge",
            &url,
        ])
        .output()
        .expect("run curl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(out.stdout, b"hello world");
    let fields: Vec<&str> = err
        .lines()
        .filter_map(|l| l.strip_prefix("< "))
        .filter(|l| l.contains(": "))
        .collect();
    let names: Vec<&str> = fields
        .iter()
        .map(|f| f.split(": ").next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "x-mixed-case",
            "x-served-by",
            "via",
            "ratelimit-policy",
            "ratelimit"
        ],
        "{err}"
    );
    assert!(fields.contains(&"x-mixed-case: One"), "{err}");
    assert!(fields.contains(&"via: 1.1 edge-7"), "{err}");
    assert!(fields.contains(&"x-served-by: zgix"), "{err}");

    // The same answer to a frame-level client: what it received is what
    // the access log counts.
    let mut c = Raw::open(z.addr());
    c.headers(1, &get_block("/q"), true);
    let mut got = 0;
    let mut data = Vec::new();
    loop {
        let f = c.until(|f| f.id == 1).expect("stream 1's frames");
        match f.kind {
            HEADERS | CONTINUATION => got += 9 + f.payload.len(),
            DATA => {
                got += f.payload.len();
                data.extend_from_slice(&f.payload);
            }
            k => panic!("frame type {k} on stream 1"),
        }
        if f.flags & END_STREAM != 0 {
            break;
        }
    }
    assert_eq!(data, b"hello world");
    let lines = wait_lines(&log, 2);
    let last = lines.last().unwrap();
    assert!(last.contains(r#""path":"/q""#), "{last}");
    assert!(
        last.contains(&format!(r#""bytes_out":{got},"#)),
        "bytes_out {got} (HEADERS frames and DATA payload) in {last}"
    );
}
