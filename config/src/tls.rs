//! TLS termination on a listener (`listeners[].tls`): certificates, ALPN, the lowest TLS version, what an unknown SNI gets, session tickets and the handshake deadline.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Default `handshake_timeout_ms`: nginx's `ssl_handshake_timeout` is 60 s,
/// HAProxy bounds the handshake by `timeout client`; 10 s lets a slow
/// mobile link finish a full handshake and frees a stalled one soon.
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Bounds of `handshake_timeout_ms`.
pub const MIN_HANDSHAKE_TIMEOUT_MS: u64 = 100;
/// See [`MIN_HANDSHAKE_TIMEOUT_MS`].
pub const MAX_HANDSHAKE_TIMEOUT_MS: u64 = 120_000;
/// Most certificates on one listener.
pub const MAX_CERTIFICATES: usize = 256;
/// ALPN protocol names zgix speaks on a TLS listener.
pub const ALPN_PROTOCOLS: &[&str] = &["h2", "http/1.1"];

/// `listeners[].tls`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTls {
    /// Certificate chains with their keys; the first is the default.
    pub certificates: Vec<CertificateFiles>,
    /// ALPN protocol names offered, in preference order.
    #[serde(default = "default_alpn")]
    pub alpn: Vec<String>,
    /// The lowest TLS version accepted.
    #[serde(default)]
    pub min_version: TlsVersion,
    /// What a ClientHello without SNI, or with a name no certificate has, gets.
    #[serde(default)]
    pub unknown_sni: UnknownSni,
    /// Stateless session tickets.
    #[serde(default)]
    pub session_tickets: SessionTickets,
    /// A handshake not complete within this is closed and counted.
    #[serde(default = "default_handshake_timeout_ms")]
    pub handshake_timeout_ms: u64,
}

fn default_alpn() -> Vec<String> {
    vec!["h2".into(), "http/1.1".into()]
}

fn default_handshake_timeout_ms() -> u64 {
    DEFAULT_HANDSHAKE_TIMEOUT_MS
}

/// One certificate chain (PEM, leaf first) and its private key (PEM:
/// PKCS#8, SEC1 or PKCS#1).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateFiles {
    /// Path of the PEM certificate chain.
    pub cert: String,
    /// Path of the PEM private key.
    pub key: String,
}

/// `tls.min_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3 (the default).
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    Tls13,
}

/// `tls.unknown_sni`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownSni {
    /// The first certificate answers (the default).
    #[default]
    Default,
    /// The handshake ends with an `unrecognized_name` alert.
    Refuse,
}

/// `tls.session_tickets`: omitted or `true` → keys made at start, rotated
/// and kept across reloads and upgrades; `false` → no tickets;
/// `{"key_file": path}` → keys from a file in HAProxy's `tls-ticket-keys`
/// format.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SessionTickets {
    /// Keys zgix makes (the default).
    #[default]
    Generated,
    /// No session tickets.
    Off,
    /// Keys read from this file.
    KeyFile(String),
}

impl<'de> Deserialize<'de> for SessionTickets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SessionTickets;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("true, false or {\"key_file\": \"/path\"}")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<SessionTickets, E> {
                Ok(if b {
                    SessionTickets::Generated
                } else {
                    SessionTickets::Off
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<SessionTickets, A::Error> {
                let mut file = None;
                while let Some(k) = m.next_key::<String>()? {
                    if k != "key_file" {
                        return Err(de::Error::unknown_field(&k, &["key_file"]));
                    }
                    file = Some(m.next_value::<String>()?);
                }
                file.map(SessionTickets::KeyFile)
                    .ok_or_else(|| de::Error::missing_field("key_file"))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for SessionTickets {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            SessionTickets::Generated => s.serialize_bool(true),
            SessionTickets::Off => s.serialize_bool(false),
            SessionTickets::KeyFile(p) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("key_file", p)?;
                m.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_the_three_ticket_forms() {
        let t: ListenerTls =
            serde_json::from_str(r#"{"certificates": [{"cert": "c.pem", "key": "k.pem"}]}"#)
                .unwrap();
        assert_eq!(t.alpn, ["h2", "http/1.1"]);
        assert_eq!(t.min_version, TlsVersion::Tls12);
        assert_eq!(t.unknown_sni, UnknownSni::Default);
        assert_eq!(t.session_tickets, SessionTickets::Generated);
        assert_eq!(t.handshake_timeout_ms, DEFAULT_HANDSHAKE_TIMEOUT_MS);
        for (json, want) in [
            ("true", SessionTickets::Generated),
            ("false", SessionTickets::Off),
            (
                r#"{"key_file": "/k"}"#,
                SessionTickets::KeyFile("/k".into()),
            ),
        ] {
            let got: SessionTickets = serde_json::from_str(json).unwrap();
            assert_eq!(got, want);
            assert_eq!(
                serde_json::from_str::<SessionTickets>(&serde_json::to_string(&got).unwrap())
                    .unwrap(),
                want
            );
        }
        let e = serde_json::from_str::<SessionTickets>(r#"{"file": "/k"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `file`"), "{e}");
        let e = serde_json::from_str::<SessionTickets>("3").unwrap_err();
        assert!(e.to_string().contains("true, false or"), "{e}");
    }

    #[test]
    fn versions_and_unknown_sni_by_name() {
        assert_eq!(
            serde_json::from_str::<TlsVersion>("\"1.3\"").unwrap(),
            TlsVersion::Tls13
        );
        assert!(serde_json::from_str::<TlsVersion>("\"1.1\"").is_err());
        assert_eq!(
            serde_json::from_str::<UnknownSni>("\"refuse\"").unwrap(),
            UnknownSni::Refuse
        );
    }
}
