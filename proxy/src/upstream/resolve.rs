//! Endpoint addresses: a lock-free slot per endpoint, names resolved at load and re-resolved on a background thread.
//!
//! Every configured endpoint is one fixed slot (an index into
//! `Runtime::upstreams`), whether it is an IP literal or a name, so pools,
//! health and counters index by slot and never move. A name's slot holds one
//! address at a time, the way HAProxy's `server` line with a name does: the
//! current address is kept while the name still resolves to it (no churn
//! when a resolver rotates its answers), else the first address the resolver
//! returns (RFC 6724 order) is taken. A name that fails to resolve keeps its
//! last address and the failure is logged and counted; one that never
//! resolved is down (see `EndpointHealth::set_unresolved`).
//!
//! The address is read on every connect from any shard while the resolver
//! thread may write it, so it lives in a seqlock of atomics: the reader
//! retries if the sequence moved under it, the single writer bumps the
//! sequence around its stores. No lock, no allocation, no `unsafe`.

use std::cell::Cell;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{fence, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zgix_config::Target;

use crate::runtime::Runtime;

/// Retry interval for a name that has never resolved, in clusters without
/// `resolve_ms`: such an endpoint is down until it resolves.
const UNRESOLVED_RETRY: Duration = Duration::from_secs(5);
/// How often the resolver thread looks at the drain flag while it waits.
const RESOLVER_NAP: Duration = Duration::from_millis(200);

/// One endpoint's address, readable from any thread without a lock.
pub struct AtomicAddr {
    /// Even: stable; odd: a write is in progress. `seq / 2` is the generation.
    seq: AtomicU64,
    words: [AtomicU64; 3],
    resolve_failures: AtomicU64,
}

const WORD_V4: u64 = 1 << 16;
const WORD_SET: u64 = 1 << 17;

fn encode(a: SocketAddr) -> [u64; 3] {
    let (ip, v4) = match a.ip() {
        IpAddr::V4(v4) => (v4.to_ipv6_mapped(), WORD_V4),
        IpAddr::V6(v6) => (v6, 0),
    };
    let bits = u128::from(ip);
    [
        (bits >> 64) as u64,
        bits as u64,
        u64::from(a.port()) | v4 | WORD_SET,
    ]
}

fn decode(w: [u64; 3]) -> Option<SocketAddr> {
    if w[2] & WORD_SET == 0 {
        return None;
    }
    let v6 = Ipv6Addr::from((u128::from(w[0]) << 64) | u128::from(w[1]));
    let ip = match (w[2] & WORD_V4 != 0, v6.to_ipv4_mapped()) {
        (true, Some(v4)) => IpAddr::V4(v4),
        _ => IpAddr::V6(v6),
    };
    Some(SocketAddr::new(ip, w[2] as u16))
}

impl AtomicAddr {
    pub fn new(addr: Option<SocketAddr>) -> AtomicAddr {
        let w = addr.map_or([0; 3], encode);
        AtomicAddr {
            seq: AtomicU64::new(0),
            words: w.map(AtomicU64::new),
            resolve_failures: AtomicU64::new(0),
        }
    }

    /// The current address; `None` for a name that never resolved.
    #[inline]
    pub fn get(&self) -> Option<SocketAddr> {
        loop {
            let s1 = self.seq.load(Acquire);
            if s1 & 1 == 0 {
                let w = [
                    self.words[0].load(Relaxed),
                    self.words[1].load(Relaxed),
                    self.words[2].load(Relaxed),
                ];
                fence(Acquire);
                if self.seq.load(Relaxed) == s1 {
                    return decode(w);
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Bumped on every change of address: a shard drops pooled connections
    /// of a slot whose generation moved.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.seq.load(Acquire) / 2
    }

    /// Stores a new address. Only one thread writes (load, then the resolver).
    fn set(&self, a: SocketAddr) {
        let s = self.seq.load(Relaxed);
        self.seq.store(s + 1, Relaxed);
        fence(Release);
        for (slot, w) in self.words.iter().zip(encode(a)) {
            slot.store(w, Relaxed);
        }
        self.seq.store(s + 2, Release);
    }

    /// Names that failed to resolve so far.
    pub fn resolve_failures(&self) -> u64 {
        self.resolve_failures.load(Relaxed)
    }
}

/// Resolves `host:port` with the system resolver (blocking: only at load and
/// on the resolver thread, never on a shard).
pub fn lookup(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    (host, port).to_socket_addrs().map(Iterator::collect)
}

/// Keeps `current` when the new answer still contains it, else takes the first.
pub fn choose(current: Option<SocketAddr>, answer: &[SocketAddr]) -> Option<SocketAddr> {
    match current {
        Some(c) if answer.contains(&c) => Some(c),
        _ => answer.first().copied(),
    }
}

/// Resolves one named slot and stores the outcome; returns an operator-facing
/// line when something worth logging happened.
pub fn refresh(rt: &Runtime, slot: usize) -> Option<String> {
    let ep = &rt.upstreams[slot];
    let Target::Name { host, port } = &ep.target else {
        return None;
    };
    let current = ep.addr.get();
    match lookup(host, *port) {
        Ok(answer) if !answer.is_empty() => {
            let next = choose(current, &answer)?;
            ep.health.set_unresolved(false);
            if Some(next) != current {
                ep.addr.set(next);
                return Some(format!(
                    "clusters.{}: {} now resolves to {next}",
                    rt.clusters[ep.cluster].name, ep.label
                ));
            }
            None
        }
        result => {
            ep.addr.resolve_failures.fetch_add(1, Relaxed);
            let why = match result {
                Err(e) => e.to_string(),
                Ok(_) => "no address".into(),
            };
            let keeps = match current {
                Some(a) => format!("keeping {a}"),
                None => "the endpoint stays down".into(),
            };
            Some(format!(
                "clusters.{}: {} does not resolve ({why}); {keeps}",
                rt.clusters[ep.cluster].name, ep.label
            ))
        }
    }
}

/// Starts the re-resolution thread when some endpoint is a name: each cluster
/// with `resolve_ms` is refreshed that often; names that never resolved are
/// retried every 5 s in every cluster. The thread ends with the drain.
pub fn spawn_resolver(rt: Arc<Runtime>) -> Option<std::thread::JoinHandle<()>> {
    let named: Vec<usize> = (0..rt.upstreams.len())
        .filter(|&i| matches!(rt.upstreams[i].target, Target::Name { .. }))
        .collect();
    if named.is_empty() {
        return None;
    }
    let builder = std::thread::Builder::new().name("zgix-resolve".into());
    let spawned = builder.spawn(move || {
        let start = Instant::now();
        let mut due: Vec<Instant> = named.iter().map(|&i| start + period(&rt, i)).collect();
        while !rt.draining.load(Relaxed) {
            let now = Instant::now();
            for (k, &slot) in named.iter().enumerate() {
                if now >= due[k] {
                    if let Some(line) = refresh(&rt, slot) {
                        crate::log_warn!("upstream", "{line}");
                    }
                    due[k] = Instant::now() + period(&rt, slot);
                }
            }
            std::thread::sleep(RESOLVER_NAP);
        }
    });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            crate::log_error!(
                "upstream",
                "cannot start the resolver thread ({e}); names keep their load-time addresses"
            );
            None
        }
    }
}

/// How long until `slot` is resolved again.
fn period(rt: &Runtime, slot: usize) -> Duration {
    let ep = &rt.upstreams[slot];
    match rt.config.clusters[&rt.clusters[ep.cluster].name].resolve_ms {
        Some(ms) => Duration::from_millis(ms),
        None if ep.addr.get().is_none() => UNRESOLVED_RETRY,
        // Resolved at load and not asked to refresh: look again rarely, in
        // case it is needed; one lookup a day costs nothing.
        None => Duration::from_secs(86_400),
    }
}

/// A shard's view of address generations: tells it which slots moved since
/// its last look, so it can drop their pooled connections (call from the tick).
pub struct SeenGenerations(Box<[Cell<u64>]>);

impl SeenGenerations {
    pub fn new(rt: &Runtime) -> SeenGenerations {
        SeenGenerations(
            rt.upstreams
                .iter()
                .map(|e| Cell::new(e.addr.generation()))
                .collect(),
        )
    }

    /// Calls `moved(slot)` for every slot whose address changed since the last call.
    pub fn changed(&self, rt: &Runtime, mut moved: impl FnMut(usize)) {
        for (i, seen) in self.0.iter().enumerate() {
            let g = rt.upstreams[i].addr.generation();
            if g != seen.get() {
                seen.set(g);
                moved(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_addr_round_trips_v4_v6_and_unset() {
        for s in ["10.0.0.1:80", "[2001:db8::1]:443", "[::ffff:10.0.0.1]:81"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(AtomicAddr::new(Some(a)).get(), Some(a), "{s}");
        }
        let slot = AtomicAddr::new(None);
        assert_eq!(slot.get(), None);
        assert_eq!(slot.generation(), 0);
        slot.set("127.0.0.1:9".parse().unwrap());
        assert_eq!(slot.get(), Some("127.0.0.1:9".parse().unwrap()));
        assert_eq!(slot.generation(), 1);
    }

    #[test]
    fn readers_never_see_a_torn_address() {
        let a: SocketAddr = "10.1.1.1:1111".parse().unwrap();
        let b: SocketAddr = "[2001:db8::2]:2222".parse().unwrap();
        let slot = Arc::new(AtomicAddr::new(Some(a)));
        let reader = {
            let slot = slot.clone();
            std::thread::spawn(move || {
                for _ in 0..200_000 {
                    let got = slot.get().unwrap();
                    assert!(got == a || got == b, "torn read: {got}");
                }
            })
        };
        for i in 0..20_000 {
            slot.set(if i % 2 == 0 { b } else { a });
        }
        reader.join().unwrap();
    }

    #[test]
    fn choose_keeps_the_current_address_while_it_is_offered() {
        let x: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let y: SocketAddr = "10.0.0.2:80".parse().unwrap();
        assert_eq!(choose(Some(y), &[x, y]), Some(y));
        assert_eq!(choose(Some(y), &[x]), Some(x));
        assert_eq!(choose(None, &[x, y]), Some(x));
        assert_eq!(choose(Some(x), &[]), None);
    }

    #[test]
    fn localhost_resolves() {
        let got = lookup("localhost", 8080).unwrap();
        assert!(got.iter().all(|a| a.port() == 8080 && a.ip().is_loopback()));
        assert!(!got.is_empty());
        assert!(
            lookup("name.invalid", 80).is_err(),
            "RFC 6761 §6.4: .invalid never resolves"
        );
    }
}
