//! Hand-rolled command-line parsing: `--flag value` pairs and bare switches.

use std::fmt::Display;
use std::str::FromStr;

/// Remaining arguments of one subcommand, consumed flag by flag.
pub struct Args {
    items: Vec<String>,
}

impl Args {
    /// Wraps the arguments that follow the subcommand name.
    pub fn new(items: Vec<String>) -> Self {
        Args { items }
    }

    /// True if `--help` or `-h` is present.
    pub fn wants_help(&self) -> bool {
        self.items.iter().any(|a| a == "--help" || a == "-h")
    }

    /// Removes a bare switch; true if it was present.
    pub fn switch(&mut self, name: &str) -> bool {
        let before = self.items.len();
        self.items.retain(|a| a != name);
        before != self.items.len()
    }

    /// Removes every `name value` pair (and `name=value`), returning the values in order.
    pub fn values(&mut self, name: &str) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        let mut i = 0;
        let prefix = format!("{name}=");
        while i < self.items.len() {
            if self.items[i] == name {
                if i + 1 >= self.items.len() {
                    return Err(format!("{name} needs a value"));
                }
                out.push(self.items.remove(i + 1));
                self.items.remove(i);
            } else if let Some(v) = self.items[i].strip_prefix(&prefix) {
                out.push(v.to_string());
                self.items.remove(i);
            } else {
                i += 1;
            }
        }
        Ok(out)
    }

    /// Removes `name value`, returning the last value given, if any.
    pub fn value(&mut self, name: &str) -> Result<Option<String>, String> {
        Ok(self.values(name)?.pop())
    }

    /// Removes `name value` and parses it.
    pub fn parsed<T>(&mut self, name: &str) -> Result<Option<T>, String>
    where
        T: FromStr,
        T::Err: Display,
    {
        match self.value(name)? {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|e| format!("{name} {v:?}: {e}")),
        }
    }

    /// Fails if anything was not consumed: typos must not be silently ignored.
    pub fn finish(self) -> Result<(), String> {
        match self.items.first() {
            None => Ok(()),
            Some(a) => Err(format!("unknown argument {a:?} (try --help)")),
        }
    }
}

/// Parses a CPU list such as `0,1` or `0-3,6`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let bad = || format!("bad CPU list {s:?}");
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (usize, usize) =
                (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if a > b {
                return Err(bad());
            }
            cpus.extend(a..=b);
        } else {
            cpus.push(part.parse().map_err(|_| bad())?);
        }
    }
    if cpus.is_empty() {
        return Err(format!("empty CPU list {s:?}"));
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Args {
        Args::new(s.split_whitespace().map(String::from).collect())
    }

    #[test]
    fn flags_values_and_leftovers() {
        let mut a = args("--bind 1.2.3.4:5 --echo --header A:1 --header=B:2 --n 7");
        assert!(a.switch("--echo"));
        assert_eq!(a.value("--bind").unwrap().as_deref(), Some("1.2.3.4:5"));
        assert_eq!(a.values("--header").unwrap(), vec!["A:1", "B:2"]);
        assert_eq!(a.parsed::<u32>("--n").unwrap(), Some(7));
        assert!(a.finish().is_ok());
        let mut a = args("--n x --what");
        assert!(a.parsed::<u32>("--n").is_err());
        assert!(args("--what").finish().is_err());
        assert!(args("--bind").value("--bind").is_err());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0,1").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpu_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        assert!(parse_cpu_list("2-1").is_err());
        assert!(parse_cpu_list("").is_err());
    }
}
