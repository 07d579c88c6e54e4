//! Endpoint choice: per-shard round robin, or a stable hash of the client identity (`source_ip`).

use std::cell::Cell;

use zgix_admission::ClientId;
use zgix_config::Lb;

use crate::runtime::ClusterRt;

/// Picks the endpoint (an index into `Runtime::endpoints`) for one request.
///
/// `source_ip` hashes the client identity with fixed keys, so every shard, and
/// every zgix process with the same config, sends one client to one endpoint.
/// Round robin keeps a per-shard cursor (no shared write); shards start at
/// different offsets so a burst of new connections spreads at once.
#[inline]
pub fn pick(cluster: &ClusterRt, cursor: &Cell<usize>, client: ClientId) -> usize {
    let n = cluster.endpoints.len();
    let i = match cluster.lb {
        Lb::RoundRobin => {
            let c = cursor.get();
            cursor.set(c.wrapping_add(1));
            c % n
        }
        Lb::SourceIp => (client.source_ip_hash() % n as u64) as usize,
    };
    cluster.endpoints[i]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn cluster(lb: Lb) -> ClusterRt {
        ClusterRt {
            name: "c".into(),
            endpoints: vec![10, 11, 12],
            lb,
        }
    }

    #[test]
    fn round_robin_cycles_through_every_endpoint() {
        let c = cluster(Lb::RoundRobin);
        let cur = Cell::new(0);
        let id = ClientId::from_ip("127.0.0.1".parse::<IpAddr>().unwrap());
        let picks: Vec<usize> = (0..6).map(|_| pick(&c, &cur, id)).collect();
        assert_eq!(picks, vec![10, 11, 12, 10, 11, 12]);
    }

    #[test]
    fn source_ip_is_stable_and_ignores_cursor_and_v6_host_bits() {
        let c = cluster(Lb::SourceIp);
        let a = ClientId::from_ip("2001:db8:1:2::1".parse::<IpAddr>().unwrap());
        let b = ClientId::from_ip("2001:db8:1:2:ffff::9".parse::<IpAddr>().unwrap());
        let first = pick(&c, &Cell::new(0), a);
        for k in 0..10 {
            assert_eq!(pick(&c, &Cell::new(k), a), first);
            assert_eq!(pick(&c, &Cell::new(k), b), first, "same /64, same endpoint");
        }
        let v4 = ClientId::from_ip("192.0.2.7".parse::<IpAddr>().unwrap());
        let mapped = ClientId::from_ip("::ffff:192.0.2.7".parse::<IpAddr>().unwrap());
        assert_eq!(pick(&c, &Cell::new(0), v4), pick(&c, &Cell::new(5), mapped));
    }
}
