//! Endpoint addresses: a lock-free slot per endpoint, names resolved at load and re-resolved on a background thread.
//!
//! Every configured endpoint is one fixed slot (an index into
//! `Upstreams::upstreams`), whether it is an IP literal or a name, so pools,
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
//!
//! Re-resolving names (the resolver thread) is [`crate::upstream::resolver`].

use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{fence, AtomicU64, Ordering::*};

/// One endpoint's address, readable from any thread without a lock.
pub struct AtomicAddr {
    /// Even: stable; odd: a write is in progress. `seq / 2` is the generation.
    seq: AtomicU64,
    words: [AtomicU64; 3],
    pub(super) resolve_failures: AtomicU64,
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
    pub(super) fn set(&self, a: SocketAddr) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
