//! Certificates and keys from PEM files: the chain, the private key (PKCS#8, SEC1 or PKCS#1; ECDSA, RSA or Ed25519), the check that they belong together, and the names (SANs) and validity dates a listener's SNI lookup and `--check` need.

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate within this many seconds of its `notAfter` draws a warning
/// from `--check` and at load (14 days: a fortnight leaves a renewal job
/// that failed once time to fail again and be noticed).
pub const EXPIRY_WARNING_SECS: i64 = 14 * 24 * 3600;

/// A certificate chain with its private key, ready to serve.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The names it answers for: DNS SANs (exact, or `*.` wildcards of one
    /// label), lower-cased; the subject CN only when there is no DNS SAN.
    pub names: Vec<String>,
    /// `notBefore` and `notAfter` of the end-entity certificate, seconds
    /// since the epoch.
    pub not_before: i64,
    pub not_after: i64,
    pub key: Arc<CertifiedKey>,
}

/// What is wrong with a certificate or key file, worded for a config error
/// (the caller prefixes the JSON path).
pub type LoadError = String;

/// Reads `cert` (a PEM chain, end-entity first) and `key` (a PEM private
/// key) and checks the key is the certificate's.
pub fn load(cert: &Path, key: &Path) -> Result<Loaded, LoadError> {
    let chain = read_chain(cert)?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| pem_error(key, "private key", e))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| format!("{}: unsupported private key: {e}", key.display()))?;
    let ck = CertifiedKey::new(chain, signing);
    match ck.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(format!(
                "{}: the private key does not match the certificate {}",
                key.display(),
                cert.display()
            ))
        }
        Err(e) => return Err(format!("{}: {e}", cert.display())),
    }
    let (names, not_before, not_after) =
        describe(&ck.cert[0]).map_err(|e| format!("{}: {e}", cert.display()))?;
    Ok(Loaded {
        names,
        not_before,
        not_after,
        key: Arc::new(ck),
    })
}

/// The PEM certificates of `path`, in file order.
pub fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, LoadError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, "certificate", e))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem_error(path, "certificate", e))?;
    if chain.is_empty() {
        return Err(format!(
            "{}: no PEM certificate in the file",
            path.display()
        ));
    }
    Ok(chain)
}

fn pem_error(path: &Path, what: &str, e: rustls_pki_types::pem::Error) -> String {
    match e {
        rustls_pki_types::pem::Error::Io(io) => format!("{}: cannot read it: {io}", path.display()),
        rustls_pki_types::pem::Error::NoItemsFound => {
            format!("{}: no PEM {what} in the file", path.display())
        }
        other => format!("{}: not a readable PEM {what}: {other}", path.display()),
    }
}

/// The names and validity of an end-entity certificate.
fn describe(der: &CertificateDer<'_>) -> Result<(Vec<String>, i64, i64), String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| format!("not a readable X.509 certificate: {e}"))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let GeneralName::DNSName(d) = n {
                names.push(d.to_ascii_lowercase());
            }
        }
    }
    if names.is_empty() {
        for cn in cert.subject().iter_common_name() {
            if let Ok(s) = cn.as_str() {
                names.push(s.to_ascii_lowercase());
            }
        }
    }
    let v = cert.validity();
    Ok((names, v.not_before.timestamp(), v.not_after.timestamp()))
}

/// Seconds since the epoch, now.
pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// How a certificate's dates stand at `now`: an error when it is not valid
/// (expired or not yet valid), a warning when it expires within
/// [`EXPIRY_WARNING_SECS`].
pub fn validity(l: &Loaded, now: i64) -> Result<Option<String>, String> {
    if now > l.not_after {
        return Err(format!(
            "the certificate expired {} day(s) ago",
            (now - l.not_after) / 86_400
        ));
    }
    if now < l.not_before {
        return Err("the certificate is not valid yet (notBefore is in the future)".into());
    }
    if l.not_after - now < EXPIRY_WARNING_SECS {
        return Ok(Some(format!(
            "the certificate expires in {} day(s)",
            (l.not_after - now) / 86_400
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkeys;

    #[test]
    fn an_ecdsa_pair_loads_with_its_names_lower_cased() {
        let p = testkeys::ecdsa(&["Site.Example", "*.api.example"]);
        let l = load(&p.cert, &p.key).unwrap();
        assert_eq!(l.names, ["site.example", "*.api.example"]);
        assert!(validity(&l, now_secs()).unwrap().is_none());
    }

    #[test]
    fn an_rsa_pair_loads() {
        let p = testkeys::make(&["rsa.example"], &rcgen::PKCS_RSA_SHA256, (2020, 2090));
        assert_eq!(load(&p.cert, &p.key).unwrap().names, ["rsa.example"]);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_naming_both_files() {
        let a = testkeys::ecdsa(&["a.example"]);
        let b = testkeys::ecdsa(&["b.example"]);
        let e = load(&a.cert, &b.key).unwrap_err();
        assert!(e.contains("does not match the certificate"), "{e}");
        assert!(e.contains(&a.cert.display().to_string()), "{e}");
    }

    #[test]
    fn unreadable_and_empty_files_are_named() {
        let a = testkeys::ecdsa(&["a.example"]);
        let missing = a.cert.with_file_name("missing.pem");
        let e = load(&missing, &a.key).unwrap_err();
        assert!(e.contains("missing.pem: cannot read it"), "{e}");
        std::fs::write(&missing, "hello\n").unwrap();
        let e = load(&missing, &a.key).unwrap_err();
        assert!(e.contains("no PEM certificate in the file"), "{e}");
        let e = load(&a.cert, &a.cert).unwrap_err();
        assert!(e.contains("no PEM private key in the file"), "{e}");
    }

    #[test]
    fn expired_not_yet_valid_and_soon_expiring_certificates_are_told_apart() {
        let old = testkeys::make(
            &["old.example"],
            &rcgen::PKCS_ECDSA_P256_SHA256,
            (2001, 2002),
        );
        let l = load(&old.cert, &old.key).unwrap();
        assert!(validity(&l, now_secs()).unwrap_err().contains("expired"));
        let future = testkeys::make(&["f.example"], &rcgen::PKCS_ECDSA_P256_SHA256, (2090, 2091));
        let l = load(&future.cert, &future.key).unwrap();
        assert!(validity(&l, now_secs())
            .unwrap_err()
            .contains("not valid yet"));
        let p = testkeys::ecdsa(&["soon.example"]);
        let l = load(&p.cert, &p.key).unwrap();
        let warn = validity(&l, l.not_after - 3 * 86_400).unwrap().unwrap();
        assert!(warn.contains("expires in 3 day(s)"), "{warn}");
    }
}
