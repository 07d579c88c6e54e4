//! TLS to origins (`clusters.NAME.tls`): each cluster's client configuration read and checked at load, the client handshake on a connected socket (within the connect timeout, each failure classed for `zgix_upstream_tls_failures_total`), and the encrypted stream over the socket that the exchange reads and writes like a plain one.
//!
//! The stream is the client-side twin of `conn::client::TlsConn`: received
//! records go into a per-shard pooled buffer held only while a partial record
//! waits, are decrypted in place, and their payload is copied once into the
//! caller's buffer; writes are encrypted into one send buffer. No borrow of
//! the session is held across an await, so the request body can stream up
//! while the response streams down on the same connection.

use std::cell::{Cell, RefCell};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use zgix_config::{Config, Target, UpstreamTls};
use zgix_tls::{ClientConfig, ClientSession, Failure, ServerName};

use crate::io::{put_record_buffer, take_record_buffer, Sock};

/// Why a handshake with an origin failed: the `reason` label of
/// `zgix_upstream_tls_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsReason {
    /// The certificate chain does not lead to a trusted CA.
    UnknownCa = 0,
    /// The certificate does not name the expected server name.
    BadName,
    /// Expired, not yet valid, wrong purpose, bad encoding or signature.
    BadCertificate,
    /// The origin sent an alert or broke the protocol.
    Alert,
    /// The origin closed or reset the connection during the handshake.
    Closed,
    /// The handshake did not finish within the connect timeout.
    Timeout,
}

impl TlsReason {
    pub const ALL: [TlsReason; 6] = [
        TlsReason::UnknownCa,
        TlsReason::BadName,
        TlsReason::BadCertificate,
        TlsReason::Alert,
        TlsReason::Closed,
        TlsReason::Timeout,
    ];

    pub fn label(self) -> &'static str {
        match self {
            TlsReason::UnknownCa => "unknown_ca",
            TlsReason::BadName => "bad_name",
            TlsReason::BadCertificate => "bad_certificate",
            TlsReason::Alert => "alert",
            TlsReason::Closed => "closed",
            TlsReason::Timeout => "timeout",
        }
    }

    fn of(f: &Failure) -> TlsReason {
        match f {
            Failure::Refused { reason, .. } => match *reason {
                "unknown_ca" => TlsReason::UnknownCa,
                "bad_name" => TlsReason::BadName,
                _ => TlsReason::BadCertificate,
            },
            _ => TlsReason::Alert,
        }
    }
}

/// A cluster's TLS towards its origins, shared by every shard.
pub struct ClusterTls {
    pub config: Arc<ClientConfig>,
    /// `server_name`, parsed; `None`: each endpoint's own host or address.
    pub server_name: Option<ServerName<'static>>,
    /// The settings it was made from: a pooled connection moves to the
    /// next generation's pool only if they are the same.
    pub spec: UpstreamTls,
}

/// Failed handshakes with a cluster's origins by [`TlsReason`]: held by the
/// cluster (`ClusterRt::tls_failures`) and carried over a reload by its
/// name, so the counter never goes back.
#[derive(Default)]
pub struct TlsFailures([AtomicU64; TlsReason::ALL.len()]);

impl TlsFailures {
    pub fn failed(&self, r: TlsReason) {
        self.0[r as usize].fetch_add(1, Relaxed);
    }

    pub fn get(&self, r: TlsReason) -> u64 {
        self.0[r as usize].load(Relaxed)
    }
}

impl ClusterTls {
    /// Reads and checks the CA file of `t` (at `path`, e.g.
    /// `clusters.web.tls`).
    pub fn load(path: &str, t: &UpstreamTls) -> Result<ClusterTls, String> {
        let origin = zgix_tls::client::Origin {
            ca: t.ca.as_deref().map(std::path::Path::new),
            verify: t.verify,
        };
        let at = if t.ca.is_some() {
            format!("{path}.ca")
        } else {
            path.to_string()
        };
        let config = zgix_tls::client::config(&origin).map_err(|e| format!("{at}: {e}"))?;
        let server_name = match &t.server_name {
            Some(n) => Some(
                zgix_tls::client::server_name(n).map_err(|e| format!("{path}.server_name: {e}"))?,
            ),
            None => None,
        };
        Ok(ClusterTls {
            config,
            server_name,
            spec: t.clone(),
        })
    }

    /// The name endpoint `target` is checked against.
    pub fn name_for(&self, target: &Target) -> Option<ServerName<'static>> {
        match (&self.server_name, target) {
            (Some(n), _) => Some(n.clone()),
            (None, Target::Name { host, .. }) => zgix_tls::client::server_name(host).ok(),
            (None, Target::Ip(a)) => Some(ServerName::IpAddress(a.ip().into())),
        }
    }
}

/// What loading the clusters' TLS found: by cluster index (the config's
/// order), and a warning per cluster that does not verify.
pub type LoadedClusters = (Vec<Option<Arc<ClusterTls>>>, Vec<String>);

/// Reads every cluster's TLS settings; every problem comes back as
/// `path: rule`.
pub fn load_all(config: &Config) -> Result<LoadedClusters, Vec<String>> {
    let mut out = Vec::with_capacity(config.clusters.len());
    let mut warnings = Vec::new();
    let mut errors = Vec::new();
    for (name, c) in &config.clusters {
        let Some(t) = &c.tls else {
            out.push(None);
            continue;
        };
        let path = format!("clusters.{name}.tls");
        if !t.verify {
            warnings.push(format!(
                "{path}.verify: false: the origins' certificates are not checked, so anyone on the path to them can read and change the traffic"
            ));
        }
        match ClusterTls::load(&path, t) {
            Ok(ct) => out.push(Some(Arc::new(ct))),
            Err(e) => {
                errors.push(e);
                out.push(None);
            }
        }
    }
    if errors.is_empty() {
        Ok((out, warnings))
    } else {
        Err(errors)
    }
}

/// TLS over an upstream socket, after the handshake.
pub struct TlsStream {
    session: RefCell<ClientSession>,
    /// Received TLS bytes not yet decrypted (a partial record), in a pooled
    /// buffer held only while there are some.
    inbuf: RefCell<Option<Box<[u8]>>>,
    in_len: Cell<usize>,
    /// Decrypted bytes that did not fit the caller's buffer.
    plain: RefCell<Vec<u8>>,
    plain_pos: Cell<usize>,
    peer_closed: Cell<bool>,
    /// A write is under way (its future holds the socket's send side): a
    /// `close_notify` sent now could land inside one of its records.
    writing: Cell<bool>,
}

/// Runs the client handshake on `sock` for `name` within `timeout`.
pub async fn handshake(
    sock: &Sock,
    tls: &ClusterTls,
    name: ServerName<'static>,
    timeout: Duration,
) -> Result<Box<TlsStream>, TlsReason> {
    let session = ClientSession::new(tls.config.clone(), name).map_err(|e| {
        crate::log_debug!("upstream", "TLS session: {e}");
        TlsReason::Alert
    })?;
    sock.set_read_timeout(Some(timeout));
    let r = sock
        .driver()
        .clone()
        .timeout(timeout, run_handshake(sock, session))
        .await
        .unwrap_or(Err(TlsReason::Timeout));
    sock.set_read_timeout(None);
    r
}

async fn run_handshake(
    sock: &Sock,
    mut session: ClientSession,
) -> Result<Box<TlsStream>, TlsReason> {
    let mut inbuf = take_record_buffer();
    let mut len = 0;
    let mut plain = Vec::new();
    let gone = |e: io::Error| {
        if matches!(
            e.kind(),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
        ) {
            TlsReason::Timeout
        } else {
            TlsReason::Closed
        }
    };
    loop {
        // The first round, on no input, queues the ClientHello.
        let r = session.read(&mut inbuf[..len], &mut |d| plain.extend_from_slice(d));
        let out = session.take_output();
        if !out.is_empty() {
            sock.write_all(&out).await.map_err(gone)?;
        }
        match r {
            Ok(p) => {
                inbuf.copy_within(p.consumed..len, 0);
                len -= p.consumed;
                if p.established {
                    break;
                }
                if p.peer_closed {
                    return Err(TlsReason::Closed);
                }
            }
            Err(e) => {
                crate::log_debug!("upstream", "TLS handshake with the origin failed: {e}");
                return Err(TlsReason::of(&e));
            }
        }
        if len == inbuf.len() {
            return Err(TlsReason::Alert);
        }
        match sock.read(&mut inbuf[len..]).await {
            Ok(0) => return Err(TlsReason::Closed),
            Ok(n) => len += n,
            Err(e) => return Err(gone(e)),
        }
    }
    let keep = if len > 0 {
        Some(inbuf)
    } else {
        put_record_buffer(inbuf);
        None
    };
    Ok(Box::new(TlsStream {
        session: RefCell::new(session),
        inbuf: RefCell::new(keep),
        in_len: Cell::new(len),
        plain: RefCell::new(plain),
        plain_pos: Cell::new(0),
        peer_closed: Cell::new(false),
        writing: Cell::new(false),
    }))
}

fn invalid(e: Failure) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

impl TlsStream {
    /// Bytes received and not yet handed out (decrypted or not): a pooled
    /// connection holding some is not reused.
    pub fn holds_input(&self) -> bool {
        self.has_plain() || self.in_len.get() > 0 || self.peer_closed.get()
    }

    fn has_plain(&self) -> bool {
        self.plain_pos.get() < self.plain.borrow().len()
    }

    fn take_plain(&self, buf: &mut [u8]) -> usize {
        let mut p = self.plain.borrow_mut();
        let pos = self.plain_pos.get();
        let n = (p.len() - pos).min(buf.len());
        buf[..n].copy_from_slice(&p[pos..pos + n]);
        if pos + n == p.len() {
            p.clear();
            if p.capacity() > 4096 {
                *p = Vec::new();
            }
            self.plain_pos.set(0);
        } else {
            self.plain_pos.set(pos + n);
        }
        n
    }

    /// Reads decrypted bytes (0 at `close_notify` or the origin's FIN).
    pub async fn read(&self, sock: &Sock, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.has_plain() {
                return Ok(self.take_plain(buf));
            }
            if self.peer_closed.get() {
                return Ok(0);
            }
            let mut inbuf = self
                .inbuf
                .borrow_mut()
                .take()
                .unwrap_or_else(take_record_buffer);
            let have = self.in_len.get();
            let n = match sock.read(&mut inbuf[have..]).await {
                Ok(n) => n,
                Err(e) => {
                    self.stash(inbuf);
                    return Err(e);
                }
            };
            if n == 0 {
                // A FIN without close_notify: the HTTP framing above sees
                // whether the answer was cut.
                self.stash(inbuf);
                self.peer_closed.set(true);
                continue;
            }
            let len = have + n;
            let mut copied = 0;
            let result = {
                let mut plain = self.plain.borrow_mut();
                self.session.borrow_mut().read(&mut inbuf[..len], &mut |d| {
                    let k = (buf.len() - copied).min(d.len());
                    buf[copied..copied + k].copy_from_slice(&d[..k]);
                    copied += k;
                    plain.extend_from_slice(&d[k..]);
                })
            };
            match result {
                Ok(p) => {
                    inbuf.copy_within(p.consumed..len, 0);
                    self.in_len.set(len - p.consumed);
                    if p.peer_closed {
                        self.peer_closed.set(true);
                    }
                    self.stash(inbuf);
                    if copied > 0 {
                        return Ok(copied);
                    }
                }
                Err(e) => {
                    self.in_len.set(0);
                    put_record_buffer(inbuf);
                    self.flush(sock).await;
                    return Err(invalid(e));
                }
            }
        }
    }

    fn stash(&self, inbuf: Box<[u8]>) {
        if self.in_len.get() > 0 {
            *self.inbuf.borrow_mut() = Some(inbuf);
        } else {
            put_record_buffer(inbuf);
        }
    }

    /// Encrypts and sends all of `buf`.
    pub async fn write_all(&self, sock: &Sock, buf: &[u8]) -> io::Result<()> {
        let out = {
            let mut s = self.session.borrow_mut();
            s.write(buf).map_err(invalid)?;
            s.take_output()
        };
        let r = self.send(sock, &out).await;
        self.session.borrow_mut().give_back(out);
        r
    }

    /// Sends TLS bytes, marked as under way until done (see
    /// [`TlsStream::close_now`]).
    async fn send(&self, sock: &Sock, out: &[u8]) -> io::Result<()> {
        self.writing.set(true);
        let r = sock.write_all(out).await;
        self.writing.set(false);
        r
    }

    /// Sends `close_notify` (RFC 8446 §6.1).
    pub async fn close(&self, sock: &Sock) {
        let out = {
            let mut s = self.session.borrow_mut();
            s.close();
            s.take_output()
        };
        if !out.is_empty() {
            let _ = self.send(sock, &out).await;
        }
    }

    /// Sends `close_notify` without waiting, as zgix drops the connection
    /// (the pool closing an idle one at its idle timeout, a reload or a
    /// drain; an exchange given up). Skipped while a write is under way, or
    /// once the session has sent one or failed. The record (24 bytes) goes
    /// into the empty send buffer of a connection that is not writing; if
    /// the kernel takes no byte, the FIN follows alone.
    pub fn close_now(&self, sock: &Sock) {
        if self.writing.get() {
            return;
        }
        let out = {
            let mut s = self.session.borrow_mut();
            s.close();
            s.take_output()
        };
        if !out.is_empty() {
            // SAFETY: the socket's fd is open for as long as `sock` lives;
            // `out` is valid for its length.
            unsafe {
                libc::send(
                    sock.fd(),
                    out.as_ptr().cast(),
                    out.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
        }
    }

    async fn flush(&self, sock: &Sock) {
        let out = self.session.borrow_mut().take_output();
        if !out.is_empty() {
            let _ = self.send(sock, &out).await;
        }
    }

    /// Whether the session was resumed from an earlier one to the origin.
    pub fn resumed(&self) -> bool {
        self.session.borrow().info().resumed
    }
}
