//! `listeners[].http.request_id`: how zgix names each request in `X-Request-ID` (forwarded, in its own answers and in the logs): `"generate"`, `"replace"` or `false`.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Longest client-sent `X-Request-ID` zgix keeps (`"generate"` mode): longer
/// ones are replaced, so a line in the logs is bounded.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// What zgix does with `X-Request-ID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestIdMode {
    /// Keep a client's ID when it is 1 to [`MAX_REQUEST_ID_BYTES`] visible ASCII
    /// bytes (one field), else write a new random 128-bit one (the default).
    #[default]
    Generate,
    /// Always write a new one; a client's field is dropped.
    Replace,
    /// No ID: the field is forwarded as the client sent it, zgix adds none.
    Off,
}

impl RequestIdMode {
    /// Whether a client-sent value may be kept (in `"generate"` mode): 1 to
    /// [`MAX_REQUEST_ID_BYTES`] bytes of visible ASCII (`0x21..=0x7e`), so it
    /// cannot carry a space, a quote-breaking control byte or a line break into
    /// a log line or a header.
    pub fn acceptable(value: &[u8]) -> bool {
        (1..=MAX_REQUEST_ID_BYTES).contains(&value.len())
            && value.iter().all(|b| (0x21..=0x7e).contains(b))
    }
}

impl Serialize for RequestIdMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RequestIdMode::Generate => s.serialize_str("generate"),
            RequestIdMode::Replace => s.serialize_str("replace"),
            RequestIdMode::Off => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for RequestIdMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RequestIdMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"generate\", \"replace\" or false")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RequestIdMode, E> {
                match v {
                    "generate" => Ok(RequestIdMode::Generate),
                    "replace" => Ok(RequestIdMode::Replace),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RequestIdMode, E> {
                if v {
                    Err(E::invalid_value(de::Unexpected::Bool(true), &self))
                } else {
                    Ok(RequestIdMode::Off)
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_and_write_as_documented() {
        for (json, mode) in [
            ("\"generate\"", RequestIdMode::Generate),
            ("\"replace\"", RequestIdMode::Replace),
            ("false", RequestIdMode::Off),
        ] {
            let m: RequestIdMode = serde_json::from_str(json).unwrap();
            assert_eq!(m, mode);
            assert_eq!(serde_json::to_string(&m).unwrap(), json);
        }
        for bad in ["true", "\"keep\"", "1"] {
            let e = serde_json::from_str::<RequestIdMode>(bad).unwrap_err();
            assert!(
                e.to_string().contains("\"generate\", \"replace\" or false"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn acceptable_ids_are_short_visible_ascii() {
        assert!(RequestIdMode::acceptable(b"abc-123"));
        assert!(RequestIdMode::acceptable(&[b'a'; 128]));
        assert!(!RequestIdMode::acceptable(&[b'a'; 129]));
        assert!(!RequestIdMode::acceptable(b""));
        assert!(!RequestIdMode::acceptable(b"a b"));
        assert!(!RequestIdMode::acceptable(b"a\x7fb"));
        assert!(!RequestIdMode::acceptable("é".as_bytes()));
    }
}
