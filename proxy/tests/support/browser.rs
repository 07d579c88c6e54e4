//! Headless chromium (Debian's) as a test client: the DOM it holds once a page loaded.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// What headless chromium's DOM holds once it loaded `url`, with `args`
/// before the URL (bounded: 60 s; a fresh profile each call).
pub fn chromium_dom(url: &str, args: &[&str]) -> String {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profile = std::env::temp_dir().join(format!("zgix-chromium-{}-{n}", std::process::id()));
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            &format!("--user-data-dir={}", profile.display()),
            "--dump-dom",
        ])
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium is installed (scripts/test.sh installs it)");
    let mut out = child.stdout.take().unwrap();
    let reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 60 s");
        }
        thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&profile);
    reader.join().unwrap()
}
