//! The TLS handshake of a client connection, before any HTTP: a first look at the ClientHello (plaintext HTTP answered 400 in cleartext, an unknown SNI refused with `unrecognized_name` when the listener says so, garbage closed with `decode_error`), then rustls to the end of the handshake within `handshake_timeout_ms`, each outcome classed for `zgix_tls_handshakes_total`.

use std::sync::Arc;
use std::time::Duration;

use zgix_config::{ListenerTls, SessionTickets, TlsVersion};
use zgix_tls::hello::{self, Hello};
use zgix_tls::server::{Listener as TlsSpec, MinVersion};
use zgix_tls::{CertStore, Loaded, Session, Tickets, UnknownSni};

use super::client::TlsConn;
use crate::io::Sock;
use crate::io::{put_send_buffer, take_record_buffer, take_send_buffer};

/// A TLS listener's runtime: its rustls configuration and certificates.
pub struct TlsListener {
    pub config: Arc<zgix_tls::ServerConfig>,
    /// The same without ALPN, for a client whose ALPN offer names none of
    /// `config.alpn_protocols` (`curl --http1.0` offers only `http/1.0`): the handshake goes
    /// on without ALPN and the connection speaks HTTP/1.x, as with nginx and
    /// HAProxy, instead of failing with `no_application_protocol`.
    pub config_without_alpn: Arc<zgix_tls::ServerConfig>,
    pub certs: Arc<CertStore>,
    pub handshake_timeout: Duration,
    /// Each certificate's first name and `notAfter` (for the expiry gauge).
    pub expiry: Vec<(String, i64)>,
}

/// One problem loading a listener's TLS files: its JSON path and rule.
pub type LoadProblem = (String, String);

impl TlsListener {
    /// Reads and checks every certificate and key of `t` (at `path`, e.g.
    /// `listeners[0].tls`); `tickets` are the process's generated keys.
    /// Returns every problem, and the warnings (certificates expiring soon).
    pub fn load(
        path: &str,
        t: &ListenerTls,
        tickets: &Arc<Tickets>,
        now: i64,
    ) -> Result<(TlsListener, Vec<LoadProblem>), Vec<LoadProblem>> {
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        let mut loaded: Vec<Loaded> = Vec::new();
        for (i, c) in t.certificates.iter().enumerate() {
            let at = format!("{path}.certificates[{i}]");
            match zgix_tls::load(c.cert.as_ref(), c.key.as_ref()) {
                Ok(l) => {
                    match zgix_tls::validity(&l, now) {
                        Err(e) => errors.push((format!("{at}.cert"), e)),
                        Ok(Some(w)) => warnings.push((format!("{at}.cert"), w)),
                        Ok(None) => {}
                    }
                    if l.names.is_empty() {
                        errors.push((
                            format!("{at}.cert"),
                            "the certificate names no host (no DNS SAN, no CN)".into(),
                        ));
                    }
                    loaded.push(l);
                }
                Err(e) => errors.push((at, e)),
            }
        }
        let unknown = match t.unknown_sni {
            zgix_config::UnknownSni::Default => UnknownSni::Default,
            zgix_config::UnknownSni::Refuse => UnknownSni::Refuse,
        };
        let store = if errors.is_empty() {
            match CertStore::new(&loaded, unknown) {
                Ok(s) => Some(s),
                Err(dups) => {
                    for (i, e) in dups {
                        errors.push((format!("{path}.certificates[{i}].cert"), e));
                    }
                    None
                }
            }
        } else {
            None
        };
        let tickets = match &t.session_tickets {
            SessionTickets::Generated => Some(tickets.clone()),
            SessionTickets::Off => None,
            SessionTickets::KeyFile(f) => match Tickets::from_file(f.as_ref()) {
                Ok(k) => Some(Arc::new(k)),
                Err(e) => {
                    errors.push((format!("{path}.session_tickets.key_file"), e));
                    None
                }
            },
        };
        let Some(store) = store.filter(|_| errors.is_empty()) else {
            return Err(errors);
        };
        let certs = Arc::new(store);
        let mut spec = TlsSpec {
            certs: certs.clone(),
            min_version: match t.min_version {
                TlsVersion::Tls12 => MinVersion::Tls12,
                TlsVersion::Tls13 => MinVersion::Tls13,
            },
            alpn: t.alpn.iter().map(|a| a.as_bytes().to_vec()).collect(),
            tickets,
        };
        let config = zgix_tls::server::config(&spec).map_err(|e| vec![(path.to_string(), e)])?;
        spec.alpn.clear();
        let config_without_alpn =
            zgix_tls::server::config(&spec).map_err(|e| vec![(path.to_string(), e)])?;
        Ok((
            TlsListener {
                config,
                config_without_alpn,
                certs,
                handshake_timeout: Duration::from_millis(t.handshake_timeout_ms),
                expiry: loaded
                    .iter()
                    .map(|l| (l.names.first().cloned().unwrap_or_default(), l.not_after))
                    .collect(),
            },
            warnings,
        ))
    }
}

/// How a handshake ended (the `result` label of `zgix_tls_handshakes_total`,
/// in the order of [`crate::observe::metrics::TLS_RESULTS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok = 0,
    Timeout,
    Alert,
    BadHello,
    NoCert,
    Plaintext,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::Timeout,
        Outcome::Alert,
        Outcome::BadHello,
        Outcome::NoCert,
        Outcome::Plaintext,
    ];

    /// The index of this outcome in [`crate::observe::metrics::TLS_RESULTS`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Timeout => "timeout",
            Outcome::Alert => "alert",
            Outcome::BadHello => "bad_hello",
            Outcome::NoCert => "no_cert",
            Outcome::Plaintext => "plaintext",
        }
    }
}

/// What a plaintext HTTP request on a TLS port gets (nginx answers 400
/// "The plain HTTP request was sent to HTTPS port" the same way).
const PLAINTEXT_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 35\r\nConnection: close\r\n\r\nThis port speaks HTTPS, not HTTP.\r\n";

/// Runs the server side of the handshake on `sock`, starting with `early`
/// (bytes already read, e.g. after a PROXY header). On success the
/// connection is returned; on failure, what the client was told is sent and
/// the outcome returned.
pub async fn accept(
    sock: &Sock,
    tls: &TlsListener,
    early: &[u8],
    restore_timeout: Option<Duration>,
) -> Result<Box<TlsConn>, Outcome> {
    let mut session = match Session::new(tls.config.clone()) {
        Ok(s) => s,
        Err(_) => return Err(Outcome::Alert),
    };
    sock.set_read_timeout(Some(tls.handshake_timeout));
    let deadline = sock.driver().now() + tls.handshake_timeout;
    // A pooled buffer: no 17 KiB allocation and zeroing per handshake.
    let mut inbuf = take_record_buffer();
    let mut len = early.len().min(inbuf.len());
    inbuf[..len].copy_from_slice(&early[..len]);
    let mut plain = Vec::new();
    let mut sni = None;
    let mut inspected = false;
    loop {
        if !inspected && len > 0 {
            match hello::inspect(&inbuf[..len], &tls.config.alpn_protocols) {
                Hello::Incomplete => {}
                Hello::Plaintext => {
                    refuse(sock, PLAINTEXT_ANSWER).await;
                    return Err(Outcome::Plaintext);
                }
                Hello::Bad(why) => {
                    crate::log_debug!("tls", "bad ClientHello: {why}");
                    refuse(sock, &hello::DECODE_ERROR_ALERT).await;
                    return Err(Outcome::BadHello);
                }
                Hello::ClientHello {
                    sni: name,
                    alpn_disjoint,
                } => {
                    if tls.certs.refuses(name.as_deref()) {
                        refuse(sock, &hello::UNRECOGNIZED_NAME_ALERT).await;
                        return Err(Outcome::NoCert);
                    }
                    if alpn_disjoint {
                        // rustls has read nothing yet: start it over on
                        // the configuration that does not negotiate ALPN.
                        session = match Session::new(tls.config_without_alpn.clone()) {
                            Ok(s) => s,
                            Err(_) => return Err(Outcome::Alert),
                        };
                    }
                    sni = name;
                    inspected = true;
                }
            }
        }
        if inspected && len > 0 {
            // The flight is encoded into a pooled send buffer: no buffer
            // grown (and freed) per flight.
            put_send_buffer(session.lend_output(take_send_buffer()));
            let r = session.read(&mut inbuf[..len], &mut |d| plain.extend_from_slice(d));
            let out = session.take_output();
            let mut hold = false;
            match &r {
                // The flight is the alert: the connection closes after it.
                Err(_) => sock.closing(),
                // The last flight (a TLS 1.3 session ticket) with the
                // client's first request already here (decrypted into
                // `plain`, or bytes after its Finished): held in the
                // session, it goes out in the same send as the first answer
                // (or before zgix first waits on the client:
                // `RecordStream::read`), one send, one segment and one
                // wake-up of the client fewer per connection.
                Ok(p)
                    if p.established
                        && !out.is_empty()
                        && (!plain.is_empty() || p.consumed < len) =>
                {
                    hold = true
                }
                Ok(_) => {}
            }
            let failed = if out.is_empty() || hold {
                session.hold(&out);
                put_send_buffer(out);
                false
            } else {
                sock.write_all_owned(out).await.is_err()
            };
            if failed {
                return Err(Outcome::Alert);
            }
            match r {
                Ok(p) => {
                    inbuf.copy_within(p.consumed..len, 0);
                    len -= p.consumed;
                    if p.established {
                        break;
                    }
                }
                Err(e) => {
                    crate::log_debug!("tls", "handshake failed: {e}");
                    let o = match e {
                        zgix_tls::Failure::BadHello(_) => Outcome::BadHello,
                        zgix_tls::Failure::NoCert => Outcome::NoCert,
                        zgix_tls::Failure::Alert(_) | zgix_tls::Failure::Refused { .. } => {
                            Outcome::Alert
                        }
                    };
                    return Err(o);
                }
            }
        }
        if len == inbuf.len() {
            refuse(sock, &hello::DECODE_ERROR_ALERT).await;
            return Err(Outcome::BadHello);
        }
        match sock.read(&mut inbuf[len..]).await {
            Ok(0) => {
                let o = if inspected {
                    Outcome::Alert
                } else {
                    Outcome::BadHello
                };
                return Err(o);
            }
            Ok(n) => len += n,
            Err(e) => {
                let o = if e.kind() == std::io::ErrorKind::TimedOut
                    || sock.driver().now() >= deadline
                {
                    Outcome::Timeout
                } else {
                    Outcome::Alert
                };
                return Err(o);
            }
        }
    }
    sock.set_read_timeout(restore_timeout);
    let info = session.info();
    // Bytes after the handshake's last record (the request, sent with the
    // client's Finished) stay for the first read.
    Ok(Box::new(TlsConn {
        stream: crate::io::RecordStream::new(session, inbuf, len, plain),
        info,
        sni,
    }))
}

/// The session-ticket keys of this process: made at start, shared by every
/// shard and every listener with generated tickets, kept across reloads
/// (and handed to an `--upgrade`).
static TICKETS: std::sync::OnceLock<Arc<Tickets>> = std::sync::OnceLock::new();

/// This process's generated ticket keys.
pub fn process_tickets() -> Arc<Tickets> {
    TICKETS
        .get_or_init(|| {
            Arc::new(Tickets::generate().expect("the system has no randomness for ticket keys"))
        })
        .clone()
}

/// The master secret of this process's ticket keys, once made.
pub fn current_ticket_master() -> Option<[u8; 32]> {
    TICKETS.get().and_then(|t| t.master())
}

/// Adopts the ticket master secret of the instance we take over from, so
/// its clients keep resuming; `false` if keys were made already.
pub fn adopt_ticket_master(master: [u8; 32]) -> bool {
    TICKETS.set(Arc::new(Tickets::derived(master))).is_ok()
}

/// What loading the TLS listeners of a config found.
pub struct LoadedTls {
    /// By listener index; `None` for plaintext listeners.
    pub listeners: Vec<Option<Arc<TlsListener>>>,
    /// `path: rule` for each certificate that expires soon.
    pub warnings: Vec<String>,
    /// TLS towards origins, by cluster index (`upstream::tls::load_all`).
    pub clusters: Vec<Option<Arc<crate::upstream::tls::ClusterTls>>>,
}

/// Reads and checks the certificates and keys of every TLS listener of
/// `config`; every problem comes back as `path: rule`, in listener order.
pub fn load_all(config: &zgix_config::Config) -> Result<LoadedTls, Vec<String>> {
    let now = zgix_tls::certs::now_secs();
    let mut out = LoadedTls {
        listeners: Vec::with_capacity(config.listeners.len()),
        warnings: Vec::new(),
        clusters: Vec::new(),
    };
    let mut errors = Vec::new();
    let tickets = config
        .listeners
        .iter()
        .any(|l| l.tls.is_some())
        .then(process_tickets);
    for (i, l) in config.listeners.iter().enumerate() {
        let (Some(t), Some(tickets)) = (&l.tls, &tickets) else {
            out.listeners.push(None);
            continue;
        };
        match TlsListener::load(&format!("listeners[{i}].tls"), t, tickets, now) {
            Ok((tl, warnings)) => {
                out.listeners.push(Some(Arc::new(tl)));
                out.warnings
                    .extend(warnings.into_iter().map(|(p, r)| format!("{p}: {r}")));
            }
            Err(problems) => {
                out.listeners.push(None);
                errors.extend(problems.into_iter().map(|(p, r)| format!("{p}: {r}")));
            }
        }
    }
    match crate::upstream::tls::load_all(config) {
        Ok((clusters, warnings)) => {
            out.clusters = clusters;
            out.warnings.extend(warnings);
        }
        Err(e) => errors.extend(e),
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Writes a refusal (an alert, the plaintext answer) on a connection that
/// closes after it: marked closing first, so the park does not wait on it.
async fn refuse(sock: &Sock, bytes: &[u8]) {
    sock.closing();
    let _ = sock.write_all(bytes).await;
}
