//! Re-resolving endpoint names: one named slot refreshed on demand, the background thread that refreshes each cluster's names every `resolve_ms`, and a shard's view of which slots moved.

use std::cell::Cell;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zgix_config::Target;

use crate::upstream::cluster::Upstreams;
use crate::upstream::resolve::{choose, lookup};

/// Retry interval for a name that has never resolved, in clusters without
/// `resolve_ms`: such an endpoint is down until it resolves.
const UNRESOLVED_RETRY: Duration = Duration::from_secs(5);

/// How often the resolver thread looks at the drain flag while it waits.
const RESOLVER_NAP: Duration = Duration::from_millis(200);

/// Resolves every named endpoint once, before any shard starts (blocking
/// lookups are fine here). A name that does not resolve is reported and
/// stays down until the resolver thread resolves it.
pub fn resolve_at_load(up: &mut Upstreams) {
    for slot in 0..up.upstreams.len() {
        if !matches!(up.upstreams[slot].target, Target::Name { .. }) {
            continue;
        }
        if let Some(line) = refresh(up, slot) {
            crate::log_warn!("upstream", "{line}");
        }
        match up.upstreams[slot].addr.get() {
            Some(a) => up.endpoints[slot] = a,
            None => up.upstreams[slot].health.set_unresolved(true),
        }
    }
}

/// Resolves one named slot and stores the outcome; returns an operator-facing
/// line when something worth logging happened.
pub fn refresh(up: &Upstreams, slot: usize) -> Option<String> {
    let ep = &up.upstreams[slot];
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
                    up.clusters[ep.cluster].name, ep.label
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
                up.clusters[ep.cluster].name, ep.label
            ))
        }
    }
}

/// Starts the re-resolution thread when some endpoint is a name: each cluster
/// with `resolve_ms` is refreshed that often; names that never resolved are
/// retried every 5 s in every cluster. The thread ends with the drain.
pub fn spawn_resolver(up: Arc<Upstreams>) -> Option<std::thread::JoinHandle<()>> {
    let named: Vec<usize> = (0..up.upstreams.len())
        .filter(|&i| matches!(up.upstreams[i].target, Target::Name { .. }))
        .collect();
    if named.is_empty() {
        return None;
    }
    let builder = std::thread::Builder::new().name("zgix-resolve".into());
    let spawned = builder.spawn(move || {
        let start = Instant::now();
        let mut due: Vec<Instant> = named.iter().map(|&i| start + period(&up, i)).collect();
        while !up.draining.load(Relaxed) {
            let now = Instant::now();
            for (k, &slot) in named.iter().enumerate() {
                if now >= due[k] {
                    if let Some(line) = refresh(&up, slot) {
                        crate::log_warn!("upstream", "{line}");
                    }
                    due[k] = Instant::now() + period(&up, slot);
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
fn period(up: &Upstreams, slot: usize) -> Duration {
    let ep = &up.upstreams[slot];
    match up.clusters[ep.cluster].resolve_ms {
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
    pub fn new(up: &Upstreams) -> SeenGenerations {
        SeenGenerations(
            up.upstreams
                .iter()
                .map(|e| Cell::new(e.addr.generation()))
                .collect(),
        )
    }

    /// Calls `moved(slot)` for every slot whose address changed since the last call.
    pub fn changed(&self, up: &Upstreams, mut moved: impl FnMut(usize)) {
        for (i, seen) in self.0.iter().enumerate() {
            let g = up.upstreams[i].addr.generation();
            if g != seen.get() {
                seen.set(g);
                moved(i);
            }
        }
    }
}
