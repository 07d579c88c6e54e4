//! End-to-end attacks on the control channel by another local user (uid `nobody`): taking a root zgix's listening sockets, and squatting its guard so it cannot start. Needs root (it switches to `nobody`; CI runs as root).

mod lifecycle_support;
mod support;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use lifecycle_support::{free_port, Proc};
use support::{with_test_defaults, zgix_bin, Client, Origin, TempConfig};

const NOBODY: u32 = 65534;

fn config(port: u16, origin: SocketAddr) -> String {
    format!(
        r#"{{"listeners": [{{"bind": "127.0.0.1:{port}", "http": {{"cluster": "c"}}}}],
            "clusters": {{"c": {{"endpoints": ["{origin}"]}}}}}}"#
    )
}

#[track_caller]
fn require_root() {
    assert_eq!(
        nix::unistd::geteuid().as_raw(),
        0,
        "these tests run the attacks as uid nobody, so they need root (CI runs as root)"
    );
}

/// A directory of the test's, traversable by everyone, with `run/` for
/// zgix's runtime directory inside.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("zgix-ctl-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scratch(d)
    }

    fn run_dir(&self) -> PathBuf {
        self.0.join("run")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The one guard socket zgix made in `dir`.
fn guard_in(dir: &Path) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect();
    assert_eq!(found.len(), 1, "guards in {}: {found:?}", dir.display());
    found[0].clone()
}

/// What a raw attacker does as uid nobody, in the child between fork and
/// exec (only raw system calls there: no allocation after fork).
#[derive(Clone, Copy)]
enum Attack {
    /// Connect to a guard and read what it says: Ok if it greets.
    Connect,
    /// Bind a unix socket at the path and listen (a squat), then exec the
    /// holder, which keeps the socket.
    Squat,
    /// Bind the abstract name (the guard's name before this fix).
    SquatAbstract,
}

/// Runs `attack` on `target` as uid nobody. `Err` carries the errno the
/// attack failed with; `Ok` is the holding (or finished) child.
fn as_nobody(attack: Attack, target: &[u8]) -> std::io::Result<std::process::Child> {
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    assert!(target.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(target) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + target.len()) as libc::socklen_t;
    let mut cmd = Command::new("sleep");
    cmd.arg(match attack {
        Attack::Connect => "0",
        _ => "30",
    })
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    // SAFETY: the closure runs in the forked child and makes only raw
    // system calls on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let err = || Err(std::io::Error::last_os_error());
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
            {
                return err();
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                return err();
            }
            let sa = &addr as *const libc::sockaddr_un as *const libc::sockaddr;
            match attack {
                Attack::Connect => {
                    if libc::connect(fd, sa, len) != 0 {
                        return err();
                    }
                    let mut b = [0u8; 64];
                    let n = libc::read(fd, b.as_mut_ptr().cast(), b.len());
                    if n <= 0 {
                        // Closed without a word: refused.
                        return Err(std::io::Error::from_raw_os_error(libc::ECONNRESET));
                    }
                    Ok(())
                }
                Attack::Squat | Attack::SquatAbstract => {
                    if libc::bind(fd, sa, len) != 0 || libc::listen(fd, 8) != 0 {
                        return err();
                    }
                    Ok(())
                }
            }
        });
    }
    cmd.spawn()
}

#[test]
fn another_user_cannot_take_a_root_zgix_listening_sockets() {
    require_root();
    let scratch = Scratch::new("hijack");
    let run = scratch.run_dir();
    let run_s = run.to_string_lossy().into_owned();
    let o = Origin::start();
    let port = free_port();
    let json = config(port, o.addr());
    let root = Proc::start_env(&json, &[], &[("RUNTIME_DIRECTORY", &run_s)]);
    let addr = root.listeners()[0];
    let guard = guard_in(&run);
    let meta = std::fs::metadata(&run).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700, "made private");

    // 1. zgix itself, run by nobody with `--upgrade` against the same
    //    directory: refused before it reaches the guard.
    let file = TempConfig::new(&with_test_defaults(&json));
    std::fs::set_permissions(&file.path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(zgix_bin())
        .arg("--upgrade")
        .arg("--config")
        .arg(&file.path)
        .env("RUNTIME_DIRECTORY", &run)
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "nobody's zgix --upgrade:\n{err}"
    );
    assert!(
        err.contains("owned by uid 0, not by zgix's uid 65534"),
        "nobody's zgix --upgrade:\n{err}"
    );

    // 2. A raw connect to the guard as nobody: the directory keeps it out.
    let e = as_nobody(Attack::Connect, guard.as_os_str().as_encoded_bytes()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");

    // 3. The directory and the socket opened up by mistake: the peer
    //    credentials still refuse nobody before a byte is written.
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&guard, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = as_nobody(Attack::Connect, guard.as_os_str().as_encoded_bytes()).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::ECONNRESET),
        "the guard greeted nobody: {e}"
    );
    let log = root.wait_log("control: refused a connection from pid", 1);
    assert!(
        log.contains(&format!("uid {NOBODY} (only uid 0 or root")),
        "{log}"
    );

    // The root zgix still serves, handed nothing, and still answers its
    // own user on the control channel.
    let mut c = Client::connect(addr);
    assert_eq!(c.get("/").status, 200);
    assert!(
        !root.stderr().contains("sockets handed to"),
        "{}",
        root.stderr()
    );
    let second = run_zgix_env(&["--config", &file.path.to_string_lossy()], &run_s);
    assert!(
        second
            .stderr
            .contains(&format!("is already served by zgix pid {}", root.pid())),
        "{}",
        second.stderr
    );
}

#[test]
fn another_user_cannot_squat_the_guard_of_a_root_zgix() {
    require_root();
    let scratch = Scratch::new("squat");
    let run = scratch.run_dir();
    let run_s = run.to_string_lossy().into_owned();
    let o = Origin::start();
    let port = free_port();
    let bind: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    // The guard's old abstract name, bound first by nobody.
    let mut abstract_name = vec![0u8];
    abstract_name.extend_from_slice(format!("zgix:{bind}").as_bytes());
    let mut held = as_nobody(Attack::SquatAbstract, &abstract_name).expect("nobody binds");

    // The runtime directory as root makes it; nobody cannot put a socket in it.
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let fake = run.join("squat.sock");
    let e = as_nobody(Attack::Squat, fake.as_os_str().as_encoded_bytes()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");

    // Neither squat stops a root zgix: it starts, guards and serves.
    let root = Proc::start_env(
        &config(port, o.addr()),
        &[],
        &[("RUNTIME_DIRECTORY", &run_s)],
    );
    let mut c = Client::connect(root.listeners()[0]);
    assert_eq!(c.get("/").status, 200);
    let _ = guard_in(&run);
    let _ = held.kill();
    let _ = held.wait();

    // A runtime directory others may write is refused, naming it.
    let file = TempConfig::new(&with_test_defaults(&config(free_port(), o.addr())));
    let tmp = std::env::temp_dir().to_string_lossy().into_owned();
    let r = run_zgix_env(&["--config", &file.path.to_string_lossy()], &tmp);
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("runtime directory {tmp}: mode"))
            && r.stderr.contains("lets group or others write it"),
        "{}",
        r.stderr
    );
}

/// `zgix ARGS` with `RUNTIME_DIRECTORY` set, to completion.
fn run_zgix_env(args: &[&str], runtime_dir: &str) -> support::Run {
    support::run_zgix_env(args, &[("RUNTIME_DIRECTORY", runtime_dir)])
}
