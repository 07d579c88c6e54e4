//! `ConfigError`: one problem in a config document, located by its JSON path.

use std::fmt;

/// One problem found while loading or validating a config document.
///
/// `path` is the JSON path of the offending value in the same notation the
/// operator would use to find it (`listeners[0].http.cluster`,
/// `clusters.api.endpoints[1]`); it is empty when the problem concerns the
/// whole document (a JSON syntax error, an unreadable file). `rule` says what is
/// wrong in words that name the accepted values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// JSON path of the offending value, or `""` for the whole document.
    pub path: String,
    /// What is wrong and what would be accepted.
    pub rule: String,
}

impl ConfigError {
    /// Builds an error from anything string-like.
    pub fn new(path: impl Into<String>, rule: impl Into<String>) -> Self {
        ConfigError {
            path: path.into(),
            rule: rule.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.rule)
        } else {
            write!(f, "{}: {}", self.path, self.rule)
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_with_and_without_path() {
        let e = ConfigError::new("listeners[0].http.cluster", "no cluster named \"apx\"");
        assert_eq!(
            e.to_string(),
            "listeners[0].http.cluster: no cluster named \"apx\""
        );
        let e = ConfigError::new("", "EOF while parsing an object (line 1, column 1)");
        assert_eq!(
            e.to_string(),
            "EOF while parsing an object (line 1, column 1)"
        );
    }
}
