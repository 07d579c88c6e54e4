//! The client side, towards origins: a cluster's rustls client configuration (the CA it trusts, or the system's roots; verification on unless explicitly off), the name an endpoint is checked against, and one connection ([`ClientSession`], the same interface as the server's [`crate::Session`]).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::unbuffered::{ReadEarlyData, UnbufferedStatus};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::session::{Failure, Side, Tls};

/// Where the system's CA bundle is, in the order looked at when a cluster
/// names no `ca` (Debian and Ubuntu, Fedora and RHEL, Alpine and the BSDs);
/// `SSL_CERT_FILE` first when set, as OpenSSL does.
pub const SYSTEM_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// Sessions each cluster's configuration keeps for resumption (rustls'
/// in-memory store, shared by the shards): one per endpoint and version
/// is enough for clusters of up to 128 endpoints.
pub const RESUMPTION_SESSIONS: usize = 256;

/// How a cluster checks its origins (`clusters.NAME.tls`).
pub struct Origin<'a> {
    /// A PEM file of CA certificates; `None`: the system's roots.
    pub ca: Option<&'a Path>,
    /// `false` accepts any certificate (the handshake's signatures are
    /// still checked, so the peer holds the key of what it sent).
    pub verify: bool,
}

/// A cluster's rustls client configuration, shared by its connections on
/// every shard. ALPN offers `http/1.1`, what zgix speaks to origins.
pub fn config(o: &Origin<'_>) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS versions: {e}"))?;
    let mut c = if o.verify {
        let roots = roots(o.ca)?;
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth()
    };
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    c.resumption = rustls::client::Resumption::in_memory_sessions(RESUMPTION_SESSIONS);
    Ok(Arc::new(c))
}

/// The trust anchors: every certificate of `ca`, or of the system bundle.
fn roots(ca: Option<&Path>) -> Result<RootCertStore, String> {
    let env = std::env::var_os("SSL_CERT_FILE");
    let file: &Path = match ca {
        Some(p) => p,
        None => env
            .as_deref()
            .map(Path::new)
            .into_iter()
            .chain(SYSTEM_BUNDLES.iter().map(Path::new))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                format!(
                    "no \"ca\" given and no system CA bundle found (looked at SSL_CERT_FILE and {})",
                    SYSTEM_BUNDLES.join(", ")
                )
            })?,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(file)
        .map_err(|e| format!("{}: cannot read: {e}", file.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", file.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: holds no certificate", file.display()));
    }
    let mut store = RootCertStore::empty();
    let (_, bad) = store.add_parsable_certificates(certs);
    if store.is_empty() {
        return Err(format!(
            "{}: none of its {bad} certificate(s) is a usable CA",
            file.display()
        ));
    }
    Ok(store)
}

/// The name a certificate is checked against (and sent as SNI when it is a
/// DNS name; an IP address is checked against the IP SANs, RFC 6066 §3
/// forbids it in SNI).
pub fn server_name(s: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(s.to_string())
        .map_err(|_| format!("{s:?} is neither a DNS name nor an IP address"))
}

/// A client-side TLS connection to an origin.
pub type ClientSession = Tls<ClientSide>;

/// The client side's rustls connection (the `S` of a client [`Tls`]).
pub type ClientSide = UnbufferedClientConnection;

impl ClientSession {
    /// A connection to `name`; its first [`Tls::read`] (on no input) queues
    /// the ClientHello.
    pub fn new(config: Arc<ClientConfig>, name: ServerName<'static>) -> Result<Self, Failure> {
        let conn = UnbufferedClientConnection::new(config, name)
            .map_err(|e| Failure::Alert(e.to_string()))?;
        Ok(Tls::with(conn))
    }
}

impl Side for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ClientConnectionData> {
        self.process_tls_records(incoming)
    }
    fn skip_early(_: ReadEarlyData<'_, '_, ClientConnectionData>) -> Result<usize, Failure> {
        // Only a server receives early data; rustls never gets here.
        Err(Failure::Alert("early data on a client connection".into()))
    }
}

/// `verify: false`: any certificate is taken, but the handshake signature
/// must still be the key's (RFC 8446 §4.4.3), as `curl -k` does.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
