//! zgix configuration: JSON into typed structs, with `validate()` reporting every problem with its JSON path.
//!
//! The document is read in two passes. [`Config::from_json`] first deserializes
//! with serde (`deny_unknown_fields` everywhere), which can only report the first
//! syntax or type error, with its JSON path and line/column. It then runs
//! [`Config::validate`], which checks every semantic rule (bounds, cross
//! references, header syntax) and returns *all* violations at once, each with the
//! JSON path of the offending value, so an operator fixes a file in one round.
//!
//! The operator-facing reference for every field lives in `docs/config.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admission;
mod error;
mod filter;
mod http2;
mod io;
mod limits;
mod load;
mod model;
mod observe;
mod request_id;
mod tls;
mod upstream;
mod validate;
mod via;

pub use admission::*;
pub use error::ConfigError;
pub use filter::{
    Action, Allow, HeaderMatch, HeaderTest, Match, PathMatch, Redirect, Reject, RequestFilter,
    RequestHeaders, Respond, ResponseHeaders, Rewrite, Route, FORBIDDEN_EDIT_HEADERS,
    MAX_FILTER_HEADER_VALUE_BYTES, MAX_RESPOND_BODY_BYTES,
};
pub use http2::*;
pub use io::*;
pub use limits::*;
pub use model::{
    default_waf_status, AccessLog, AccessLogFormat, Admin, ClientFilter, Cluster, Config,
    ConnLimit, HttpListener, Lb, Listener, RateLimit, ServerHeader, Waf,
    DEFAULT_ACCESS_LOG_BUFFER_BYTES, DEFAULT_SERVER_HEADER, DEFAULT_WAF_STATUS,
    MAX_ACCESS_LOG_BUFFER_BYTES, MAX_LISTENER_NAME_BYTES, MAX_RATE_LIMIT_TOKENS,
    MAX_RATE_LIMIT_WINDOW_MS, MAX_WAF_LITERALS, MAX_WAF_LITERAL_BYTES, MIN_ACCESS_LOG_BUFFER_BYTES,
    WAF_STATUSES,
};
pub use observe::{
    AccessLogField, ACCESS_LOG_FIELD_NAMES, ACCESS_LOG_HEADER_VALUE_CAP,
    DEFAULT_ADMIN_HEADER_TIMEOUT_MS, DEFAULT_ADMIN_IDLE_TIMEOUT_MS, DEFAULT_ADMIN_MAX_CONNECTIONS,
    MAX_ACCESS_LOG_FIELDS, MAX_ACCESS_LOG_HEADER_FIELDS, MAX_ACCESS_LOG_HEADER_NAME_BYTES,
    MAX_ADMIN_MAX_CONNECTIONS, MAX_ADMIN_TIMEOUT_MS, MAX_ADMIN_TOKEN_BYTES, MIN_ADMIN_TIMEOUT_MS,
    MIN_ADMIN_TOKEN_BYTES,
};
pub use request_id::{RequestIdMode, MAX_REQUEST_ID_BYTES};
pub use tls::*;
pub use upstream::*;
pub use validate::{MAX_CLUSTER_NAME_BYTES, MAX_FILTER_NAME_BYTES};
pub use via::{Via, DEFAULT_VIA, MAX_VIA_BYTES};
