//! An upstream connection: a plain socket, or TLS over it for a cluster with `tls`, behind the calls the exchange, the tunnel, the pool and the prober make on it (connect, read, write_all, timeouts, is_stale, close).

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use crate::io::{Driver, Sock};
use crate::observe::decision::UpstreamError;
use crate::upstream::cluster::Upstreams;
use crate::upstream::tls::{self, TlsReason, TlsStream};

/// A connection to an origin. Dropping a TLS one sends `close_notify`
/// first ([`crate::io::RecordStream::close_now`]): the pool closing it idle, a reload or
/// a drain, like every close zgix starts.
pub enum UpConn {
    Plain(Sock),
    Tls(Sock, Box<TlsStream>),
}

impl Drop for UpConn {
    fn drop(&mut self) {
        if let UpConn::Tls(s, t) = self {
            t.close_now(s);
        }
    }
}

impl UpConn {
    /// Connects to endpoint slot `ep` at `addr` within `timeout`, then, for
    /// a TLS cluster, runs the handshake within `timeout` again. A TLS
    /// failure is a connect failure (nothing of the request was sent), so
    /// it is retried on another endpoint and counts against this one.
    pub async fn connect(
        driver: &Rc<Driver>,
        up: &Upstreams,
        ep: usize,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<UpConn, UpstreamError> {
        let sock = Sock::connect(driver, addr, timeout)
            .await
            .map_err(|e| match e.kind() {
                io::ErrorKind::ConnectionRefused => UpstreamError::ConnectRefused,
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                    UpstreamError::ConnectTimeout
                }
                _ => UpstreamError::ConnectOther,
            })?;
        let u = &up.upstreams[ep];
        let Some(t) = up.clusters[u.cluster].tls.get() else {
            return Ok(UpConn::Plain(sock));
        };
        let fail = |r: TlsReason| {
            up.clusters[u.cluster].tls_failures.failed(r);
            crate::log_debug!(
                "upstream",
                "clusters.{}: TLS handshake with {} failed: {}",
                up.clusters[u.cluster].name,
                u.label,
                r.label()
            );
            if r == TlsReason::Timeout {
                UpstreamError::ConnectTimeout
            } else {
                UpstreamError::ConnectTls
            }
        };
        let name = t
            .name_for(&u.target)
            .ok_or_else(|| fail(TlsReason::BadName))?;
        match tls::handshake(&sock, t, name, timeout).await {
            Ok(s) => Ok(UpConn::Tls(sock, s)),
            Err(r) => Err(fail(r)),
        }
    }

    /// The socket underneath.
    pub fn sock(&self) -> &Sock {
        match self {
            UpConn::Plain(s) | UpConn::Tls(s, _) => s,
        }
    }

    pub fn driver(&self) -> &Rc<Driver> {
        self.sock().driver()
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, UpConn::Tls(..))
    }

    /// Whether a TLS session was resumed (false on plain connections).
    pub fn resumed(&self) -> bool {
        match self {
            UpConn::Plain(_) => false,
            UpConn::Tls(_, t) => t.session().info().resumed,
        }
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) {
        self.sock().set_read_timeout(d)
    }

    pub fn set_write_timeout(&self, d: Option<Duration>) {
        self.sock().set_write_timeout(d)
    }

    /// Reads what is there (decrypted on TLS), waiting up to the read
    /// timeout for at least a byte; 0 at the end.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            UpConn::Plain(s) => s.read(buf).await,
            UpConn::Tls(s, t) => t.read(s, buf).await,
        }
    }

    /// Writes all of `buf` (encrypted on TLS).
    pub async fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        match self {
            UpConn::Plain(s) => s.write_all(buf).await,
            UpConn::Tls(s, t) => t.write_all(s, buf).await,
        }
    }

    /// True when a pooled connection was closed by the origin or has
    /// something unread (see [`Sock::is_stale`]); on TLS also when bytes
    /// wait in the session.
    pub fn is_stale(&self) -> bool {
        match self {
            UpConn::Plain(s) => s.is_stale(),
            UpConn::Tls(s, t) => t.holds_input() || s.is_stale(),
        }
    }

    /// Ends the sending side (TLS: `close_notify` first).
    pub async fn shutdown(&self) {
        self.sock().closing();
        if let UpConn::Tls(s, t) = self {
            t.close(s).await;
        }
        self.sock().shutdown_write();
    }
}
