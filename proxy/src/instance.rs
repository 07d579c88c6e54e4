//! One zgix per listen address: an abstract unix socket `zgix:<addr>` is bound for each listener (and the admin) with a fixed port, so a second instance finds the first and refuses to start; the same socket carries the hand-off of the listening sockets to `zgix --upgrade` (SCM_RIGHTS, see unix(7)).
//!
//! # Hand-off protocol
//!
//! On accepting a connection the running instance writes `zgix <pid>\n`.
//! An upgrading instance answers `upgrade\n`; the running one replies with
//! an 8-byte little-endian length and a text description (one line per
//! socket: `listener <bind> <count>`, `admin <bind>`, `guard <name>`, in
//! descriptor order), then the descriptors, at most [`FDS_PER_MESSAGE`] per
//! one-byte message. When the new instance is about to start its shards it
//! writes `stop\n`; the old one stops accepting (serving what it had
//! accepted) and answers `stopped\n`; once the new one accepts it writes
//! `ok\n` and the old one drains and exits. A failed upgrade leaves the old
//! instance serving (accepting again if it had stopped).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Descriptors sent in one message (the kernel allows 253, `SCM_MAX_FD`).
pub const FDS_PER_MESSAGE: usize = 64;

/// The abstract socket name guarding `addr`.
pub fn guard_name(addr: SocketAddr) -> String {
    format!("zgix:{addr}")
}

/// Guard sockets this process holds, by name.
#[derive(Default)]
pub struct Guards {
    pub held: Vec<(String, UnixListener)>,
}

impl Guards {
    /// Claims the guard of every address with a fixed port that is not held
    /// yet; drops guards of addresses no longer listed. A live instance
    /// holding one is an error naming the address and its PID.
    pub fn claim(&mut self, addrs: &[(String, SocketAddr)]) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        let wanted: Vec<String> = addrs
            .iter()
            .filter(|(_, a)| a.port() != 0)
            .map(|(_, a)| guard_name(*a))
            .collect();
        self.held.retain(|(n, _)| wanted.contains(n));
        for (path, addr) in addrs.iter().filter(|(_, a)| a.port() != 0) {
            let name = guard_name(*addr);
            if self.held.iter().any(|(n, _)| *n == name) {
                continue;
            }
            match bind_abstract(&name) {
                Ok(l) => self.held.push((name, l)),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    let who = match probe(&name) {
                        Ok(pid) => format!("zgix pid {pid}"),
                        Err(_) => "another zgix".to_string(),
                    };
                    errors.push(format!(
                        "{path}: {addr} is already served by {who}; stop it first, \
                         or take its sockets over with `zgix --upgrade`"
                    ));
                }
                Err(e) => errors.push(format!("{path}: cannot claim {addr}: {e}")),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

fn bind_abstract(name: &str) -> io::Result<UnixListener> {
    let addr = UnixAddr::from_abstract_name(name.as_bytes())?;
    let l = UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

fn connect(name: &str) -> io::Result<BufReader<UnixStream>> {
    let addr = UnixAddr::from_abstract_name(name.as_bytes())?;
    let s = UnixStream::connect_addr(&addr)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    Ok(BufReader::new(s))
}

/// The PID the instance holding `name` gives in its greeting.
fn probe(name: &str) -> io::Result<u32> {
    let mut r = connect(name)?;
    read_greeting(&mut r)
}

fn read_greeting(r: &mut BufReader<UnixStream>) -> io::Result<u32> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    line.trim()
        .strip_prefix("zgix ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a zgix greeting"))
}

/// The sockets the running instance hands over, as described to us.
pub struct Handed {
    /// Listener sockets by configured `bind`.
    pub listeners: Vec<(SocketAddr, Vec<OwnedFd>)>,
    pub admin: Option<(SocketAddr, OwnedFd)>,
    pub guards: Vec<(String, UnixListener)>,
    /// The old instance's PID, and the connection to say `ok` on.
    pub pid: u32,
    pub conn: BufReader<UnixStream>,
}

/// What the running instance describes and sends (its main thread's table).
#[derive(Default)]
pub struct Table {
    pub listeners: Vec<(SocketAddr, Vec<RawFd>)>,
    pub admin: Option<(SocketAddr, RawFd)>,
    pub guards: Vec<(String, RawFd)>,
}

/// Asks the instance holding one of `addrs`' guards for its sockets.
pub fn take_over(addrs: &[SocketAddr]) -> Result<Handed, String> {
    let mut conn = addrs
        .iter()
        .filter(|a| a.port() != 0)
        .find_map(|a| connect(&guard_name(*a)).ok())
        .ok_or("--upgrade: no running zgix holds any of this config's listen addresses")?;
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
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    let total: usize = lines
        .iter()
        .map(|w| match w.as_slice() {
            ["listener", _, n] => n.parse().unwrap_or(0),
            _ => 1,
        })
        .sum();
    let mut fds = recv_fds(conn.get_ref(), total).map_err(fail)?.into_iter();
    let mut out = Handed {
        listeners: Vec::new(),
        admin: None,
        guards: Vec::new(),
        pid,
        conn,
    };
    let bad =
        || format!("--upgrade: the running zgix sent a description zgix cannot read:\n{text}");
    for w in &lines {
        match w.as_slice() {
            ["listener", bind, n] => {
                let bind = bind.parse().map_err(|_| bad())?;
                let n: usize = n.parse().map_err(|_| bad())?;
                out.listeners.push((bind, fds.by_ref().take(n).collect()));
            }
            ["admin", bind] => {
                let bind = bind.parse().map_err(|_| bad())?;
                out.admin = fds.next().map(|fd| (bind, fd));
            }
            ["guard", name] => {
                if let Some(fd) = fds.next() {
                    let l = UnixListener::from(fd);
                    let _ = l.set_nonblocking(true);
                    out.guards.push(((*name).to_string(), l));
                }
            }
            _ => return Err(bad()),
        }
    }
    Ok(out)
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
    let peer = peer_pid(r.get_ref()).unwrap_or(0);
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
        for (name, fd) in &t.guards {
            text.push_str(&format!("guard {name}\n"));
            fds.push(*fd);
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

fn peer_pid(s: &UnixStream) -> io::Result<u32> {
    let mut cred: libc::ucred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred is a writable ucred of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.pid as u32)
}

fn send_fds(s: &UnixStream, fds: &[RawFd]) -> io::Result<()> {
    let byte = [b'F'];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let payload = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; every pointer set below stays valid for
    // the sendmsg call; the control buffer is aligned and `space` long.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(payload) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        if libc::sendmsg(s.as_raw_fd(), &msg, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn recv_fds(s: &UnixStream, total: usize) -> io::Result<Vec<OwnedFd>> {
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let mut byte = [0u8];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        // SAFETY: a pure size computation.
        let space =
            unsafe { libc::CMSG_SPACE((FDS_PER_MESSAGE * std::mem::size_of::<RawFd>()) as u32) }
                as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        // SAFETY: as in send_fds; descriptors received are taken into
        // OwnedFd once each.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let n = libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed mid-hand-off",
                ));
            }
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<RawFd>();
                    let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                        / std::mem::size_of::<RawFd>();
                    for i in 0..n {
                        out.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_cross_a_socket_pair_in_chunks() {
        let (a, b) = UnixStream::pair().unwrap();
        let files: Vec<std::fs::File> = (0..FDS_PER_MESSAGE + 3)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let raw: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
        for chunk in raw.chunks(FDS_PER_MESSAGE) {
            send_fds(&a, chunk).unwrap();
        }
        let got = recv_fds(&b, raw.len()).unwrap();
        assert_eq!(got.len(), raw.len());
        for fd in &got {
            assert!(
                !raw.contains(&fd.as_raw_fd()),
                "a received descriptor is a new number"
            );
        }
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
                .map(|(n, l)| (n.clone(), l.as_raw_fd()))
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
    }
}
