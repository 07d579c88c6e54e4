//! A TLS listener's rustls configuration: its certificates by SNI, the versions it accepts (1.2 and 1.3, or 1.3 only; never 1.1, 1.0 or SSLv3), the server's cipher-suite preference (AES-128-GCM first), its ALPN list, and its session tickets.

use std::sync::Arc;

use rustls::server::NoServerSessionStorage;
use rustls::ServerConfig;

use crate::{CertStore, Tickets};

/// Which versions a listener accepts (`tls.min_version`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MinVersion {
    Tls12,
    Tls13,
}

/// What a TLS listener is made of.
pub struct Listener {
    pub certs: Arc<CertStore>,
    pub min_version: MinVersion,
    /// ALPN protocol names in preference order (`tls.alpn`).
    pub alpn: Vec<Vec<u8>>,
    /// `None`: no tickets (`session_tickets: false`).
    pub tickets: Option<Arc<Tickets>>,
}

/// Session tickets sent after a full TLS 1.3 handshake. One is enough for
/// a client that opens one connection at a time; each costs an encryption.
pub const TLS13_TICKETS: usize = 1;

/// The rustls configuration of a listener, shared by its connections.
pub fn config(l: &Listener) -> Result<Arc<ServerConfig>, String> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| suite_rank(s.suite()));
    let provider = Arc::new(provider);
    let versions: &[&'static rustls::SupportedProtocolVersion] = match l.min_version {
        MinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        MinVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let mut c = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(l.certs.clone());
    c.alpn_protocols = l.alpn.clone();
    // Resumption only through tickets: a session cache would be per shard
    // (and per box), so a client landing elsewhere would not resume.
    c.session_storage = Arc::new(NoServerSessionStorage {});
    match &l.tickets {
        Some(t) => {
            c.ticketer = t.clone();
            c.send_tls13_tickets = TLS13_TICKETS;
        }
        None => c.send_tls13_tickets = 0,
    }
    c.max_early_data_size = 0;
    // The server's order, not the client's: most clients (OpenSSL's
    // default) put AES-256-GCM-SHA384 first, whose transcript hash and
    // HKDF run SHA-384 without hardware help; SHA-256 has SHA-NI.
    c.ignore_client_order = true;
    Ok(Arc::new(c))
}

/// Server preference: AES-128-GCM (SHA-256) first, then AES-256-GCM, then
/// ChaCha20-Poly1305, in each version (a sort key; equal keys keep the
/// provider's order).
fn suite_rank(s: rustls::CipherSuite) -> u8 {
    use rustls::CipherSuite as C;
    match s {
        C::TLS13_AES_128_GCM_SHA256 => 0,
        C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 1,
        C::TLS13_AES_256_GCM_SHA384 => 2,
        C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 | C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => 3,
        _ => 4,
    }
}
