//! `via`: the name zgix gives itself in the Via field of every message it forwards (RFC 9110 §7.6.3), or `false`.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// The default `via` name.
pub const DEFAULT_VIA: &str = "zgix";

/// Longest `via` name: a label in every forwarded head, not a banner.
pub const MAX_VIA_BYTES: usize = 64;

/// What zgix writes as `received-by` in `Via: 1.1 <name>`.
///
/// RFC 9110 §7.6.3: "A proxy MUST send an appropriate Via header field ... in each message
/// that it forwards". `Off` (`"via": false`) leaves it out for deployments that must not
/// reveal an intermediary; that breaks the MUST, knowingly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// A `pseudonym` (a token, §7.6.3), at most [`MAX_VIA_BYTES`] bytes.
    Name(String),
    /// No Via field is added.
    Off,
}

impl Default for Via {
    fn default() -> Self {
        Via::Name(DEFAULT_VIA.to_string())
    }
}

impl Via {
    /// The name to send, or `None` when off.
    pub fn name(&self) -> Option<&str> {
        match self {
            Via::Name(n) => Some(n),
            Via::Off => None,
        }
    }

    /// The validation rule a name breaks, if any: a `received-by` pseudonym is a token
    /// (RFC 9110 §7.6.3, §5.6.2), so it cannot smuggle a comma, a comment or a line break
    /// into the field.
    pub(crate) fn check(&self) -> Result<(), String> {
        let Via::Name(n) = self else { return Ok(()) };
        let token = n
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if n.is_empty() || n.len() > MAX_VIA_BYTES || !token {
            return Err(format!(
                "must be a token of 1 to {MAX_VIA_BYTES} letters, digits or !#$%&'*+-.^_`|~ (such as \"zgix\"), or false, got {n:?}"
            ));
        }
        Ok(())
    }
}

impl Serialize for Via {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Via::Name(n) => s.serialize_str(n),
            Via::Off => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for Via {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Via;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a name such as \"zgix\", or false")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Via, E> {
                Ok(Via::Name(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Via, E> {
                if v {
                    Err(E::invalid_value(de::Unexpected::Bool(true), &self))
                } else {
                    Ok(Via::Off)
                }
            }
        }
        d.deserialize_any(V)
    }
}
