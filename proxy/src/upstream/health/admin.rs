//! The operator's say over an endpoint (`POST /endpoints/{cluster}/{endpoint}/drain|disable|enable`): its administrative state, kept across reloads by cluster and endpoint name.
//!
//! The state is one atomic byte in the endpoint's [`EndpointHealth`], read by
//! every pick with one relaxed load. It is not health: an endpoint taken out
//! by the operator stays out whatever its checks say, panic mode included
//! (the balancer uses it only when every endpoint of its cluster is out, see
//! `lb.rs`). HAProxy's `set server state drain|maint|ready` are the model:
//!
//! - `draining`: no new request is sent to it; requests in flight finish on
//!   their connections; its idle pooled connections are not reused and close
//!   when the pool's idle timeout passes; the active check keeps probing it,
//!   so the status page still shows whether it is healthy.
//! - `disabled`: no request; every shard closes its idle pooled connections
//!   within a second (the tick); the active check stops probing it.
//! - `enabled`: back in service (health decides again).

use std::sync::atomic::Ordering::Relaxed;

use crate::upstream::cluster::Upstreams;
use crate::upstream::health::EndpointHealth;

/// An endpoint's administrative state.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AdminState {
    Enabled = 0,
    Draining = 1,
    Disabled = 2,
}

impl AdminState {
    pub const ALL: [AdminState; 3] = [
        AdminState::Enabled,
        AdminState::Draining,
        AdminState::Disabled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Enabled => "enabled",
            AdminState::Draining => "draining",
            AdminState::Disabled => "disabled",
        }
    }

    /// The state a `POST .../{action}` asks for: `drain`, `disable` or `enable`.
    pub fn from_action(action: &str) -> Option<AdminState> {
        match action {
            "drain" => Some(AdminState::Draining),
            "disable" => Some(AdminState::Disabled),
            "enable" => Some(AdminState::Enabled),
            _ => None,
        }
    }

    fn from_u8(v: u8) -> AdminState {
        match v {
            1 => AdminState::Draining,
            2 => AdminState::Disabled,
            _ => AdminState::Enabled,
        }
    }
}

impl EndpointHealth {
    /// The operator's state of this endpoint.
    #[inline]
    pub fn admin_state(&self) -> AdminState {
        AdminState::from_u8(self.admin.load(Relaxed))
    }

    /// Whether the operator leaves it in service (not drained, not disabled).
    #[inline]
    pub fn in_service(&self) -> bool {
        self.admin.load(Relaxed) == AdminState::Enabled as u8
    }

    /// Sets the operator's state; returns the one before.
    pub fn set_admin_state(&self, s: AdminState) -> AdminState {
        AdminState::from_u8(self.admin.swap(s as u8, Relaxed))
    }
}

/// What a reload keeps of `prev`'s endpoints in `next`, matched by cluster
/// name and endpoint label: the operator's state (the same atomic, so a
/// change made on either runtime holds for both) and the ejection count (a
/// counter never goes back). Endpoints new in `next` start enabled.
pub fn carry_over(next: &mut Upstreams, prev: &Upstreams) {
    let names: Vec<String> = next
        .upstreams
        .iter()
        .map(|u| next.clusters[u.cluster].name.clone())
        .collect();
    for (u, cluster) in next.upstreams.iter_mut().zip(names) {
        let old = prev
            .upstreams
            .iter()
            .find(|o| o.label == u.label && prev.clusters[o.cluster].name == cluster);
        if let Some(o) = old {
            u.health.admin = o.health.admin.clone();
            u.health
                .ejections
                .store(o.health.ejections.load(Relaxed), Relaxed);
        }
    }
}

/// Why a state change is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No cluster of that name.
    NoCluster,
    /// The cluster has no endpoint of that label.
    NoEndpoint,
    /// It would take the cluster's last endpoint in service out.
    LastInService,
}

/// Sets endpoint `label` of `cluster` to `to`; returns the slot and the
/// state before. Taking the last endpoint of a cluster out of service is
/// refused: the cluster would have nowhere to send requests.
pub fn set(
    up: &Upstreams,
    cluster: &str,
    label: &str,
    to: AdminState,
) -> Result<(usize, AdminState), Refusal> {
    let c = up
        .clusters
        .iter()
        .find(|c| c.name == cluster)
        .ok_or(Refusal::NoCluster)?;
    let ep = *c
        .endpoints
        .iter()
        .find(|&&ep| up.upstreams[ep].label == label)
        .ok_or(Refusal::NoEndpoint)?;
    let h = &up.upstreams[ep].health;
    if to != AdminState::Enabled {
        let others = c
            .endpoints
            .iter()
            .filter(|&&e| e != ep && up.upstreams[e].health.in_service())
            .count();
        if others == 0 {
            return Err(Refusal::LastInService);
        }
    }
    Ok((ep, h.set_admin_state(to)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zgix_config::Config;

    fn up(eps: &str) -> Upstreams {
        let text = format!(
            r#"{{"listeners": [{{"bind": "127.0.0.1:0", "http": {{"cluster": "c"}}}}],
                "clusters": {{"c": {{"endpoints": {eps}}}}}}}"#
        );
        Upstreams::build(&Config::from_json(&text).unwrap(), 1)
    }

    #[test]
    fn states_change_and_the_last_endpoint_in_service_stays() {
        let u = up(r#"["127.0.0.1:1", "127.0.0.1:2"]"#);
        assert_eq!(
            set(&u, "c", "127.0.0.1:1", AdminState::Draining),
            Ok((0, AdminState::Enabled))
        );
        assert!(!u.upstreams[0].health.in_service());
        assert_eq!(
            set(&u, "c", "127.0.0.1:2", AdminState::Disabled),
            Err(Refusal::LastInService)
        );
        assert_eq!(
            set(&u, "c", "127.0.0.1:9", AdminState::Enabled),
            Err(Refusal::NoEndpoint)
        );
        assert_eq!(
            set(&u, "x", "127.0.0.1:1", AdminState::Enabled),
            Err(Refusal::NoCluster)
        );
        assert_eq!(
            set(&u, "c", "127.0.0.1:1", AdminState::Enabled),
            Ok((0, AdminState::Draining))
        );
        assert_eq!(
            AdminState::from_action("disable"),
            Some(AdminState::Disabled)
        );
        assert_eq!(AdminState::from_action("maint"), None);
    }

    #[test]
    fn a_reload_keeps_the_state_and_the_ejections_by_name() {
        let old = up(r#"["127.0.0.1:1", "127.0.0.1:2"]"#);
        set(&old, "c", "127.0.0.1:2", AdminState::Disabled).unwrap();
        old.upstreams[1].health.ejections.store(3, Relaxed);
        // Reordered, one added: matched by label, the new one enabled.
        let mut new = up(r#"["127.0.0.1:3", "127.0.0.1:2", "127.0.0.1:1"]"#);
        carry_over(&mut new, &old);
        let state: Vec<_> = new
            .upstreams
            .iter()
            .map(|u| u.health.admin_state())
            .collect();
        assert_eq!(
            state,
            [
                AdminState::Enabled,
                AdminState::Disabled,
                AdminState::Enabled
            ]
        );
        assert_eq!(new.upstreams[1].health.ejections(), 3);
        // One state for both generations: a change on the old one holds.
        set(&old, "c", "127.0.0.1:2", AdminState::Enabled).unwrap();
        assert!(new.upstreams[1].health.in_service());
    }
}
