//! TLS to origins (`clusters.NAME.tls`): each cluster's client configuration read and checked at load, the client handshake on a connected socket (within the connect timeout, each failure classed for `zgix_upstream_tls_failures_total`), and the encrypted stream over the socket that the exchange reads and writes like a plain one.
//!
//! The stream after the handshake is `io::record_stream`'s, the same as a
//! client connection's.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use zgix_config::{Config, Target, UpstreamTls};
use zgix_tls::{ClientConfig, ClientSession, Failure, ServerName};

use crate::io::{take_record_buffer, RecordStream, Sock};

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
pub type TlsStream = RecordStream<zgix_tls::client::ClientSide>;

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
    Ok(Box::new(RecordStream::new(session, inbuf, len, plain)))
}
