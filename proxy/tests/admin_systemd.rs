//! The systemd notify protocol end to end: `READY=1` at start, `RELOADING=1` with `MONOTONIC_USEC=` on SIGHUP and `READY=1` with a `STATUS=` once the reload is applied or rejected (what `Type=notify-reload` waits for), read from a real `$NOTIFY_SOCKET`.

mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// The next notify datagram (10 s at most).
fn next(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = sock
        .recv(&mut buf)
        .expect("a notify message within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn ready_reloading_and_ready_again_with_the_outcome() {
    let origin = Origin::start();
    let dir = std::env::temp_dir().join(format!("zgix-notify-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&path);
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let good = with_test_defaults(&format!(
        r#"{{"cpus":[0],"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}}],
            "clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        origin.addr()
    ));
    let config = TempConfig::new(&good);
    let mut child = Command::new(zgix_bin())
        .arg("--config")
        .arg(&config.path)
        .env("NOTIFY_SOCKET", &path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || for _ in BufReader::new(stderr).lines() {});
    assert_eq!(next(&sock), "READY=1");
    // A valid reload: RELOADING=1 stamped after the signal, then READY=1.
    let before = monotonic_us();
    let kill = |sig: &str| {
        Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .unwrap()
    };
    kill("-HUP");
    let m = next(&sock);
    let (first, stamp) = m.split_once('\n').unwrap();
    assert_eq!(first, "RELOADING=1", "{m}");
    let us: u64 = stamp
        .strip_prefix("MONOTONIC_USEC=")
        .unwrap()
        .parse()
        .unwrap();
    assert!(us >= before && us <= monotonic_us(), "{us} vs {before}");
    assert_eq!(next(&sock), "STATUS=serving generation 2\nREADY=1");
    // A file that does not load: the reload ends too, and says why.
    std::fs::write(&config.path, "{ not json").unwrap();
    kill("-HUP");
    assert!(next(&sock).starts_with("RELOADING=1\nMONOTONIC_USEC="));
    let m = next(&sock);
    assert!(
        m.starts_with("STATUS=reload rejected (1 error(s)); serving generation 2\n")
            && m.ends_with("\nREADY=1"),
        "{m}"
    );
    // A file `--check` passes but the reload rejects (its new listener's
    // address is taken): the same READY=1, which systemd takes as a finished
    // reload; no released sd_notify message fails one (docs/operations.md).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = with_test_defaults(&format!(
        r#"{{"cpus":[0],"listeners":[{{"bind":"127.0.0.1:0","http":{{"cluster":"api"}}}},
            {{"bind":"{}","http":{{"cluster":"api"}}}}],
            "clusters":{{"api":{{"endpoints":["{}"]}}}}}}"#,
        taken.local_addr().unwrap(),
        origin.addr()
    ));
    std::fs::write(&config.path, &busy).unwrap();
    let check = run_zgix(&["--check", "--config", &config.path.to_string_lossy()]);
    assert_eq!(check.status.code(), Some(0), "{}", check.stderr);
    kill("-HUP");
    assert!(next(&sock).starts_with("RELOADING=1\nMONOTONIC_USEC="));
    assert_eq!(
        next(&sock),
        "STATUS=reload rejected (cannot bind); serving generation 2\nREADY=1"
    );
    kill("-TERM");
    assert_eq!(next(&sock), "STOPPING=1");
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
