//! Endpoint choice per shard: smooth weighted round robin, weighted least-connections, rendezvous hashing of the client (`source_ip`); down endpoints skipped.
//!
//! A [`Balancer`] belongs to one shard (plain `Cell`s, no sharing). Each pick
//! reads the shared health of the cluster's endpoints (one relaxed load each)
//! and narrows the candidates in steps, so a pick always returns an endpoint:
//!
//! 0. endpoints the operator drained or disabled (`health/admin.rs`) are
//!    left out of every step below, unless all of the cluster's are;
//! 1. endpoints that are up or due for their one trial, minus those this
//!    request already tried;
//! 2. if none is up at all, **panic mode**: every endpoint (counted in
//!    `zgix_upstream_panic_picks_total`, logged when it starts and ends);
//! 3. if every candidate was already tried, the untried ones whatever their
//!    health, and at last the whole cluster (a one-endpoint cluster retries
//!    its endpoint).
//!
//! Nothing is allocated: candidate sets are 256-bit masks on the stack
//! (clusters hold at most `MAX_CLUSTER_ENDPOINTS`).

use std::cell::Cell;

use zgix_admission::ClientId;
use zgix_config::{Lb, MAX_CLUSTER_ENDPOINTS};

use crate::upstream::cluster::Upstreams;
use crate::upstream::health::Avail;
use crate::upstream::metrics::{InFlight, ShardUpstream};

const WORDS: usize = MAX_CLUSTER_ENDPOINTS.div_ceil(64);

/// A set of positions within one cluster's endpoint list.
#[derive(Copy, Clone, Default, PartialEq, Eq, Debug)]
pub struct Positions([u64; WORDS]);

impl Positions {
    fn all(n: usize) -> Positions {
        let mut p = Positions::default();
        for i in 0..n {
            p.insert(i);
        }
        p
    }
    #[inline]
    pub fn insert(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    #[inline]
    fn remove(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
    #[inline]
    pub fn contains(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
    fn minus(mut self, other: &Positions) -> Positions {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a &= !b;
        }
        self
    }
}

/// The endpoints a request has tried so far (positions in its cluster);
/// start each request with `Tried::default()` and pass it to every pick.
pub type Tried = Positions;

/// One pick: the endpoint slot and the request's in-flight hold on it.
pub struct Picked<'a> {
    /// Index into `Upstreams::endpoints` / `Upstreams::upstreams` and the pools.
    pub ep: usize,
    /// This request is the one trial after an ejection.
    pub trial: bool,
    /// Chosen in panic mode (no endpoint of the cluster was up).
    pub panic: bool,
    /// Counts the request in `least_conn` and `zgix_upstream_in_flight` until dropped.
    pub in_flight: InFlight<'a>,
}

struct ClusterLb {
    /// Smooth weighted round robin state, by position.
    current: Box<[Cell<i64>]>,
    /// Where tie-breaking scans start: the shard id, so shards do not all
    /// begin with the same endpoint.
    start: usize,
}

/// One shard's balancing state for every cluster.
pub struct Balancer {
    clusters: Box<[ClusterLb]>,
}

impl Balancer {
    pub fn new(rt: &Upstreams, shard: usize) -> Balancer {
        Balancer {
            clusters: rt
                .clusters
                .iter()
                .map(|c| ClusterLb {
                    current: c.endpoints.iter().map(|_| Cell::new(0)).collect(),
                    start: shard % c.endpoints.len().max(1),
                })
                .collect(),
        }
    }

    /// Picks an endpoint of `cluster` for `client`, skipping endpoints that are
    /// down and those in `tried`, and adds the choice to `tried`. `now` is
    /// `health::now_ms()`. See the module doc for the fallbacks.
    pub fn pick<'a>(
        &self,
        rt: &Upstreams,
        stats: &'a ShardUpstream,
        cluster: usize,
        client: ClientId,
        tried: &mut Tried,
        now: u64,
    ) -> Picked<'a> {
        let c = &rt.clusters[cluster];
        let n = c.endpoints.len();
        // Endpoints the operator took out (drained, disabled) are not
        // candidates even in panic mode, unless every one of them is out.
        let mut all = Positions::default();
        for (pos, &ep) in c.endpoints.iter().enumerate() {
            if rt.upstreams[ep].health.in_service() {
                all.insert(pos);
            }
        }
        if all.is_empty() {
            all = Positions::all(n);
        }
        let mut up = Positions::default();
        let mut trial_due = Positions::default();
        for (pos, &ep) in c.endpoints.iter().enumerate() {
            match rt.upstreams[ep].health.availability(now) {
                Avail::Up => up.insert(pos),
                Avail::TrialDue => {
                    up.insert(pos);
                    trial_due.insert(pos);
                }
                Avail::Down => {}
            }
        }
        let panic = up.is_empty();
        c.health.note(&c.name, panic);
        if panic {
            stats.panic_picks[cluster].inc();
            up = all;
            trial_due = Positions::default();
        }
        let mut eligible = up.minus(tried);
        if eligible.is_empty() {
            eligible = all.minus(tried);
            trial_due = Positions::default();
        }
        if eligible.is_empty() {
            eligible = all;
        }
        let (pos, trial) = loop {
            let pos = self.choose(rt, stats, cluster, client, &eligible);
            if !trial_due.contains(pos) {
                break (pos, false);
            }
            if rt.upstreams[c.endpoints[pos]].health.claim_trial(now) {
                break (pos, true);
            }
            // Another shard sends this endpoint's trial.
            eligible.remove(pos);
            trial_due.remove(pos);
            if eligible.is_empty() {
                eligible = all.minus(tried);
                if eligible.is_empty() {
                    eligible = all;
                }
                trial_due = Positions::default();
            }
        };
        self.commit(rt, cluster, &eligible, pos);
        tried.insert(pos);
        let ep = c.endpoints[pos];
        Picked {
            ep,
            trial,
            panic,
            in_flight: stats.begin(ep),
        }
    }

    /// The choice among `eligible`, without changing any state.
    fn choose(
        &self,
        rt: &Upstreams,
        stats: &ShardUpstream,
        cluster: usize,
        client: ClientId,
        eligible: &Positions,
    ) -> usize {
        let c = &rt.clusters[cluster];
        match c.lb {
            Lb::RoundRobin => self.smooth_rr(rt, cluster, eligible),
            Lb::LeastConn => {
                // Fewest in flight per unit of weight; ties (an idle cluster)
                // go to weighted round robin, as nginx's least_conn does.
                let load = |pos: usize| {
                    let ep = c.endpoints[pos];
                    (
                        u64::from(stats.endpoints[ep].in_flight()),
                        u64::from(rt.upstreams[ep].weight),
                    )
                };
                let mut best: Option<(u64, u64)> = None;
                let mut tied = Positions::default();
                for pos in (0..c.endpoints.len()).filter(|&p| eligible.contains(p)) {
                    let (f, w) = load(pos);
                    match best {
                        // f/w < bf/bw without division.
                        Some((bf, bw)) if f * bw > bf * w => {}
                        Some((bf, bw)) if f * bw == bf * w => tied.insert(pos),
                        _ => {
                            best = Some((f, w));
                            tied = Positions::default();
                            tied.insert(pos);
                        }
                    }
                }
                self.smooth_rr(rt, cluster, &tied)
            }
            Lb::SourceIp => {
                let key = client.source_ip_hash();
                let mut best = (f64::NEG_INFINITY, 0);
                for pos in (0..c.endpoints.len()).filter(|&p| eligible.contains(p)) {
                    let u = &rt.upstreams[c.endpoints[pos]];
                    let score = hrw_score(rt.hrw.hash_one((key, u.hrw_key)), u.weight);
                    if score > best.0 {
                        best = (score, pos);
                    }
                }
                best.1
            }
        }
    }

    /// Smooth weighted round robin (nginx's): the eligible endpoint with the
    /// largest `current + weight`; ties go to the first from `start`.
    fn smooth_rr(&self, rt: &Upstreams, cluster: usize, eligible: &Positions) -> usize {
        let c = &rt.clusters[cluster];
        let s = &self.clusters[cluster];
        let n = c.endpoints.len();
        let mut best = (i64::MIN, 0);
        for k in 0..n {
            let pos = (s.start + k) % n;
            if eligible.contains(pos) {
                let v = s.current[pos].get() + i64::from(rt.upstreams[c.endpoints[pos]].weight);
                if v > best.0 {
                    best = (v, pos);
                }
            }
        }
        best.1
    }

    /// Advances the round-robin state for a pick of `chosen` among `eligible`:
    /// every candidate gains its weight, the chosen one pays the total.
    fn commit(&self, rt: &Upstreams, cluster: usize, eligible: &Positions, chosen: usize) {
        let c = &rt.clusters[cluster];
        let s = &self.clusters[cluster];
        let mut total = 0;
        for (pos, &ep) in c.endpoints.iter().enumerate() {
            if eligible.contains(pos) || pos == chosen {
                let w = i64::from(rt.upstreams[ep].weight);
                s.current[pos].set(s.current[pos].get() + w);
                total += w;
            }
        }
        s.current[chosen].set(s.current[chosen].get() - total);
    }
}

/// Weighted rendezvous score (Schindelhauer and Schomaker's logarithmic
/// method): `-w / ln(u)` with `u` the hash mapped into (0, 1). The endpoint
/// with the highest score wins; adding one moves only the identities it now
/// wins, in proportion to its weight.
fn hrw_score(h: u64, weight: u32) -> f64 {
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(weight) / u.ln()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use zgix_config::Config;

    /// The upstreams of one cluster `c` of `endpoints` (JSON array text) and `lb`.
    fn runtime(endpoints: &str, lb: &str) -> Upstreams {
        let text = format!(
            r#"{{"listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "c"}}}}],
                "clusters": {{"c": {{"endpoints": {endpoints}, "lb": "{lb}"}}}}}}"#
        );
        Upstreams::build(&Config::from_json(&text).unwrap(), 1)
    }

    fn client(i: u32) -> ClientId {
        ClientId::from_ip(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)))
    }

    fn pick(b: &Balancer, rt: &Upstreams, id: ClientId) -> usize {
        b.pick(
            rt,
            &rt.upstream_stats.shards[0],
            0,
            id,
            &mut Tried::default(),
            0,
        )
        .ep
    }

    fn counts(rt: &Upstreams, picks: usize) -> Vec<usize> {
        let b = Balancer::new(rt, 0);
        let mut n = vec![0; rt.upstreams.len()];
        for i in 0..picks {
            n[pick(&b, rt, client(i as u32))] += 1;
        }
        n
    }

    fn within_10_percent(got: usize, want: usize) -> bool {
        got.abs_diff(want) * 10 <= want
    }

    #[test]
    fn equal_weights_cycle_in_order_from_the_shard_offset() {
        let rt = runtime(
            r#"["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]"#,
            "round_robin",
        );
        let b = Balancer::new(&rt, 1);
        let picks: Vec<usize> = (0..6).map(|_| pick(&b, &rt, client(0))).collect();
        assert_eq!(picks, [1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn weights_are_honoured_within_10_percent_over_1000_picks() {
        let eps = r#"["127.0.0.1:1", {"address": "127.0.0.1:2", "weight": 3}, {"address": "127.0.0.1:3", "weight": 6}]"#;
        // Round robin and least_conn are exact over 1000 picks. Rendezvous
        // hashing is keyed per process at random, so its shares are binomial:
        // over 20,000 identities 10 % of the smallest share (2,000) is about
        // five standard deviations, so the check cannot fail by chance.
        for (lb, picks) in [
            ("round_robin", 1000),
            ("least_conn", 1000),
            ("source_ip", 20_000),
        ] {
            let n = counts(&runtime(eps, lb), picks);
            let k = picks / 1000;
            for (got, want) in n.iter().zip([100 * k, 300 * k, 600 * k]) {
                assert!(within_10_percent(*got, want), "{lb}: {n:?}");
            }
        }
        // Smooth: the heavy endpoint never takes 3 picks in a row in a 1:1:3 cluster.
        let rt = runtime(
            r#"["127.0.0.1:1", "127.0.0.1:2", {"address": "127.0.0.1:3", "weight": 3}]"#,
            "round_robin",
        );
        let b = Balancer::new(&rt, 0);
        let seq: Vec<usize> = (0..10).map(|_| pick(&b, &rt, client(0))).collect();
        assert!(!seq.windows(3).any(|w| w == [2, 2, 2]), "{seq:?}");
    }

    #[test]
    fn least_conn_prefers_the_idle_endpoint() {
        let rt = runtime(r#"["127.0.0.1:1", "127.0.0.1:2"]"#, "least_conn");
        let stats = &rt.upstream_stats.shards[0];
        let b = Balancer::new(&rt, 0);
        // Endpoint 0 is slow: three requests stuck on it.
        let _slow: Vec<_> = (0..3).map(|_| stats.begin(0)).collect();
        let mut held = Vec::new();
        for _ in 0..2 {
            let p = b.pick(&rt, stats, 0, client(0), &mut Tried::default(), 0);
            assert_eq!(p.ep, 1);
            held.push(p);
        }
        // 3 vs 2 in flight: still endpoint 1; at 3 vs 3 a tie goes round robin.
        assert_eq!(pick(&b, &rt, client(0)), 1);
        held.push(b.pick(&rt, stats, 0, client(0), &mut Tried::default(), 0));
        assert_eq!(stats.endpoints[1].in_flight(), 3);
        drop(held);
        assert_eq!(stats.endpoints[1].in_flight(), 0, "guards release on drop");
        assert_eq!(pick(&b, &rt, client(0)), 1);
    }

    #[test]
    fn rendezvous_moves_at_most_its_share_when_an_endpoint_is_added() {
        let four = r#"["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"]"#;
        let five = r#"["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80"]"#;
        let (a, b5) = (runtime(four, "source_ip"), runtime(five, "source_ip"));
        // Same process key for both, as after a reload in one process.
        let b5 = Upstreams {
            hrw: a.hrw.clone(),
            ..b5
        };
        let (ba, bb) = (Balancer::new(&a, 0), Balancer::new(&b5, 0));
        let label = |rt: &Upstreams, ep: usize| rt.upstreams[ep].label.clone();
        let ids = 1000;
        let moved = (0..ids)
            .filter(|&i| {
                label(&a, pick(&ba, &a, client(i))) != label(&b5, pick(&bb, &b5, client(i)))
            })
            .count();
        assert!(
            moved * 100 <= ids as usize * (100 / 5 + 10),
            "moved {moved} of {ids}"
        );
        assert!(moved > 0, "the new endpoint must get some clients");
        // Stable: same client, same endpoint, whatever the shard.
        let other_shard = Balancer::new(&a, 3);
        for i in 0..50 {
            assert_eq!(pick(&ba, &a, client(i)), pick(&other_shard, &a, client(i)));
        }
    }

    #[test]
    fn rendezvous_keys_differ_per_process() {
        let eps = r#"["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"]"#;
        let (a, b) = (runtime(eps, "source_ip"), runtime(eps, "source_ip"));
        let (ba, bb) = (Balancer::new(&a, 0), Balancer::new(&b, 0));
        let differ = (0..200)
            .filter(|&i| pick(&ba, &a, client(i)) != pick(&bb, &b, client(i)))
            .count();
        assert!(
            differ > 50,
            "two random keys should disagree often, got {differ}"
        );
    }

    #[test]
    fn down_endpoints_are_skipped_by_every_mode() {
        for lb in ["round_robin", "least_conn", "source_ip"] {
            let rt = runtime(r#"["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]"#, lb);
            rt.upstreams[1].health.set_active_down(true);
            let n = counts(&rt, 300);
            assert_eq!(n[1], 0, "{lb}: {n:?}");
            assert!(n[0] > 0 && n[2] > 0, "{lb}: {n:?}");
            assert!(!rt.clusters[0].health.in_panic());
        }
    }

    #[test]
    fn an_ejected_endpoint_gets_exactly_one_trial_once_due() {
        let rt = runtime(r#"["127.0.0.1:1", "127.0.0.1:2"]"#, "round_robin");
        let h = &rt.upstreams[0].health;
        for _ in 0..3 {
            h.report_failure(0);
        }
        let b = Balancer::new(&rt, 0);
        let stats = &rt.upstream_stats.shards[0];
        let at = |now| b.pick(&rt, stats, 0, client(0), &mut Tried::default(), now);
        assert!((0..10).all(|_| at(5_000).ep == 1), "ejected for 10 s");
        let picks: Vec<_> = (0..10).map(|_| at(10_000)).collect();
        let trials: Vec<_> = picks.iter().filter(|p| p.ep == 0).collect();
        assert_eq!(trials.len(), 1);
        assert!(trials[0].trial);
    }

    #[test]
    fn drained_and_disabled_endpoints_get_no_picks_even_in_panic_mode() {
        use crate::upstream::health::AdminState;
        let rt = runtime(
            r#"["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]"#,
            "round_robin",
        );
        rt.upstreams[0].health.set_admin_state(AdminState::Draining);
        rt.upstreams[1].health.set_admin_state(AdminState::Disabled);
        assert_eq!(counts(&rt, 30), [0, 0, 30]);
        // The one left is down: panic mode, but only among those in service.
        rt.upstreams[2].health.set_active_down(true);
        assert_eq!(counts(&rt, 30), [0, 0, 30]);
        // Every one out (possible after a reload): the whole cluster again.
        rt.upstreams[2].health.set_admin_state(AdminState::Disabled);
        let n = counts(&rt, 30);
        assert!(n.iter().all(|&k| k == 10), "{n:?}");
        rt.upstreams[0].health.set_admin_state(AdminState::Enabled);
        assert_eq!(counts(&rt, 30), [30, 0, 0]);
    }

    #[test]
    fn panic_mode_uses_every_endpoint_and_is_counted() {
        let rt = runtime(r#"["127.0.0.1:1", "127.0.0.1:2"]"#, "round_robin");
        for u in &rt.upstreams {
            u.health.set_active_down(true);
        }
        let b = Balancer::new(&rt, 0);
        let stats = &rt.upstream_stats.shards[0];
        let p = b.pick(&rt, stats, 0, client(0), &mut Tried::default(), 0);
        assert!(p.panic);
        assert_eq!(counts(&rt, 10), [5, 5]);
        assert!(rt.clusters[0].health.in_panic());
        assert_eq!(stats.panic_picks[0].get(), 11);
        rt.upstreams[1].health.set_active_down(false);
        assert_eq!(counts(&rt, 4), [0, 4]);
        assert!(!rt.clusters[0].health.in_panic());
    }

    #[test]
    fn retries_go_to_an_endpoint_not_yet_tried() {
        for lb in ["round_robin", "least_conn", "source_ip"] {
            let rt = runtime(r#"["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]"#, lb);
            let b = Balancer::new(&rt, 0);
            let stats = &rt.upstream_stats.shards[0];
            let mut tried = Tried::default();
            let mut seen: Vec<usize> = (0..3)
                .map(|_| b.pick(&rt, stats, 0, client(7), &mut tried, 0).ep)
                .collect();
            seen.sort();
            assert_eq!(seen, [0, 1, 2], "{lb}");
            // Every endpoint tried: the cluster is open again.
            let again = b.pick(&rt, stats, 0, client(7), &mut tried, 0).ep;
            assert!(again < 3);
        }
        let rt = runtime(r#"["127.0.0.1:1"]"#, "round_robin");
        let b = Balancer::new(&rt, 0);
        let mut tried = Tried::default();
        let stats = &rt.upstream_stats.shards[0];
        assert_eq!(b.pick(&rt, stats, 0, client(0), &mut tried, 0).ep, 0);
        assert_eq!(
            b.pick(&rt, stats, 0, client(0), &mut tried, 0).ep,
            0,
            "one endpoint: retried on itself"
        );
    }
}
