//! The client side of a connection: a plain socket, or TLS over it (the stream of `io::record_stream`, shared with origin connections), behind the calls the exchange makes (read, readable, write_all, shutdown).

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use zgix_tls::session::ServerSide;
use zgix_tls::Info;

use crate::io::{RecordStream, Sock};

/// A client connection's transport: the socket, and TLS over it once the
/// handshake is done; or one HTTP/2 stream of such a connection, which the
/// request loop reads and writes as HTTP/1.1 (see [`super::h2`]).
pub struct ClientConn {
    inner: Inner,
}

enum Inner {
    Net {
        sock: Sock,
        tls: Option<Box<TlsConn>>,
    },
    H2(super::h2::PlacedStreamIo),
}

/// TLS state of a client connection, after the handshake.
pub struct TlsConn {
    pub(super) stream: RecordStream<ServerSide>,
    pub(super) info: Info,
    pub(super) sni: Option<String>,
}

impl ClientConn {
    pub fn plain(sock: Sock) -> ClientConn {
        ClientConn {
            inner: Inner::Net { sock, tls: None },
        }
    }

    /// One HTTP/2 stream as a client of its own.
    pub(super) fn h2(io: super::h2::PlacedStreamIo) -> ClientConn {
        ClientConn {
            inner: Inner::H2(io),
        }
    }

    /// From now on the connection speaks TLS (the handshake is done).
    pub fn start_tls(&mut self, t: Box<TlsConn>) {
        if let Inner::Net { tls, .. } = &mut self.inner {
            *tls = Some(t);
        }
    }

    /// The socket underneath; `None` for an HTTP/2 stream.
    pub fn sock(&self) -> Option<&Sock> {
        match &self.inner {
            Inner::Net { sock, .. } => Some(sock),
            Inner::H2(_) => None,
        }
    }

    /// The HTTP/2 stream this client is, if it is one.
    pub(super) fn stream(&self) -> Option<&super::h2::StreamIo> {
        match &self.inner {
            Inner::H2(io) => Some(io),
            Inner::Net { .. } => None,
        }
    }

    /// Whether this is an HTTP/2 stream (the access log's protocol).
    pub fn is_h2(&self) -> bool {
        matches!(self.inner, Inner::H2(_))
    }

    /// The protocol ALPN settled on a TLS connection.
    pub fn alpn(&self) -> Option<&[u8]> {
        match &self.inner {
            Inner::Net { tls: Some(t), .. } => t.info.alpn.as_deref(),
            _ => None,
        }
    }

    pub fn fd(&self) -> RawFd {
        self.sock().map_or(-1, Sock::fd)
    }

    /// What the TLS handshake settled, on a TLS connection.
    pub fn tls(&self) -> Option<(&Info, Option<&str>)> {
        match &self.inner {
            Inner::Net { tls, .. } => tls.as_ref().map(|t| (&t.info, t.sni.as_deref())),
            Inner::H2(_) => None,
        }
    }

    /// The access log's TLS fields and SNI; `None` on plaintext.
    pub fn log_facts(&self) -> (Option<crate::observe::access_log::TlsFacts>, Option<&[u8]>) {
        match &self.inner {
            Inner::Net { tls: None, .. } => (None, None),
            Inner::Net { tls: Some(t), .. } => (
                Some(crate::observe::access_log::TlsFacts {
                    version: t.info.version,
                    cipher: t.info.cipher,
                    resumed: t.info.resumed,
                }),
                t.sni.as_deref().map(str::as_bytes),
            ),
            Inner::H2(io) => io.log_facts(),
        }
    }

    /// Application bytes received (decrypted on TLS; the request as HTTP/1.1
    /// on an HTTP/2 stream).
    pub fn bytes_read(&self) -> u64 {
        match &self.inner {
            Inner::Net { sock, tls: None } => sock.bytes_read(),
            Inner::Net { tls: Some(t), .. } => t.stream.bytes_read(),
            Inner::H2(io) => io.rx.get(),
        }
    }

    /// Application bytes sent (before encryption on TLS; the response as
    /// HTTP/1.1 on an HTTP/2 stream).
    pub fn bytes_written(&self) -> u64 {
        match &self.inner {
            Inner::Net { sock, tls: None } => sock.bytes_written(),
            Inner::Net { tls: Some(t), .. } => t.stream.bytes_written(),
            Inner::H2(io) => io.tx.get(),
        }
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) {
        match &self.inner {
            Inner::Net { sock, .. } => sock.set_read_timeout(d),
            Inner::H2(io) => io.read_timeout.set(d),
        }
    }

    pub fn set_write_timeout(&self, d: Option<Duration>) {
        match &self.inner {
            Inner::Net { sock, .. } => sock.set_write_timeout(d),
            Inner::H2(io) => io.write_timeout.set(d),
        }
    }

    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        match &self.inner {
            Inner::Net { sock, .. } => sock.set_nodelay(on),
            Inner::H2(_) => Ok(()),
        }
    }

    /// Reads what is available, waiting (up to the read timeout) for at
    /// least a byte; 0 at the end (TLS: `close_notify`, or the peer's FIN).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.inner {
            Inner::Net { sock, tls: None } => sock.read(buf).await,
            Inner::Net { sock, tls: Some(t) } => t.stream.read(sock, buf).await,
            Inner::H2(io) => io.read(buf).await,
        }
    }

    /// [`ClientConn::read`] with the TLS read's state on the heap: for a
    /// future that an idle connection holds (the head read), which stays
    /// as small as a plain read so (a TLS read may write and is several
    /// times larger).
    pub async fn read_lean(&self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.inner {
            Inner::Net { sock, tls: None } => sock.read(buf).await,
            Inner::Net { sock, tls: Some(t) } => Box::pin(t.stream.read(sock, buf)).await,
            Inner::H2(io) => match io.try_read(buf) {
                Some(n) => Ok(n),
                None => Box::pin(io.read(buf)).await,
            },
        }
    }

    /// Waits (up to the read timeout) until a read would complete at once.
    pub async fn readable(&self) -> io::Result<()> {
        match &self.inner {
            Inner::Net { sock, tls } => {
                if tls.as_ref().is_some_and(|t| t.stream.ready()) {
                    return Ok(());
                }
                sock.readable().await
            }
            Inner::H2(io) if io.ready() => Ok(()),
            Inner::H2(io) => Box::pin(io.readable()).await,
        }
    }

    /// Writes all of `buf` (encrypted on TLS).
    pub async fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        match &self.inner {
            Inner::Net { sock, tls: None } => sock.write_all(buf).await,
            Inner::Net { sock, tls: Some(t) } => t.stream.write_all(sock, buf).await,
            Inner::H2(io) => io.write_all(buf).await,
        }
    }

    /// Writes all of `buf`, the last bytes zgix sends on the connection:
    /// on TLS `close_notify` goes in the same send (one segment fewer; the
    /// [`ClientConn::shutdown`] after sends none).
    pub async fn write_all_last(&self, buf: &[u8]) -> io::Result<()> {
        match &self.inner {
            Inner::Net { sock, tls: None } => sock.write_all(buf).await,
            Inner::Net { sock, tls: Some(t) } => t.stream.write_all_last(sock, buf).await,
            Inner::H2(io) => io.write_all(buf).await,
        }
    }

    /// Says that the connection closes after what is written from now on
    /// (see [`Sock::closing`]); call it before the last answer is written.
    /// An HTTP/2 stream's end does not close its connection: a no-op there.
    pub fn closing(&self) {
        if let Inner::Net { sock, .. } = &self.inner {
            sock.closing();
        }
    }

    /// Half-closes the sending side; TLS sends `close_notify` first
    /// (RFC 8446 §6.1: each party sends one before closing its write side);
    /// an HTTP/2 stream ends its response (or resets an unfinished one).
    pub async fn shutdown(&self) {
        let (sock, tls) = match &self.inner {
            Inner::Net { sock, tls } => (sock, tls),
            Inner::H2(io) => return io.finish(),
        };
        sock.closing();
        if let Some(t) = tls {
            t.stream.close(sock).await;
        }
        sock.shutdown_write();
    }

    /// The driver the connection's waits run on.
    pub fn now(&self) -> std::time::Instant {
        match &self.inner {
            Inner::Net { sock, .. } => sock.driver().now(),
            Inner::H2(io) => io.driver.now(),
        }
    }
}

/// What a tunnel relays between: either side of an upgraded connection.
pub(crate) trait Stream {
    async fn read(&self, buf: &mut [u8]) -> io::Result<usize>;
    async fn write_all(&self, buf: &[u8]) -> io::Result<()>;
    fn set_read_timeout(&self, d: Option<Duration>);
    fn set_write_timeout(&self, d: Option<Duration>);
    /// Ends the sending side (TLS: after `close_notify`).
    async fn close_write(&self);
    fn now(&self) -> std::time::Instant;
}

impl Stream for Sock {
    async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        Sock::read(self, buf).await
    }
    async fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        Sock::write_all(self, buf).await
    }
    fn set_read_timeout(&self, d: Option<Duration>) {
        Sock::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) {
        Sock::set_write_timeout(self, d)
    }
    async fn close_write(&self) {
        self.shutdown_write()
    }
    fn now(&self) -> std::time::Instant {
        self.driver().now()
    }
}

impl Stream for ClientConn {
    async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        ClientConn::read(self, buf).await
    }
    async fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        ClientConn::write_all(self, buf).await
    }
    fn set_read_timeout(&self, d: Option<Duration>) {
        ClientConn::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) {
        ClientConn::set_write_timeout(self, d)
    }
    async fn close_write(&self) {
        self.shutdown().await
    }
    fn now(&self) -> std::time::Instant {
        ClientConn::now(self)
    }
}
