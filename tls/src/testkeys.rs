//! Throw-away certificates and keys for the tests, made with rcgen into a scratch directory (never committed).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn scratch() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "zgix-tls-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A self-signed certificate for `names`, valid from `from` to `until`
/// (years), with a key of `alg`.
pub fn make(names: &[&str], alg: &'static rcgen::SignatureAlgorithm, years: (i32, i32)) -> Pair {
    let key = rcgen::KeyPair::generate_for(alg).unwrap();
    let mut p =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    p.not_before = rcgen::date_time_ymd(years.0, 1, 1);
    p.not_after = rcgen::date_time_ymd(years.1, 1, 1);
    let cert = p.self_signed(&key).unwrap();
    let d = scratch();
    let pair = Pair {
        cert: d.join("cert.pem"),
        key: d.join("key.pem"),
    };
    std::fs::write(&pair.cert, cert.pem()).unwrap();
    std::fs::write(&pair.key, key.serialize_pem()).unwrap();
    pair
}

/// An ECDSA P-256 certificate valid now.
pub fn ecdsa(names: &[&str]) -> Pair {
    make(names, &rcgen::PKCS_ECDSA_P256_SHA256, (2020, 2090))
}
