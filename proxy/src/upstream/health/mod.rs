//! Endpoint health shared by every shard: passive ejection with a half-open trial, the active verdict, panic mode.
//!
//! One [`EndpointHealth`] per endpoint slot lives in the `Runtime`, so all
//! shards see one state. The request path only *reads* it (one relaxed load of
//! the state word, one of the active flag); it writes only when something
//! changes: a failure, an ejection, the trial claim, the recovery. A success
//! on a healthy endpoint with no failures recorded is a load and nothing else,
//! so a busy endpoint's cache line is not bounced between cores.
//!
//! The passive state machine (Envoy's outlier detection, nginx's
//! `max_fails`/`fail_timeout`, with HAProxy's single trial request):
//!
//! ```text
//! Healthy --failures in a row--> Ejected(until) --until passes, a pick claims it--> Trial(deadline)
//! Trial --success--> Healthy        Trial --failure--> Ejected(longer)
//! Trial --deadline passes without a report--> claimable again
//! ```
//!
//! State and time share one `AtomicU64` (two bits of state, 62 bits of
//! milliseconds), so each transition is one compare-and-swap and a reader
//! never sees a state with another state's time.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};

use zgix_config::Passive;

use crate::observe::decision::UpstreamError;

pub mod admin;
mod probe;
pub use admin::AdminState;
pub use probe::{probe_once, run_prober};

const STATE_SHIFT: u32 = 62;
const TIME_MASK: u64 = (1 << STATE_SHIFT) - 1;
const HEALTHY: u64 = 0;
const EJECTED: u64 = 1;
const TRIAL: u64 = 2;

/// Milliseconds on the process-wide monotonic clock every shard shares.
#[inline]
pub fn now_ms() -> u64 {
    zgix_admission::monotonic_now_ns() / 1_000_000
}

/// Whether a pick may use an endpoint now.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Avail {
    /// Healthy: use it.
    Up,
    /// Ejected, marked down by the active check, without an address, or
    /// taken out by the operator (drained, disabled).
    Down,
    /// Its ejection is over: the pick that chooses it must win
    /// [`EndpointHealth::claim_trial`] and send the one trial request.
    TrialDue,
}

/// What a report changed, for the caller's log line and counters.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Nothing an operator needs to hear about.
    None,
    /// Ejected for this many milliseconds.
    Ejected(u64),
    /// The trial request succeeded: the endpoint is back.
    Recovered,
}

/// Which failures count against an endpoint: any failure before the first
/// response byte (connect refused or timed out, reset, garbled or late head).
/// A stall in the middle of a response body (`IdleTimeout`) does not: the
/// endpoint answered, and the client may be the slow side.
pub fn counts_as_failure(kind: UpstreamError) -> bool {
    !matches!(kind, UpstreamError::IdleTimeout)
}

/// The health of one endpoint slot.
pub struct EndpointHealth {
    passive: Option<Passive>,
    /// How long a claimed trial may stay unreported before another pick may
    /// claim one: the longest a request takes to show a failure.
    trial_ms: u64,
    word: AtomicU64,
    failures: AtomicU32,
    /// Ejections since the endpoint was last healthy for `max_ejection_ms`.
    level: AtomicU32,
    healthy_since_ms: AtomicU64,
    /// Set by the active prober.
    active_down: AtomicBool,
    /// Set while a named endpoint has never resolved.
    unresolved: AtomicBool,
    ejections: AtomicU64,
    /// The operator's [`AdminState`] (see `admin.rs`): shared with the same
    /// endpoint's slot in every generation, so a change made while a reload
    /// is being applied is seen by both runtimes.
    admin: std::sync::Arc<std::sync::atomic::AtomicU8>,
}

impl EndpointHealth {
    pub fn new(passive: Option<Passive>, trial_ms: u64) -> EndpointHealth {
        EndpointHealth {
            passive,
            trial_ms: trial_ms.max(1),
            word: AtomicU64::new(HEALTHY),
            failures: AtomicU32::new(0),
            level: AtomicU32::new(0),
            healthy_since_ms: AtomicU64::new(0),
            active_down: AtomicBool::new(false),
            unresolved: AtomicBool::new(false),
            ejections: AtomicU64::new(0),
            admin: Default::default(),
        }
    }

    /// Lock-free read for the balancer.
    #[inline]
    pub fn availability(&self, now: u64) -> Avail {
        if self.active_down.load(Relaxed) || self.unresolved.load(Relaxed) || !self.in_service() {
            return Avail::Down;
        }
        let w = self.word.load(Acquire);
        match w >> STATE_SHIFT {
            HEALTHY => Avail::Up,
            _ if now >= w & TIME_MASK => Avail::TrialDue,
            _ => Avail::Down,
        }
    }

    /// Claims the single trial request after an ejection; true for exactly one
    /// caller across all shards (until the trial deadline passes unreported).
    pub fn claim_trial(&self, now: u64) -> bool {
        let w = self.word.load(Acquire);
        let state = w >> STATE_SHIFT;
        if state == HEALTHY {
            return true;
        }
        if now < w & TIME_MASK {
            return false;
        }
        let trial = (TRIAL << STATE_SHIFT) | (now + self.trial_ms).min(TIME_MASK);
        self.word
            .compare_exchange(w, trial, AcqRel, Relaxed)
            .is_ok()
    }

    /// The exchange reached a response head the caller accepts.
    #[inline]
    pub fn report_success(&self, now: u64) -> Transition {
        if self.failures.load(Relaxed) != 0 {
            self.failures.store(0, Relaxed);
        }
        let w = self.word.load(Acquire);
        if w >> STATE_SHIFT != TRIAL {
            return Transition::None;
        }
        if self
            .word
            .compare_exchange(w, HEALTHY, AcqRel, Relaxed)
            .is_ok()
        {
            self.healthy_since_ms.store(now, Relaxed);
            Transition::Recovered
        } else {
            Transition::None
        }
    }

    /// A failure that counts (see [`counts_as_failure`]).
    pub fn report_failure(&self, now: u64) -> Transition {
        let Some(p) = self.passive else {
            return Transition::None;
        };
        let w = self.word.load(Acquire);
        match w >> STATE_SHIFT {
            // The trial failed (or a request from before the ejection did):
            // out again, for longer.
            TRIAL => self.eject(w, now, &p),
            HEALTHY => {
                let f = self.failures.fetch_add(1, Relaxed) + 1;
                if f >= p.failures {
                    self.eject(w, now, &p)
                } else {
                    Transition::None
                }
            }
            // Already out: a request that started before the ejection.
            _ => Transition::None,
        }
    }

    /// A response status: a 5xx is a failure when `on_5xx` is set.
    pub fn report_status(&self, status: u16, now: u64) -> Transition {
        if status >= 500 && self.passive.is_some_and(|p| p.on_5xx) {
            self.report_failure(now)
        } else {
            self.report_success(now)
        }
    }

    fn eject(&self, from: u64, now: u64, p: &Passive) -> Transition {
        // An endpoint healthy for a whole max ejection starts over at the base.
        let since = self.healthy_since_ms.load(Relaxed);
        if from >> STATE_SHIFT == HEALTHY && now.saturating_sub(since) >= p.max_ejection_ms {
            self.level.store(0, Relaxed);
        }
        let level = self.level.load(Relaxed).min(32);
        let ms = p
            .ejection_ms
            .saturating_mul(1u64 << level)
            .min(p.max_ejection_ms);
        let until = (now.saturating_add(ms)).min(TIME_MASK);
        let to = (EJECTED << STATE_SHIFT) | until;
        if self
            .word
            .compare_exchange(from, to, AcqRel, Relaxed)
            .is_err()
        {
            // Another shard made the transition first.
            return Transition::None;
        }
        self.level.store(level + 1, Relaxed);
        self.failures.store(0, Relaxed);
        self.ejections.fetch_add(1, Relaxed);
        Transition::Ejected(ms)
    }

    /// The active prober's verdict; true when it changed.
    pub fn set_active_down(&self, down: bool) -> bool {
        self.active_down.swap(down, Relaxed) != down
    }

    /// Whether a named endpoint still lacks an address.
    pub fn set_unresolved(&self, unresolved: bool) {
        self.unresolved.store(unresolved, Relaxed);
    }

    /// The health verdict alone (not the operator's state), for the status
    /// page: `unresolved`, `down` (the active check), `ejected`, `trial`
    /// (ejection over, the one trial due or under way) or `up`.
    pub fn health_label(&self, now: u64) -> &'static str {
        if self.unresolved.load(Relaxed) {
            return "unresolved";
        }
        if self.active_down.load(Relaxed) {
            return "down";
        }
        let w = self.word.load(Acquire);
        match w >> STATE_SHIFT {
            HEALTHY => "up",
            TRIAL => "trial",
            _ if now >= w & TIME_MASK => "trial",
            _ => "ejected",
        }
    }

    /// Passive ejections so far.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Relaxed)
    }
}

/// Per-cluster panic flag: set while no endpoint of the cluster is available,
/// so picks use every endpoint rather than none (Envoy's panic mode, with the
/// threshold at "none left": with retries on another endpoint, any healthy
/// endpoint is better than sending traffic to known-bad ones).
#[derive(Default)]
pub struct ClusterHealth {
    panic: AtomicBool,
}

impl ClusterHealth {
    /// Records whether this pick found no available endpoint; logs the edges
    /// (rare writes: only when the state flips).
    #[inline]
    pub fn note(&self, cluster: &str, panic: bool) {
        if self.panic.load(Relaxed) != panic && self.panic.swap(panic, Relaxed) != panic {
            if panic {
                crate::log_warn!(
                    "upstream",
                    "cluster {cluster}: no endpoint is healthy; panic mode: using every endpoint"
                );
            } else {
                crate::log_info!(
                    "upstream",
                    "cluster {cluster}: an endpoint is healthy again; panic mode over"
                );
            }
        }
    }

    pub fn in_panic(&self) -> bool {
        self.panic.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passive(failures: u32) -> Passive {
        Passive {
            failures,
            ejection_ms: 1000,
            max_ejection_ms: 4000,
            on_5xx: false,
        }
    }

    #[test]
    fn ejects_after_consecutive_failures_only() {
        let h = EndpointHealth::new(Some(passive(3)), 500);
        assert_eq!(h.report_failure(0), Transition::None);
        assert_eq!(h.report_failure(0), Transition::None);
        // A success in between resets the run.
        assert_eq!(h.report_success(0), Transition::None);
        assert_eq!(h.report_failure(0), Transition::None);
        assert_eq!(h.report_failure(0), Transition::None);
        assert_eq!(h.availability(0), Avail::Up);
        assert_eq!(h.report_failure(10), Transition::Ejected(1000));
        assert_eq!(h.availability(10), Avail::Down);
        assert_eq!(h.availability(1009), Avail::Down);
        assert_eq!(h.ejections(), 1);
        // Late failures of requests sent before the ejection change nothing.
        assert_eq!(h.report_failure(20), Transition::None);
        assert_eq!(h.availability(1009), Avail::Down);
    }

    #[test]
    fn one_trial_after_ejection_then_recovery() {
        let h = EndpointHealth::new(Some(passive(1)), 500);
        assert_eq!(h.report_failure(0), Transition::Ejected(1000));
        assert_eq!(h.availability(1000), Avail::TrialDue);
        assert!(h.claim_trial(1000));
        // Exactly one trial: every other shard's pick sees it down.
        assert!(!h.claim_trial(1000));
        assert_eq!(h.availability(1200), Avail::Down);
        assert_eq!(h.report_success(1300), Transition::Recovered);
        assert_eq!(h.availability(1300), Avail::Up);
        assert!(h.claim_trial(1300), "healthy endpoints need no claim");
    }

    #[test]
    fn failed_trials_double_the_ejection_up_to_the_cap() {
        let h = EndpointHealth::new(Some(passive(1)), 500);
        let mut now = 0;
        let mut lengths = Vec::new();
        let Transition::Ejected(ms) = h.report_failure(now) else {
            panic!("not ejected")
        };
        lengths.push(ms);
        for _ in 0..4 {
            now += lengths[lengths.len() - 1];
            assert!(h.claim_trial(now));
            let Transition::Ejected(ms) = h.report_failure(now) else {
                panic!("trial failure must eject")
            };
            lengths.push(ms);
        }
        assert_eq!(lengths, [1000, 2000, 4000, 4000, 4000]);
        // Recovered and healthy for a whole max ejection: back to the base.
        now += 4000;
        assert!(h.claim_trial(now));
        assert_eq!(h.report_success(now), Transition::Recovered);
        now += 4000;
        assert_eq!(h.report_failure(now), Transition::Ejected(1000));
    }

    #[test]
    fn recovered_but_flapping_keeps_growing() {
        let h = EndpointHealth::new(Some(passive(1)), 500);
        assert_eq!(h.report_failure(0), Transition::Ejected(1000));
        assert!(h.claim_trial(1000));
        assert_eq!(h.report_success(1000), Transition::Recovered);
        // Fails again soon after recovering: the next ejection is longer.
        assert_eq!(h.report_failure(1100), Transition::Ejected(2000));
    }

    #[test]
    fn an_unreported_trial_can_be_claimed_again_after_its_deadline() {
        let h = EndpointHealth::new(Some(passive(1)), 500);
        h.report_failure(0);
        assert!(h.claim_trial(1000));
        assert!(!h.claim_trial(1499));
        assert_eq!(h.availability(1500), Avail::TrialDue);
        assert!(h.claim_trial(1500));
    }

    #[test]
    fn passive_off_never_ejects_and_5xx_counts_only_when_asked() {
        let h = EndpointHealth::new(None, 500);
        for _ in 0..100 {
            assert_eq!(h.report_failure(0), Transition::None);
        }
        assert_eq!(h.availability(0), Avail::Up);
        let h = EndpointHealth::new(Some(passive(1)), 500);
        assert_eq!(h.report_status(503, 0), Transition::None);
        let mut p = passive(1);
        p.on_5xx = true;
        let h = EndpointHealth::new(Some(p), 500);
        assert_eq!(h.report_status(404, 0), Transition::None);
        assert_eq!(h.report_status(503, 0), Transition::Ejected(1000));
    }

    #[test]
    fn active_verdict_and_unresolved_names_mark_down() {
        let h = EndpointHealth::new(Some(passive(1)), 500);
        assert!(h.set_active_down(true));
        assert!(!h.set_active_down(true));
        assert_eq!(h.availability(0), Avail::Down);
        assert!(h.set_active_down(false));
        assert_eq!(h.availability(0), Avail::Up);
        h.set_unresolved(true);
        assert_eq!(h.availability(0), Avail::Down);
    }

    #[test]
    fn trial_claim_is_exclusive_across_threads() {
        let h = std::sync::Arc::new(EndpointHealth::new(Some(passive(1)), 10_000));
        h.report_failure(0);
        let wins: usize = (0..4)
            .map(|_| {
                let h = h.clone();
                std::thread::spawn(move || (0..1000).filter(|_| h.claim_trial(5000)).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(wins, 1);
    }

    #[test]
    fn mid_body_stalls_do_not_count() {
        assert!(!counts_as_failure(UpstreamError::IdleTimeout));
        for k in [
            UpstreamError::ConnectRefused,
            UpstreamError::ConnectTimeout,
            UpstreamError::Reset,
            UpstreamError::HeaderTimeout,
            UpstreamError::BadResponse,
        ] {
            assert!(counts_as_failure(k), "{k:?}");
        }
    }
}
