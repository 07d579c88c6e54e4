//! What a reload carries from the previous runtime's upstreams into the new one, by cluster and endpoint name: every counter (so none goes back, the TLS failure counts included) and the operator's endpoint state.

use std::sync::Arc;

use crate::upstream::cluster::Upstreams;

/// Everything [`crate::runtime::Runtime`] keeps of `prev`'s upstreams in `next`.
pub fn carry_over(next: &mut Upstreams, prev: &Upstreams) {
    counters(next, prev);
    crate::upstream::health::admin::carry_over(next, prev);
}

/// Makes `next`'s counters continue `prev`'s (a reload): the retry counts,
/// each cluster's panic picks and TLS failures by cluster name and each
/// endpoint's counters
/// by cluster name and endpoint label. Series new in `next` start at 0.
fn counters(next: &mut Upstreams, prev: &Upstreams) {
    let ep_of = |up: &Upstreams, ep: usize| {
        let u = &up.upstreams[ep];
        (up.clusters[u.cluster].name.clone(), u.label.clone())
    };
    let prev_eps: Vec<(String, String)> = (0..prev.upstreams.len())
        .map(|ep| ep_of(prev, ep))
        .collect();
    for c in next.clusters.iter_mut() {
        if let Some(o) = prev.clusters.iter().find(|o| o.name == c.name) {
            c.tls_failures = o.tls_failures.clone();
        }
    }
    let next_eps: Vec<(String, String)> = (0..next.upstreams.len())
        .map(|ep| ep_of(next, ep))
        .collect();
    for (ep, key) in next_eps.iter().enumerate() {
        if let Some(p) = prev_eps.iter().position(|k| k == key) {
            next.upstreams[ep].log = prev.upstreams[p].log.clone();
        }
    }
    for (i, shard) in next.upstream_stats.shards.iter_mut().enumerate() {
        let Some(old) = prev.upstream_stats.shards.get(i) else {
            continue;
        };
        let shard = Arc::get_mut(shard).expect("carried over before it is shared");
        shard.retries = old.retries.clone();
        for (ep, key) in next_eps.iter().enumerate() {
            if let Some(p) = prev_eps.iter().position(|k| k == key) {
                shard.endpoints[ep] = old.endpoints[p].clone();
            }
        }
        for (ci, c) in next.clusters.iter().enumerate() {
            if let Some(p) = prev.clusters.iter().position(|o| o.name == c.name) {
                shard.panic_picks[ci] = old.panic_picks[p].clone();
                shard.budgets[ci] = old.budgets[p].clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::metrics::RetryReason;

    #[test]
    fn a_reload_continues_every_counter_by_name() {
        let doc = |eps: &str| {
            format!(
                r#"{{"listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "c"}}}}],
                "clusters": {{"c": {{"endpoints": {eps}}}}}}}"#
            )
        };
        let build = |eps: &str| {
            crate::upstream::cluster::Upstreams::build(
                &zgix_config::Config::from_json(&doc(eps)).unwrap(),
                1,
            )
        };
        let old = build(r#"["127.0.0.1:1", "127.0.0.1:2"]"#);
        let s = &old.upstream_stats.shards[0];
        s.retry(RetryReason::Reset);
        drop(s.begin(1));
        s.panic_picks[0].inc();
        old.clusters[0]
            .tls_failures
            .failed(crate::upstream::tls::TlsReason::UnknownCa);
        let mut new = build(r#"["127.0.0.1:2", "127.0.0.1:3"]"#);
        counters(&mut new, &old);
        let n = &new.upstream_stats.shards[0];
        assert_eq!(n.retries[RetryReason::Reset as usize].get(), 1);
        assert_eq!(n.endpoints[0].requests.get(), 1, "127.0.0.1:2 by label");
        assert_eq!(n.endpoints[1].requests.get(), 0);
        assert_eq!(n.panic_picks[0].get(), 1);
        let tls = &new.clusters[0].tls_failures;
        assert_eq!(tls.get(crate::upstream::tls::TlsReason::UnknownCa), 1);
        assert_eq!(tls.get(crate::upstream::tls::TlsReason::BadName), 0);
    }
}
