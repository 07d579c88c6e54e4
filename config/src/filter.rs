//! `request_filters`: ordered match/action rules walked for every admitted request.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Header names filters may match but never edit (set, add, remove, or send in
/// a `respond`). Lower case; compare ASCII case-insensitively.
///
/// - Hop-by-hop fields (RFC 9110 §7.6.1): `connection`, `keep-alive`,
///   `proxy-connection`, `te`, `trailer`, `upgrade`. They describe one
///   connection and zgix manages each side's connection itself.
/// - Framing (RFC 9112 §6): `content-length`, `transfer-encoding`. zgix frames
///   every message it sends; a second opinion is how request smuggling starts.
/// - `host`: forwarded as the client sent it. The `hosts` matcher, source
///   routing and access logs all read it; rewriting it mid-walk would make them
///   disagree with the origin.
pub const FORBIDDEN_EDIT_HEADERS: [&str; 9] = [
    "connection",
    "content-length",
    "host",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Longest header value, redirect `location`, path or rewrite string a filter
/// may carry: 8 KiB, the default request-line size, so one filter can never by
/// itself push a head past the common 8-16 KiB limits of the next hop.
pub const MAX_FILTER_HEADER_VALUE_BYTES: usize = 8 * 1024;

/// Largest `respond` body: 64 KiB. Bodies are kept in memory per listener and
/// written in one go; larger content belongs on an origin.
pub const MAX_RESPOND_BODY_BYTES: usize = 64 * 1024;

/// One entry of `http.request_filters`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestFilter {
    /// Free-form label for logs and for the operator; 1..=128 bytes, no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Conditions, all of which must hold; omitted or `{}` matches every request.
    #[serde(default, rename = "match")]
    pub matcher: Match,
    /// What to do when `matcher` holds.
    pub action: Action,
}

/// Conditions of a filter. Every field is optional; the given ones are ANDed.
/// Within one list (`methods`, `hosts`, `clients`) any entry may match (OR);
/// every entry of `headers` must match (AND).
///
/// Matchers see the request as the client sent it, never as earlier filters
/// edited it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// Request method, exact and case-sensitive (methods are upper case tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// `Host` header without its port, ASCII case-insensitive, exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// Canonical path (no query), byte-exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatch>,
    /// Header conditions, all of which must hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Vec<HeaderMatch>>,
    /// Client address networks (IPv6 at most /64 long).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<Vec<IpNet>>,
}

impl Match {
    /// True when no condition is given: the filter applies to every request.
    pub fn is_always(&self) -> bool {
        self == &Match::default()
    }
}

/// Path condition: `{"exact": "/x"}` or `{"prefix": "/api/"}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    /// The path equals this string.
    Exact(String),
    /// The path starts with this string (plain byte prefix: `/api` also
    /// matches `/apiary`; write `/api/` to match a directory).
    Prefix(String),
}

/// Header condition: `name` plus exactly one of `present`, `equals`, `contains`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    /// Header name, ASCII case-insensitive.
    pub name: String,
    /// `true`: the header occurs at least once; `false`: it does not occur.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
    /// Some occurrence's value (surrounding whitespace trimmed) equals this, ASCII case-insensitively.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<String>,
    /// Some occurrence's value contains this, ASCII case-insensitively.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contains: Option<String>,
}

/// The single test of a validated [`HeaderMatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderTest<'a> {
    /// Header present (`true`) or absent (`false`).
    Present(bool),
    /// Some value equals this.
    Equals(&'a str),
    /// Some value contains this.
    Contains(&'a str),
}

impl HeaderMatch {
    /// The test this condition performs. On a config that passed
    /// `validate()` exactly one of the three fields is set; otherwise
    /// `present` wins, then `equals`, then `contains`, and none means `Present(true)`.
    pub fn test(&self) -> HeaderTest<'_> {
        match (&self.present, &self.equals, &self.contains) {
            (Some(p), _, _) => HeaderTest::Present(*p),
            (None, Some(v), _) => HeaderTest::Equals(v),
            (None, None, Some(v)) => HeaderTest::Contains(v),
            (None, None, None) => HeaderTest::Present(true),
        }
    }
}

/// What a matching filter does. Written as a one-key object, e.g. `{"allow": {}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Stop the walk and route the request (terminal for the walk).
    Allow(Allow),
    /// Answer with an error status (terminal).
    Reject(Reject),
    /// Answer with a redirect (terminal).
    Redirect(Redirect),
    /// Answer with a fixed response (terminal).
    Respond(Respond),
    /// Edit the request head sent upstream (continues the walk).
    RequestHeaders(RequestHeaders),
    /// Edit the upstream response head sent to the client (continues the walk).
    ResponseHeaders(ResponseHeaders),
    /// Replace a path prefix (continues the walk).
    Rewrite(Rewrite),
    /// Choose the cluster; the last matching route wins (continues the walk).
    Route(Route),
}

impl Action {
    /// True for actions that end the walk: `allow`, `reject`, `redirect`, `respond`.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Action::Allow(_) | Action::Reject(_) | Action::Redirect(_) | Action::Respond(_)
        )
    }

    /// The JSON key of this action, as used in error paths.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Allow(_) => "allow",
            Action::Reject(_) => "reject",
            Action::Redirect(_) => "redirect",
            Action::Respond(_) => "respond",
            Action::RequestHeaders(_) => "request_headers",
            Action::ResponseHeaders(_) => "response_headers",
            Action::Rewrite(_) => "rewrite",
            Action::Route(_) => "route",
        }
    }
}

/// `{"allow": {}}`: no parameters.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Allow {}

/// `{"reject": {"status": 403}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Reject {
    /// 400..=599.
    pub status: u16,
}

/// `{"redirect": {"status": 301, "location": "https://example.com/"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Redirect {
    /// 301, 302, 307 or 308.
    pub status: u16,
    /// `Location` header value, sent verbatim.
    pub location: String,
}

/// `{"respond": {"status": 200, "headers": [["content-type", "text/plain"]], "body": "hi"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Respond {
    /// 200..=599.
    pub status: u16,
    /// Extra response headers as `[name, value]` pairs, in order.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// Response body, at most [`MAX_RESPOND_BODY_BYTES`]; empty when omitted.
    #[serde(default)]
    pub body: String,
}

/// `{"request_headers": {"set": [["k", "v"]], "add": [["k", "v"]], "remove": ["k"]}}`.
/// Applied in the order remove, set, add.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestHeaders {
    /// Replace every occurrence of the name with one field (added if absent).
    #[serde(default)]
    pub set: Vec<(String, String)>,
    /// Append a field, keeping existing ones.
    #[serde(default)]
    pub add: Vec<(String, String)>,
    /// Delete every occurrence of the name.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// `{"response_headers": {"set": [["k", "v"]], "remove": ["k"]}}`. Applied in
/// the order remove, set, to responses relayed from a cluster only.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseHeaders {
    /// Replace every occurrence of the name with one field (added if absent).
    #[serde(default)]
    pub set: Vec<(String, String)>,
    /// Delete every occurrence of the name.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// `{"rewrite": {"prefix": "/old/", "replacement": "/new/"}}`: if the current
/// path starts with `prefix`, that prefix is replaced; the query is kept.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rewrite {
    /// Path prefix to replace; starts with `/`.
    pub prefix: String,
    /// Replacement; starts with `/`.
    pub replacement: String,
}

/// `{"route": {"cluster": "other"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Name of a cluster in `clusters`.
    pub cluster: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_action_shape() {
        let text = r#"[
            {"action": {"allow": {}}},
            {"match": {"methods": ["GET"]}, "action": {"reject": {"status": 403}}},
            {"action": {"redirect": {"status": 301, "location": "https://x/"}}},
            {"action": {"respond": {"status": 200, "headers": [["content-type", "text/plain"]], "body": "hi"}}},
            {"action": {"request_headers": {"set": [["k", "v"]], "add": [["k", "v"]], "remove": ["k"]}}},
            {"action": {"response_headers": {"set": [["k", "v"]], "remove": ["k"]}}},
            {"action": {"rewrite": {"prefix": "/old/", "replacement": "/new/"}}},
            {"name": "to other", "action": {"route": {"cluster": "other"}}}
        ]"#;
        let filters: Vec<RequestFilter> = serde_json::from_str(text).unwrap();
        let kinds: Vec<_> = filters.iter().map(|f| f.action.kind()).collect();
        assert_eq!(
            kinds,
            [
                "allow",
                "reject",
                "redirect",
                "respond",
                "request_headers",
                "response_headers",
                "rewrite",
                "route"
            ]
        );
        let terminal: Vec<_> = filters.iter().map(|f| f.action.is_terminal()).collect();
        assert_eq!(
            terminal,
            [true, true, true, true, false, false, false, false]
        );
        assert!(filters[0].matcher.is_always());
        assert!(!filters[1].matcher.is_always());
    }

    #[test]
    fn header_test_reads_the_one_field_set() {
        let m: HeaderMatch = serde_json::from_str(r#"{"name": "x-a", "contains": "v"}"#).unwrap();
        assert_eq!(m.test(), HeaderTest::Contains("v"));
        let m: HeaderMatch = serde_json::from_str(r#"{"name": "x-a", "present": false}"#).unwrap();
        assert_eq!(m.test(), HeaderTest::Present(false));
    }
}
