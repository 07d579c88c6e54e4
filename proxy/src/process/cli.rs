//! Command-line interface: `zgix --config FILE [--log-level LEVEL]`, `zgix --check --config FILE`, `zgix --upgrade --config FILE`, `--help`, `--version`.

use std::path::PathBuf;

use zgix_config::Config;

use crate::observe::log::Level;

const USAGE: &str = "\
zgix — thread-per-core io_uring HTTP/1.1 edge proxy

USAGE:
    zgix --config FILE            run the proxy
    zgix --check --config FILE    validate FILE, print every error, exit 0 if valid
    zgix --upgrade --config FILE  take the listening sockets over from the running
                                  zgix, which then drains and exits
    zgix --help | --version

OPTIONS:
    -c, --config FILE   JSON configuration (see docs/config.md)
    -t, --check         validate only (like nginx -t)
    --upgrade           hand-off from the running instance (binary upgrade)
    --log-level LEVEL   error, warn, info (default) or debug; debug adds
                        client-triggered events (ZGIX_DEBUG=1 is the same
                        as debug)
    -h, --help          this text
    -V, --version       print the version

SIGNALS:
    SIGTERM, SIGINT, SIGQUIT
                        stop accepting, let in-flight requests finish within
                        limits.drain_timeout_ms, exit 0 (3 if the deadline cut any)
    SIGHUP              re-read FILE; apply it if valid, else log why and keep going
    SIGUSR1             reopen the access log file (after rotation)
    SIGUSR2, SIGALRM    logged and ignored

EXIT STATUS:
    0 stopped cleanly; 1 bad config or start-up failure; 2 bad arguments;
    3 the drain deadline cut connections or requests
";

enum Mode {
    Run(PathBuf, Option<Level>, bool),
    Check(PathBuf),
    Help,
    Version,
}

fn parse_args(args: &[String]) -> Result<Mode, String> {
    let mut config = None;
    let mut check = false;
    let mut level = None;
    let mut upgrade = false;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-h" | "--help" => return Ok(Mode::Help),
            "-V" | "--version" => return Ok(Mode::Version),
            "-t" | "--check" => check = true,
            "--upgrade" => upgrade = true,
            "-c" | "--config" => {
                i += 1;
                let v = args
                    .get(i)
                    .ok_or_else(|| "--config needs a FILE".to_string())?;
                config = Some(PathBuf::from(v));
            }
            "--log-level" => {
                i += 1;
                level = Some(parse_level(args.get(i).map(String::as_str))?);
            }
            other => {
                if let Some(v) = other.strip_prefix("--config=") {
                    config = Some(PathBuf::from(v));
                } else if let Some(v) = other.strip_prefix("--log-level=") {
                    level = Some(parse_level(Some(v))?);
                } else {
                    return Err(format!("unknown argument `{other}`"));
                }
            }
        }
        i += 1;
    }
    let config = config.ok_or_else(|| "missing --config FILE".to_string())?;
    Ok(if check {
        Mode::Check(config)
    } else {
        Mode::Run(config, level, upgrade)
    })
}

fn parse_level(v: Option<&str>) -> Result<Level, String> {
    let v = v.ok_or_else(|| "--log-level needs error, warn, info or debug".to_string())?;
    Level::parse(v).ok_or_else(|| format!("--log-level: {v:?} is not error, warn, info or debug"))
}

/// `--check` past the rules: the files zgix would open, opened — the access log
/// (created for appending, as at start, like `nginx -t`), the certificates and
/// keys. Every problem is reported at once.
fn check_files(
    c: &Config,
) -> Result<crate::conn::handshake::LoadedTls, Vec<zgix_config::ConfigError>> {
    let mut errors = Vec::new();
    if let Some(log) = &c.access_log {
        if let Err(e) = crate::observe::access_log::check_path(&log.path) {
            errors.push(zgix_config::ConfigError::new("access_log.path", e));
        }
    }
    match crate::conn::handshake::load_all(c) {
        Ok(loaded) if errors.is_empty() => Ok(loaded),
        Ok(_) => Err(errors),
        Err(e) => {
            errors.extend(e.into_iter().map(|m| zgix_config::ConfigError::new("", m)));
            Err(errors)
        }
    }
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = match parse_args(&args) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("zgix: {e}\n\n{USAGE}");
            return 2;
        }
    };
    match mode {
        Mode::Help => {
            print!("{USAGE}");
            0
        }
        Mode::Version => {
            println!(
                "zgix {} (git {})",
                env!("CARGO_PKG_VERSION"),
                env!("ZGIX_GIT_REVISION")
            );
            0
        }
        Mode::Check(path) => match Config::from_file(&path).and_then(|c| check_files(&c)) {
            Ok(loaded) => {
                for w in &loaded.warnings {
                    eprintln!("zgix: warning: {w}");
                }
                eprintln!("zgix: configuration {} is valid", path.display());
                0
            }
            Err(errors) => {
                for e in &errors {
                    eprintln!("zgix: {e}");
                }
                eprintln!(
                    "zgix: configuration {} has {} error(s)",
                    path.display(),
                    errors.len()
                );
                1
            }
        },
        Mode::Run(path, level, upgrade) => {
            crate::observe::log::init(level);
            let error = |args: std::fmt::Arguments<'_>| {
                crate::observe::log::log(Level::Error, "config", args)
            };
            match Config::from_file(&path) {
                Ok(config) => match crate::process::server::run(crate::process::server::Start {
                    config,
                    path,
                    upgrade,
                }) {
                    Ok(status) => status,
                    Err(e) => {
                        crate::observe::log::log(Level::Error, "server", format_args!("{e}"));
                        1
                    }
                },
                Err(errors) => {
                    for e in &errors {
                        error(format_args!("{e}"));
                    }
                    error(format_args!(
                        "configuration {} has {} error(s)",
                        path.display(),
                        errors.len()
                    ));
                    1
                }
            }
        }
    }
}
