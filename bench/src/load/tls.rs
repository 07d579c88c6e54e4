//! HTTPS for `zgix-bench load`: a load connection is a plain TCP stream or rustls' client over one, behind the same `AsyncRead`/`AsyncWrite`, so the open-loop p99 can be taken of a TLS listener too. The server's certificate is not checked (a loopback benchmark of our own throw-away certificates, as wrk does not check either).

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme};
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

/// `https://host[:port]/path` → `(true, "http://host:port/path")` (443 when
/// no port is given), anything else → `(false, url)`, for `parse_url`.
pub fn scheme(url: &str) -> (bool, String) {
    let Some(rest) = url.strip_prefix("https://") else {
        return (false, url.to_string());
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let port = if authority.ends_with(']') || !authority.contains(':') {
        ":443"
    } else {
        ""
    };
    (true, format!("http://{authority}{port}{path}"))
}

/// A client configuration offering `http/1.1`, with tickets kept across a
/// connection's reopenings (rustls' default resumption store).
pub fn client_config() -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut c = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("the aws-lc-rs provider supports TLS 1.2 and 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(c)
}

/// Accepts any certificate; signatures are still checked by the provider, so
/// a handshake is the full work a verifying client does but for the chain.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// One load connection.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsConn>),
}

impl Conn {
    /// Wraps a connected stream in TLS towards `host` (an IP address sends no
    /// SNI). The handshake runs inside the first write and read.
    pub fn tls(s: TcpStream, config: &Arc<ClientConfig>, host: &str) -> io::Result<Conn> {
        let name = host_only(host);
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let tls = ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
        Ok(Conn::Tls(Box::new(TlsConn {
            sock: s,
            tls,
            rbuf: vec![0; 18 * 1024].into_boxed_slice(),
            wbuf: Vec::new(),
            wpos: 0,
        })))
    }
}

/// `host:port` or `[v6]:port` → the host alone, brackets dropped.
fn host_only(authority: &str) -> &str {
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

/// rustls' client over a glommio stream: records are read into `rbuf` and
/// fed to rustls; what rustls has to send goes out through `wbuf`.
pub struct TlsConn {
    sock: TcpStream,
    tls: ClientConnection,
    rbuf: Box<[u8]>,
    wbuf: Vec<u8>,
    wpos: usize,
}

impl TlsConn {
    /// Writes every record rustls has queued.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.wpos < self.wbuf.len() {
                let n = ready!(Pin::new(&mut self.sock).poll_write(cx, &self.wbuf[self.wpos..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.wpos += n;
                continue;
            }
            self.wbuf.clear();
            self.wpos = 0;
            if !self.tls.wants_write() {
                return Poll::Ready(Ok(()));
            }
            self.tls.write_tls(&mut self.wbuf)?;
        }
    }
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let t = match self.get_mut() {
            Conn::Plain(s) => return Pin::new(s).poll_read(cx, buf),
            Conn::Tls(t) => t,
        };
        loop {
            // Handshake messages (and any request bytes) go out first; a
            // full socket does not keep the read from waiting too.
            if let Poll::Ready(Err(e)) = t.poll_send(cx) {
                return Poll::Ready(Err(e));
            }
            match t.tls.reader().read(buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            let n = ready!(Pin::new(&mut t.sock).poll_read(cx, &mut t.rbuf))?;
            if n == 0 {
                // rustls reports a close without close_notify as UnexpectedEof.
                t.tls.read_tls(&mut &[][..])?;
                t.tls.process_new_packets().map_err(tls_error)?;
                continue;
            }
            let mut rd = &t.rbuf[..n];
            while !rd.is_empty() {
                t.tls.read_tls(&mut rd)?;
                t.tls.process_new_packets().map_err(tls_error)?;
            }
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let t = match self.get_mut() {
            Conn::Plain(s) => return Pin::new(s).poll_write(cx, buf),
            Conn::Tls(t) => t,
        };
        // rustls keeps plaintext written before the handshake ends and
        // sends it after; the records go out now or at the next flush.
        let n = t.tls.writer().write(buf)?;
        if let Poll::Ready(Err(e)) = t.poll_send(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(t) => t.poll_send(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_close(cx),
            Conn::Tls(t) => {
                t.tls.send_close_notify();
                ready!(t.poll_send(cx))?;
                Pin::new(&mut t.sock).poll_close(cx)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{host_only, scheme};

    #[test]
    fn an_https_url_becomes_http_with_its_port() {
        assert_eq!(
            scheme("https://127.0.0.1/x"),
            (true, "http://127.0.0.1:443/x".into())
        );
        assert_eq!(
            scheme("https://127.0.0.1:8443"),
            (true, "http://127.0.0.1:8443".into())
        );
        assert_eq!(scheme("https://[::1]/"), (true, "http://[::1]:443/".into()));
        assert_eq!(
            scheme("http://127.0.0.1/"),
            (false, "http://127.0.0.1/".into())
        );
        assert_eq!(host_only("127.0.0.1:443"), "127.0.0.1");
        assert_eq!(host_only("[::1]:443"), "::1");
        assert_eq!(host_only("bench.example:8443"), "bench.example");
    }
}
