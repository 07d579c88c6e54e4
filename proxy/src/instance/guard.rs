//! The single-instance guard: one unix socket per guarded listen address, bound in a directory only zgix's user can write, so no other local user can squat the name or reach the hand-off behind it.
//!
//! # Where the guards live
//!
//! [`runtime_dir`] picks, in order: `$RUNTIME_DIRECTORY` (systemd's
//! `RuntimeDirectory=`; its first entry), `/run/zgix` when running as root,
//! `$XDG_RUNTIME_DIR/zgix`, else `/tmp/zgix-<uid>`. The directory is made
//! with mode 0700 when missing and refused when it is a symlink, belongs to
//! another uid, is writable by group or others, or sits in a directory others
//! may write without the sticky bit: each of those would let another user
//! replace a guard. A guard is `<dir>/<netns>-<bind>.sock` (mode 0600), named
//! for the network namespace because `SO_REUSEPORT` sharing is per namespace.
//!
//! An abstract name (`\0zgix:<bind>`, used before) has no permissions: any
//! local user could bind it first (zgix then refused to start) or connect
//! to it and take the listening sockets. The control thread also checks
//! every peer's `SO_PEERCRED` ([`super::peer`]), so a guard reached through a
//! misconfigured directory still hands nothing to a stranger.

use std::fs;
use std::io::{self, BufRead, BufReader};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::peer;

/// The directory holding the guard sockets, made and checked (see the
/// module docs). The error names the directory and what is wrong with it.
pub fn runtime_dir() -> Result<PathBuf, String> {
    let uid = peer::own_uid();
    let dir = match std::env::var_os("RUNTIME_DIRECTORY") {
        Some(v) if !v.is_empty() => {
            let v = v.to_string_lossy().into_owned();
            PathBuf::from(v.split(':').next().unwrap_or(&v))
        }
        _ if uid == 0 => PathBuf::from("/run/zgix"),
        _ => match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(x) if !x.is_empty() => Path::new(&x).join("zgix"),
            _ => std::env::temp_dir().join(format!("zgix-{uid}")),
        },
    };
    check_dir(&dir, uid).map(|()| dir)
}

fn check_dir(dir: &Path, uid: u32) -> Result<(), String> {
    let fail = |why: String| {
        format!(
            "runtime directory {}: {why} (it holds the single-instance guards and the \
             --upgrade hand-off; see docs/lifecycle.md)",
            dir.display()
        )
    };
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail(format!("cannot create it: {e}"))),
    }
    let m = fs::symlink_metadata(dir).map_err(|e| fail(e.to_string()))?;
    if !m.file_type().is_dir() {
        return Err(fail("not a directory (a symlink is refused)".into()));
    }
    if m.uid() != uid {
        return Err(fail(format!(
            "owned by uid {}, not by zgix's uid {uid}: another user may have made it; \
             remove it or set RUNTIME_DIRECTORY",
            m.uid()
        )));
    }
    if m.mode() & 0o022 != 0 {
        return Err(fail(format!(
            "mode {:o} lets group or others write it; chmod go-w",
            m.mode() & 0o777
        )));
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        if let Ok(pm) = fs::metadata(parent) {
            if pm.mode() & 0o002 != 0 && pm.mode() & 0o1000 == 0 {
                return Err(fail(format!(
                    "its parent {} is writable by others without the sticky bit",
                    parent.display()
                )));
            }
        }
    }
    Ok(())
}

/// The network namespace's inode (`/proc/self/ns/net`), 0 if unreadable.
fn netns() -> u64 {
    fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino())
}

/// The guard socket of `addr` in `dir`.
pub fn guard_path(dir: &Path, addr: SocketAddr) -> PathBuf {
    dir.join(format!("net{}-{addr}.sock", netns()))
}

/// One guard socket. Dropping it closes the socket and removes its name,
/// unless the name was handed to another instance ([`Guards::disown`]).
pub struct Guard {
    pub path: PathBuf,
    pub listener: UnixListener,
    owned: bool,
}

impl Guard {
    /// A guard received in a hand-off: not this process's to remove until
    /// the hand-off is confirmed ([`Guards::own`]).
    pub fn adopted(path: PathBuf, listener: UnixListener) -> Guard {
        Guard {
            path,
            listener,
            owned: false,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.owned {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Guard sockets this process holds.
#[derive(Default)]
pub struct Guards {
    pub held: Vec<Guard>,
}

impl Guards {
    /// Claims the guard of every address with a fixed port that is not held
    /// yet; drops guards of addresses no longer listed. A live instance
    /// holding one is an error naming the address and its PID; a guard left
    /// by an instance that died is replaced.
    pub fn claim(&mut self, addrs: &[(String, SocketAddr)]) -> Result<(), Vec<String>> {
        let dir = runtime_dir().map_err(|e| vec![e])?;
        // Two zgix of this user starting at once must not both find a stale
        // guard, remove it and bind: the directory lock orders them.
        let lock = fs::File::open(&dir).map_err(|e| vec![format!("{}: {e}", dir.display())])?;
        nix::fcntl::flock(lock.as_raw_fd(), nix::fcntl::FlockArg::LockExclusive)
            .map_err(|e| vec![format!("{}: cannot lock it: {e}", dir.display())])?;
        let fixed: Vec<&(String, SocketAddr)> =
            addrs.iter().filter(|(_, a)| a.port() != 0).collect();
        let wanted: Vec<PathBuf> = fixed.iter().map(|(_, a)| guard_path(&dir, *a)).collect();
        // A guard handed over from an instance with another runtime
        // directory is kept as long as its address is still listed.
        let wanted_names: Vec<_> = wanted
            .iter()
            .map(|p| p.file_name().map(|n| n.to_owned()))
            .collect();
        self.held
            .retain(|g| wanted_names.contains(&g.path.file_name().map(|n| n.to_owned())));
        let mut errors = Vec::new();
        for ((path, _), gpath) in fixed.iter().zip(&wanted) {
            let name = gpath.file_name();
            if self.held.iter().any(|g| g.path.file_name() == name) {
                continue;
            }
            match bind_guard(gpath) {
                Ok(g) => self.held.push(g),
                Err(e) => errors.push(format!("{path}: {e}")),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// After a hand-off: the names belong to the new instance now, so
    /// dropping these guards closes the sockets but leaves the names.
    pub fn disown(&mut self) {
        for g in &mut self.held {
            g.owned = false;
        }
    }

    /// Once this instance serves on the sockets it took over, the guards
    /// it received are its own to remove at exit.
    pub fn own(&mut self) {
        for g in &mut self.held {
            g.owned = true;
        }
    }
}

/// Binds the guard at `path`, replacing one left by a dead instance; a
/// live holder is an error naming it.
fn bind_guard(path: &Path) -> Result<Guard, String> {
    let addr = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split_once('-'))
        .and_then(|(_, a)| a.strip_suffix(".sock"))
        .unwrap_or("?")
        .to_string();
    for _ in 0..2 {
        match UnixListener::bind(path) {
            Ok(l) => {
                // The directory already keeps others out; the mode keeps
                // them out of the socket if the directory is opened up.
                let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o600));
                l.set_nonblocking(true)
                    .map_err(|e| format!("cannot claim {addr}: {e}"))?;
                return Ok(Guard {
                    path: path.to_path_buf(),
                    listener: l,
                    owned: true,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => match probe(path) {
                Ok(pid) => {
                    return Err(format!(
                        "{addr} is already served by zgix pid {pid}; stop it first, \
                         or take its sockets over with `zgix --upgrade`"
                    ))
                }
                Err(Probe::Dead) => {
                    let _ = fs::remove_file(path);
                }
                Err(Probe::Stranger(p)) => {
                    return Err(format!(
                        "{addr}: its guard {} is held by pid {} of uid {}, not zgix's user; \
                         not believed, and not replaced",
                        path.display(),
                        p.pid,
                        p.uid
                    ))
                }
                Err(Probe::Other(e)) => {
                    return Err(format!(
                        "{addr} is already served by another zgix (its guard {} answers: {e})",
                        path.display()
                    ))
                }
            },
            Err(e) => return Err(format!("cannot claim {addr} at {}: {e}", path.display())),
        }
    }
    Err(format!(
        "cannot claim {addr}: {} keeps coming back",
        path.display()
    ))
}

/// Why a guard did not name a live zgix of ours.
pub enum Probe {
    /// Nobody listens: an instance died and left the name.
    Dead,
    /// The holder is another (non-root) user: not believed.
    Stranger(peer::Peer),
    Other(io::Error),
}

/// Connects to the guard at `path`, checking who holds it before believing
/// anything it says.
pub fn connect(path: &Path) -> Result<BufReader<UnixStream>, Probe> {
    let s = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Err(Probe::Dead),
        Err(e) => return Err(Probe::Other(e)),
    };
    let holder = peer::peer(&s).map_err(Probe::Other)?;
    if !peer::trusted(holder) {
        return Err(Probe::Stranger(holder));
    }
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(Probe::Other)?;
    Ok(BufReader::new(s))
}

/// The PID the instance holding `path` gives in its greeting.
fn probe(path: &Path) -> Result<u32, Probe> {
    let mut r = connect(path)?;
    read_greeting(&mut r).map_err(Probe::Other)
}

pub fn read_greeting(r: &mut BufReader<UnixStream>) -> io::Result<u32> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    line.trim()
        .strip_prefix("zgix ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a zgix greeting"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("zgix-guard-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_new_directory_is_private_and_accepted() {
        let d = scratch("new");
        check_dir(&d, peer::own_uid()).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_others_may_write_is_refused() {
        let d = scratch("open");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_dir(&d, peer::own_uid()).unwrap_err();
        assert!(e.contains("lets group or others write it"), "{e}");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_of_another_uid_is_refused() {
        let d = scratch("owner");
        fs::create_dir(&d).unwrap();
        let e = check_dir(&d, peer::own_uid() + 1).unwrap_err();
        assert!(e.contains("owned by uid"), "{e}");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_symlink_is_refused() {
        let d = scratch("link");
        let target = scratch("link-target");
        fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, &d).unwrap();
        let e = check_dir(&d, peer::own_uid()).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        let _ = fs::remove_file(&d);
        let _ = fs::remove_dir_all(&target);
    }

    #[test]
    fn a_guard_left_by_a_dead_instance_is_replaced_and_removed_on_drop() {
        let d = scratch("stale");
        check_dir(&d, peer::own_uid()).unwrap();
        let path = guard_path(&d, "127.0.0.1:9".parse().unwrap());
        // A bound socket whose process is gone: the name stays, nobody listens.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let g = bind_guard(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        drop(g);
        assert!(!path.exists(), "an owned guard's name goes with it");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_disowned_guard_keeps_its_name() {
        let d = scratch("disown");
        check_dir(&d, peer::own_uid()).unwrap();
        let path = guard_path(&d, "127.0.0.1:10".parse().unwrap());
        let mut gs = Guards {
            held: vec![bind_guard(&path).unwrap()],
        };
        gs.disown();
        drop(gs);
        assert!(path.exists(), "the successor holds this name");
        let _ = fs::remove_dir_all(&d);
    }
}
