//! A rate-limit check repeated N times, box-scoped (`check_with`) or fleet-scoped (`check_fleet`): the program `scripts/callgrind-admission.sh` counts instructions of, to state what the fleet scope adds to the request path.
//!
//! `cargo run --release -p zgix-admission --example rate_check_cost -- box|fleet N`.
//! One thread, no I/O and a synthetic clock (1 µs a check), so callgrind's count
//! is the same on every run: 1,000 identities cycle through a 65,536-slot table,
//! far below their limit, so every check is an allowed take as on a busy edge.

use std::net::{IpAddr, Ipv4Addr};

use zgix_admission::{ClientId, Overflow, RateDecision, RateParams, RateTable};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (fleet, n) = match args.as_slice() {
        [mode, n] if mode == "box" || mode == "fleet" => (
            mode == "fleet",
            n.parse::<u64>().expect("N: a number of checks"),
        ),
        _ => {
            eprintln!("usage: rate_check_cost box|fleet N");
            std::process::exit(2);
        }
    };
    let table = RateTable::new(65_536);
    let p = RateParams {
        requests: 1_000_000,
        window_ms: 1_000,
        burst: 1_000_000,
    };
    let ids: Vec<ClientId> = (0..1_000u32)
        .map(|i| ClientId::from_ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))))
        .collect();
    let mut allowed = 0u64;
    for i in 0..n {
        let id = ids[(i % ids.len() as u64) as usize];
        let now = 1_000_000_000 + i * 1_000;
        let rc = if fleet {
            table.check_fleet(id, p, now, Overflow::FailOpen, 7)
        } else {
            table.check_with(id, p, now, Overflow::FailOpen)
        };
        allowed += u64::from(rc.decision == RateDecision::Allowed);
    }
    // The fleet sync's side, once at the end (off the request path).
    let mut drained = 0u64;
    table.drain_spent(|_, _, k| drained += k);
    assert_eq!(allowed, n, "every check is an allowed take");
    assert_eq!(drained, if fleet { n } else { 0 });
    println!("{n} checks, {allowed} allowed, {drained} counted for the fleet");
}
