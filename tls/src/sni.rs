//! A listener's certificates by name: a ClientHello's SNI (RFC 6066 §3) picks the certificate whose SAN names it exactly, else one whose `*.` wildcard covers its first label (RFC 6125 §6.4.3); no SNI or an unknown one gets the first certificate or nothing, as `unknown_sni` says.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::certs::Loaded;

/// What an SNI no certificate names (or no SNI) gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnknownSni {
    /// The first certificate.
    Default,
    /// No certificate: the handshake ends with `unrecognized_name`.
    Refuse,
}

/// The certificates of one listener.
#[derive(Debug)]
pub struct CertStore {
    keys: Vec<Arc<CertifiedKey>>,
    exact: HashMap<String, usize>,
    /// Keyed by what follows `*.`.
    wildcard: HashMap<String, usize>,
    unknown: UnknownSni,
}

impl CertStore {
    /// Indexes `certs` by name. A name listed by two certificates is an
    /// error naming both (by index) and the name; every such error is
    /// returned.
    pub fn new(certs: &[Loaded], unknown: UnknownSni) -> Result<CertStore, Vec<(usize, String)>> {
        let mut s = CertStore {
            keys: certs.iter().map(|c| c.key.clone()).collect(),
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            unknown,
        };
        let mut errors = Vec::new();
        for (i, c) in certs.iter().enumerate() {
            for name in &c.names {
                let (map, key) = match name.strip_prefix("*.") {
                    Some(rest) => (&mut s.wildcard, rest.to_string()),
                    None => (&mut s.exact, name.clone()),
                };
                if let Some(&first) = map.get(&key) {
                    if first != i {
                        errors.push((
                            i,
                            format!("the name {name} is already served by certificates[{first}]"),
                        ));
                    }
                    continue;
                }
                map.insert(key, i);
            }
        }
        if errors.is_empty() {
            Ok(s)
        } else {
            Err(errors)
        }
    }

    /// The index of the certificate for `sni`, if any answers.
    pub fn pick_index(&self, sni: Option<&str>) -> Option<usize> {
        let found = sni.and_then(|n| {
            let n = n.trim_end_matches('.').to_ascii_lowercase();
            self.exact.get(&n).copied().or_else(|| {
                let (_, rest) = n.split_once('.')?;
                self.wildcard.get(rest).copied()
            })
        });
        match (found, self.unknown) {
            (Some(i), _) => Some(i),
            (None, UnknownSni::Default) if !self.keys.is_empty() => Some(0),
            (None, _) => None,
        }
    }

    /// Whether an SNI (or its absence) is refused under `unknown_sni`.
    pub fn refuses(&self, sni: Option<&str>) -> bool {
        self.pick_index(sni).is_none()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.pick_index(hello.server_name())
            .map(|i| self.keys[i].clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{load, testkeys};

    fn store(names: &[&[&str]], unknown: UnknownSni) -> Result<CertStore, Vec<(usize, String)>> {
        let certs: Vec<Loaded> = names
            .iter()
            .map(|n| {
                let p = testkeys::ecdsa(n);
                load(&p.cert, &p.key).unwrap()
            })
            .collect();
        CertStore::new(&certs, unknown)
    }

    #[test]
    fn sni_picks_exact_then_one_label_wildcard_then_the_default() {
        let s = store(
            &[&["site.example"], &["api.example", "*.api.example"]],
            UnknownSni::Default,
        )
        .unwrap();
        assert_eq!(s.pick_index(Some("site.example")), Some(0));
        assert_eq!(
            s.pick_index(Some("API.Example.")),
            Some(1),
            "case and a trailing dot"
        );
        assert_eq!(s.pick_index(Some("v1.api.example")), Some(1));
        assert_eq!(
            s.pick_index(Some("a.v1.api.example")),
            Some(0),
            "a wildcard covers one label"
        );
        assert_eq!(s.pick_index(Some("other.example")), Some(0));
        assert_eq!(s.pick_index(None), Some(0));
    }

    #[test]
    fn refuse_answers_nothing_for_an_unknown_or_missing_sni() {
        let s = store(&[&["site.example"]], UnknownSni::Refuse).unwrap();
        assert_eq!(s.pick_index(Some("site.example")), Some(0));
        assert!(s.refuses(Some("other.example")));
        assert!(s.refuses(None));
    }

    #[test]
    fn a_name_on_two_certificates_is_an_error_naming_both() {
        let e = store(
            &[&["a.example"], &["b.example", "a.example"]],
            UnknownSni::Default,
        )
        .unwrap_err();
        assert_eq!(
            e,
            vec![(
                1,
                "the name a.example is already served by certificates[0]".to_string()
            )]
        );
    }
}
