//! zgix-bench: a fast HTTP/1.1 origin (on zgix's socket driver) and a keep-alive load generator for measuring zgix.

mod args;
mod demo;
mod executor;
mod http;
mod load;
mod origin;
mod proxy_header;
mod send_zc;

use args::Args;
use std::process::ExitCode;

const USAGE: &str = "\
zgix-bench: origin, load generator and end-to-end demo for zgix

usage:
  zgix-bench origin --bind ADDR [--cpus 0,1] [--body-bytes N] [--delay-ms N] [--chunked] [--echo]
  zgix-bench load --url http://127.0.0.1:PORT/path [--connections N] [--duration S] [--rate R]
                  [--sources N] [--proxy-header v1|v2] [--threads T] [--cpus LIST]
                  [--header \"K: V\"]... [--timeout-ms N] [--json]
  zgix-bench demo [--zgix PATH] [--duration S]
  zgix-bench send-zc [--sizes 16K,64K,256K,1M] [--total 4G] [--queue 2] [--rounds 5]

`zgix-bench SUBCOMMAND --help` describes each one.";

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1);
    let Some(cmd) = argv.next() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let a = Args::new(argv.collect());
    let usage = match cmd.as_str() {
        "origin" => origin::USAGE,
        "load" => load::USAGE,
        "demo" => demo::USAGE,
        "send-zc" => send_zc::USAGE,
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => {
            eprintln!("zgix-bench: unknown subcommand {other:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if a.wants_help() {
        println!("{usage}");
        return ExitCode::SUCCESS;
    }
    let result = match cmd.as_str() {
        "origin" => origin::OriginConfig::from_args(a).and_then(origin::run),
        "load" => load::LoadConfig::from_args(a).and_then(load::run),
        "send-zc" => send_zc::Config::from_args(a).and_then(send_zc::run),
        _ => demo::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zgix-bench {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}
