//! One zgix per listen address, and the hand-off of its listening sockets to `zgix --upgrade`: a guard socket per guarded address in a directory only zgix's user can write ([`guard`]), a control thread that answers only peers of zgix's own uid or root ([`peer`]), descriptors passed as SCM_RIGHTS ([`fds`]).
//!
//! # Hand-off protocol
//!
//! On accepting a connection the running instance checks the peer's
//! credentials (`SO_PEERCRED`): another uid than its own effective uid or
//! root is logged and disconnected before a byte is written. To a trusted
//! peer it writes `zgix <pid>\n`. An upgrading instance (which checked in
//! turn that the guard's holder is of its uid or root) answers `upgrade\n`;
//! the running one replies with an 8-byte little-endian length and a text
//! description (one line per socket: `listener <bind> <count>`,
//! `admin <bind>`, `guard <path>`, in descriptor order), then the
//! descriptors, at most [`FDS_PER_MESSAGE`] per one-byte message. When the
//! new instance is about to start its shards it writes `stop\n`; the old
//! one stops accepting (serving what it had accepted) and answers
//! `stopped\n`; once the new one accepts it writes `ok\n` and the old one
//! drains and exits. A failed upgrade leaves the old instance serving
//! (accepting again if it had stopped).

pub mod fds;
pub mod guard;
pub mod peer;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use fds::FDS_PER_MESSAGE;
use fds::{recv_fds, send_fds};
pub use guard::{guard_path, runtime_dir, Guard, Guards};
use guard::{read_greeting, Probe};

/// The sockets the running instance hands over, as described to us.
pub struct Handed {
    /// Listener sockets by configured `bind`.
    pub listeners: Vec<(SocketAddr, Vec<OwnedFd>)>,
    pub admin: Option<(SocketAddr, OwnedFd)>,
    /// Guard sockets, adopted: the names become ours once we confirm.
    pub guards: Vec<Guard>,
    /// The old instance's TLS session-ticket master secret, if it had one.
    pub tickets: Option<[u8; 32]>,
    /// The old instance's PID, and the connection to say `ok` on.
    pub pid: u32,
    pub conn: BufReader<UnixStream>,
}

/// What the running instance describes and sends (its main thread's table).
#[derive(Default)]
pub struct Table {
    pub listeners: Vec<(SocketAddr, Vec<RawFd>)>,
    pub admin: Option<(SocketAddr, RawFd)>,
    pub guards: Vec<(PathBuf, RawFd)>,
    /// The TLS session-ticket master secret, so the new instance opens the
    /// tickets this one sealed.
    pub tickets: Option<[u8; 32]>,
}

/// Asks the instance holding one of `addrs`' guards for its sockets.
pub fn take_over(addrs: &[SocketAddr]) -> Result<Handed, String> {
    let dir = runtime_dir().map_err(|e| format!("--upgrade: {e}"))?;
    let mut why = Vec::new();
    let mut conn = None;
    for a in addrs.iter().filter(|a| a.port() != 0) {
        let path = guard_path(&dir, *a);
        match guard::connect(&path) {
            Ok(c) => {
                conn = Some(c);
                break;
            }
            Err(Probe::Dead) => {}
            Err(Probe::Stranger(p)) => why.push(format!(
                "{} is held by pid {} of uid {}, not zgix's user: not believed",
                path.display(),
                p.pid,
                p.uid
            )),
            Err(Probe::Other(e)) if e.kind() == io::ErrorKind::NotFound => {}
            Err(Probe::Other(e)) => why.push(format!("{}: {e}", path.display())),
        }
    }
    let mut conn = conn.ok_or_else(|| {
        let mut m = format!(
            "--upgrade: no running zgix holds any of this config's listen addresses \
             (guards looked for in {})",
            dir.display()
        );
        for w in &why {
            m.push_str("; ");
            m.push_str(w);
        }
        m
    })?;
    let fail = |e: io::Error| format!("--upgrade: hand-off from the running zgix failed: {e}");
    conn.get_ref()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(fail)?;
    let pid = read_greeting(&mut conn).map_err(fail)?;
    conn.get_mut().write_all(b"upgrade\n").map_err(fail)?;
    // From here on, read the socket itself: a buffered read would swallow
    // the bytes the descriptors ride on (and so the descriptors).
    debug_assert!(
        conn.buffer().is_empty(),
        "the old instance waits for `upgrade`"
    );
    let mut raw = conn.get_ref();
    let mut len = [0u8; 8];
    raw.read_exact(&mut len).map_err(fail)?;
    let mut text = vec![0u8; u64::from_le_bytes(len).min(1 << 20) as usize];
    raw.read_exact(&mut text).map_err(fail)?;
    let text = String::from_utf8_lossy(&text).into_owned();
    let total: usize = text
        .lines()
        .map(|l| match l.split(' ').collect::<Vec<_>>().as_slice() {
            ["listener", _, n] => n.parse().unwrap_or(0),
            ["tickets", _] => 0,
            _ => 1,
        })
        .sum();
    let fds = recv_fds(conn.get_ref(), total).map_err(fail)?;
    let mut out = Handed {
        listeners: Vec::new(),
        admin: None,
        guards: Vec::new(),
        tickets: None,
        pid,
        conn,
    };
    describe_into(&text, fds, &mut out).map_err(|()| {
        format!("--upgrade: the running zgix sent a description zgix cannot read:\n{text}")
    })?;
    Ok(out)
}

/// A 32-byte secret written as 64 hex digits.
fn parse_master(hex: &str) -> Option<[u8; 32]> {
    let b = hex.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut m = [0u8; 32];
    for (i, pair) in b.chunks(2).enumerate() {
        m[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(m)
}

/// Sorts the received descriptors by the description's lines.
fn describe_into(text: &str, fds: Vec<OwnedFd>, out: &mut Handed) -> Result<(), ()> {
    let mut fds = fds.into_iter();
    for line in text.lines() {
        if let Some(path) = line.strip_prefix("guard ") {
            if let Some(fd) = fds.next() {
                let l = UnixListener::from(fd);
                let _ = l.set_nonblocking(true);
                out.guards.push(Guard::adopted(PathBuf::from(path), l));
            }
            continue;
        }
        match line.split(' ').collect::<Vec<_>>().as_slice() {
            ["tickets", hex] => out.tickets = Some(parse_master(hex).ok_or(())?),
            ["listener", bind, n] => {
                let bind = bind.parse().map_err(|_| ())?;
                let n: usize = n.parse().map_err(|_| ())?;
                out.listeners.push((bind, fds.by_ref().take(n).collect()));
            }
            ["admin", bind] => {
                let bind = bind.parse().map_err(|_| ())?;
                out.admin = fds.next().map(|fd| (bind, fd));
            }
            _ => return Err(()),
        }
    }
    Ok(())
}

/// What the control thread needs from the main thread's world.
pub struct Control {
    pub table: Arc<Mutex<Table>>,
    /// Ends the thread.
    pub stop: Arc<AtomicBool>,
    /// Set to the new instance's PID once a hand-off completed.
    pub handed_to: Arc<AtomicU32>,
    /// Makes every shard stop accepting (and serve what it accepted).
    pub stop_accepting: Box<dyn Fn() + Send>,
    /// Set when a hand-off failed after the shards stopped accepting: the
    /// main thread makes them accept again.
    pub resume: Arc<AtomicBool>,
}

/// The running instance's side: answers probes and hand-off requests on
/// its guard sockets until `stop`.
pub fn spawn_control(c: Control) -> io::Result<std::thread::JoinHandle<()>> {
    let Control {
        table,
        stop,
        handed_to,
        stop_accepting,
        resume,
    } = c;
    std::thread::Builder::new()
        .name("zgix-control".into())
        .spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let fds: Vec<RawFd> = table
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .guards
                    .iter()
                    .map(|g| g.1)
                    .collect();
                for fd in wait_readable(&fds, 100) {
                    // SAFETY: accept4 on a listening socket of the table;
                    // the result is checked and owned below.
                    let c = unsafe {
                        libc::accept4(
                            fd,
                            std::ptr::null_mut(),
                            std::ptr::null_mut(),
                            libc::SOCK_CLOEXEC,
                        )
                    };
                    if c < 0 {
                        continue;
                    }
                    // SAFETY: c is a fresh descriptor owned here.
                    let s = UnixStream::from(unsafe { OwnedFd::from_raw_fd(c) });
                    let mut stopped = false;
                    match serve_control(s, &table, &mut || {
                        stop_accepting();
                        stopped = true;
                    }) {
                        Ok(Some(pid)) => {
                            handed_to.store(pid, Ordering::Release);
                            return;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            crate::log_warn!("server", "hand-off failed, still serving: {e}");
                            if stopped {
                                resume.store(true, Ordering::Release);
                            }
                        }
                    }
                }
            }
        })
}

fn wait_readable(fds: &[RawFd], ms: i32) -> Vec<RawFd> {
    if fds.is_empty() {
        std::thread::sleep(Duration::from_millis(ms as u64));
        return Vec::new();
    }
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: p is a valid array of p.len() pollfds.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return Vec::new();
    }
    p.iter()
        .filter(|x| x.revents & libc::POLLIN != 0)
        .map(|x| x.fd)
        .collect()
}

/// One control connection: greet; hand the sockets over if asked. Returns
/// the new instance's PID once it said `ok`.
fn serve_control(
    s: UnixStream,
    table: &Mutex<Table>,
    stop_accepting: &mut dyn FnMut(),
) -> io::Result<Option<u32>> {
    s.set_nonblocking(false)?;
    let who = peer::peer(&s)?;
    if !peer::trusted(who) {
        // Before a byte is written: a stranger learns nothing, not even
        // our PID, and cannot hold this thread.
        crate::log_warn!(
            "server",
            "control: refused a connection from pid {} uid {} (only uid {} or root may hand off, stop or query this zgix)",
            who.pid,
            who.uid,
            peer::own_uid()
        );
        return Ok(None);
    }
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut w = s.try_clone()?;
    if writeln!(w, "zgix {}", std::process::id()).is_err() {
        // A probe that did not wait for the answer.
        return Ok(None);
    }
    let mut r = BufReader::new(s);
    let mut line = String::new();
    if r.read_line(&mut line).is_err() || line != "upgrade\n" {
        return Ok(None);
    }
    let peer = who.pid as u32;
    {
        let t = table.lock().unwrap_or_else(|p| p.into_inner());
        let mut text = String::new();
        let mut fds = Vec::new();
        for (bind, list) in &t.listeners {
            text.push_str(&format!("listener {bind} {}\n", list.len()));
            fds.extend_from_slice(list);
        }
        if let Some((bind, fd)) = t.admin {
            text.push_str(&format!("admin {bind}\n"));
            fds.push(fd);
        }
        for (path, fd) in &t.guards {
            text.push_str(&format!("guard {}\n", path.display()));
            fds.push(*fd);
        }
        if let Some(m) = &t.tickets {
            // The channel is authenticated (zgix's uid or root only).
            text.push_str("tickets ");
            for b in m {
                text.push_str(&format!("{b:02x}"));
            }
            text.push('\n');
        }
        w.write_all(&(text.len() as u64).to_le_bytes())?;
        w.write_all(text.as_bytes())?;
        for chunk in fds.chunks(FDS_PER_MESSAGE) {
            send_fds(&w, chunk)?;
        }
    }
    crate::log_info!(
        "server",
        "sockets handed to pid {peer}; waiting for it to start"
    );
    // The new instance builds its runtime, then asks us to stop accepting
    // before its shards start: two processes' io_uring accepts armed on one
    // socket can lose a wake-up (one woken, then cancelled), stranding a
    // connection in the backlog. Between the two, connections wait there.
    r.get_ref()
        .set_read_timeout(Some(Duration::from_secs(60)))?;
    line.clear();
    r.read_line(&mut line)?;
    if line != "stop\n" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("pid {peer} gave up before starting"),
        ));
    }
    stop_accepting();
    w.write_all(b"stopped\n")?;
    line.clear();
    r.read_line(&mut line)?;
    if line != "ok\n" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("pid {peer} did not confirm the hand-off"),
        ));
    }
    Ok(Some(peer))
}

/// Asks the old instance to stop accepting, and waits until it did.
pub fn stop_old(conn: &mut BufReader<UnixStream>) -> io::Result<()> {
    conn.get_mut().write_all(b"stop\n")?;
    let mut line = String::new();
    conn.read_line(&mut line)?;
    if line == "stopped\n" {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the running zgix did not stop accepting",
        ))
    }
}

/// Tells the old instance the new one accepts on the sockets now.
pub fn confirm(conn: &mut BufReader<UnixStream>) -> io::Result<()> {
    conn.get_mut().write_all(b"ok\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_ticket_master_crosses_the_description_as_hex() {
        let m: [u8; 32] = std::array::from_fn(|i| (i * 7) as u8);
        let hex: String = m.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_master(&hex), Some(m));
        assert_eq!(parse_master(&hex[1..]), None);
        assert_eq!(parse_master(&"zz".repeat(32)), None);
    }

    #[test]
    fn a_held_guard_names_the_holder() {
        let addr: SocketAddr = format!("127.0.0.1:{}", 40000 + std::process::id() % 20000)
            .parse()
            .unwrap();
        let mut first = Guards::default();
        first.claim(&[("listeners[0]".into(), addr)]).unwrap();
        let table = Arc::new(Mutex::new(Table {
            guards: first
                .held
                .iter()
                .map(|g| (g.path.clone(), g.listener.as_raw_fd()))
                .collect(),
            ..Table::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let t = spawn_control(Control {
            table,
            stop: stop.clone(),
            handed_to: Arc::new(AtomicU32::new(0)),
            stop_accepting: Box::new(|| {}),
            resume: Arc::new(AtomicBool::new(false)),
        })
        .unwrap();
        let errors = Guards::default()
            .claim(&[("listeners[0]".into(), addr)])
            .unwrap_err();
        stop.store(true, Ordering::Release);
        t.join().unwrap();
        let want = format!(
            "listeners[0]: {addr} is already served by zgix pid {}",
            std::process::id()
        );
        assert!(errors[0].starts_with(&want), "{errors:?}");
        let path = first.held[0].path.clone();
        drop(first);
        assert!(
            !path.exists(),
            "the guard's name goes when its holder stops"
        );
    }
}
