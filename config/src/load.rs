//! Loading: JSON text or a file into a validated `Config`, and the CPU list shards run on (the process's affinity mask).

use std::path::Path;

use crate::error::ConfigError;
use crate::model::Config;

impl Config {
    /// Parses and validates a JSON document.
    ///
    /// A syntax or type error stops deserialization, so it is reported alone,
    /// with the JSON path serde had reached and the line and column. A document
    /// that deserializes is then validated, and every rule it breaks is
    /// reported.
    pub fn from_json(text: &str) -> Result<Config, Vec<ConfigError>> {
        let config = deserialize(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads `path` and calls [`Config::from_json`]. A read failure is one
    /// error whose path is empty and whose rule names the file.
    pub fn from_file(path: &Path) -> Result<Config, Vec<ConfigError>> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            vec![ConfigError::new(
                "",
                format!("cannot read {}: {e}", path.display()),
            )]
        })?;
        Config::from_json(&text)
    }

    /// CPUs to start one shard on each: `cpus` as given, or every CPU of the
    /// process's affinity mask (`taskset`, systemd's `CPUAffinity=`), or `[0]`
    /// if the mask cannot be read.
    pub fn shard_cpus(&self) -> Vec<usize> {
        match &self.cpus {
            Some(cpus) => cpus.clone(),
            None => available_cpus(),
        }
    }
}

/// The deserialization half of [`Config::from_json`], without validation.
pub(crate) fn deserialize(text: &str) -> Result<Config, Vec<ConfigError>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let config: Config = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| vec![serde_error(json_path(e.path()), e.inner())])?;
    // serde_path_to_error stops at the end of the value; trailing
    // characters would otherwise pass unnoticed.
    de.end().map_err(|e| vec![serde_error(String::new(), &e)])?;
    Ok(config)
}

/// The CPUs this process may run on: its affinity mask, as the kernel
/// reports it in `/proc/self/status` (`Cpus_allowed_list: 0-3,6`, the mask
/// `sched_getaffinity(2)` returns); else `0..available_parallelism`.
pub(crate) fn available_cpus() -> Vec<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .and_then(|l| parse_cpu_list(l.trim()))
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| {
            (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
        })
}

/// A kernel CPU list (`0-3,6,8-9`) in ascending order; `None` if malformed.
pub(crate) fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// The JSON path of serde's position, written so it always names one place in the
/// file: `listeners[0].http`, and a key that is not a plain name (letters, digits,
/// `_` and `-`, not starting with a digit) quoted as JSON, `listeners[0]["a.b"]`:
/// joined with dots, `"a.b"` would read as two keys. A key serde could not read
/// (a syntax error inside it) ends the path as an unknown segment: the error is
/// located at the object holding it. `""` is the document itself.
pub(crate) fn json_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut segs: Vec<&Segment> = path.iter().collect();
    while matches!(segs.last(), Some(Segment::Unknown)) {
        segs.pop();
    }
    let mut out = String::new();
    for seg in segs {
        match seg {
            Segment::Seq { index } => {
                out.push('[');
                out.push_str(&index.to_string());
                out.push(']');
            }
            Segment::Map { key } | Segment::Enum { variant: key } if is_plain_key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Map { key } | Segment::Enum { variant: key } => {
                out.push('[');
                out.push_str(&serde_json::to_string(key).unwrap_or_else(|_| "\"?\"".into()));
                out.push(']');
            }
            Segment::Unknown => out.push_str("[?]"),
        }
    }
    out
}

/// `parent.key`, or `parent["key"]` when `key` is not a plain name: the path of a
/// map entry (a cluster named `api.v2` is `clusters["api.v2"]`).
pub(crate) fn key_path(parent: &str, key: &str) -> String {
    if is_plain_key(key) {
        format!("{parent}.{key}")
    } else {
        let quoted = serde_json::to_string(key).unwrap_or_else(|_| "\"?\"".into());
        format!("{parent}[{quoted}]")
    }
}

/// A key written after a dot in a path: `[A-Za-z_][A-Za-z0-9_-]*`.
fn is_plain_key(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// One `ConfigError` from a serde_json error. The position is rewritten as
/// `(line L, column C)`. The path is kept wherever serde had one, syntax errors
/// included (a stray key inside `action` is then located), and is `""` for the
/// root and for errors about the document as a whole (end of input, trailing
/// characters).
fn serde_error(path: String, e: &serde_json::Error) -> ConfigError {
    let message = e.to_string();
    let mut rule = if e.line() == 0 {
        message
    } else {
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let bare = message.strip_suffix(&suffix).unwrap_or(&message);
        format!("{bare} (line {}, column {})", e.line(), e.column())
    };
    // ipnet reports a bad CIDR as a bad IP address; say what is expected.
    if rule.starts_with("invalid IP address syntax") {
        rule = rule.replacen(
            "invalid IP address syntax",
            "not a CIDR network such as \"10.0.0.0/8\" or \"2001:db8::/32\"",
            1,
        );
    }
    let whole_document = path.is_empty() || e.is_eof();
    ConfigError {
        path: if whole_document { String::new() } else { path },
        rule,
    }
}
