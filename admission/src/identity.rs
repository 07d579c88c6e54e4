//! `ClientId`: the one client identity (IPv4 /32, IPv6 /64) used by the rate and connection tables, `lb = source_ip` and client filters.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Fixed keys for [`ClientId::source_ip_hash`]. They are constants, not a per-process
/// seed, so every shard and every process on the same build maps a client to the same
/// origin. Changing them reshuffles every `source_ip` affinity; a unit test pins the
/// resulting hash of one address so an accidental change is caught.
const SOURCE_IP_KEYS: [u64; 4] = [
    0x243f_6a88_85a3_08d3, // fractional digits of pi, a nothing-up-my-sleeve choice
    0x1319_8a2e_0370_7344,
    0xa409_3822_299f_31d0,
    0x082e_fa98_ec4e_6c89,
];

/// The high 96 bits of an IPv4 identity: the `::ffff:0:0/96` mapped prefix.
const V4_TAG: u128 = 0xffff_u128 << 32;

/// A client identity: an IPv4 address (/32) or an IPv6 /64 prefix.
///
/// Stored as one `u128` in IPv6 form. IPv4 `a.b.c.d` is kept as `::ffff:a.b.c.d`, so
/// its low 64 bits are never zero, while an IPv6 identity is a /64 network address
/// whose low 64 bits are always zero: the two families can never compare equal, and
/// an IPv4-mapped IPv6 peer is the same client as the IPv4 peer it stands for. The
/// all-ones value is neither shape, which the slot tables use as their empty marker.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClientId(u128);

impl ClientId {
    /// The identity of a peer address: IPv4 → /32, IPv6 → /64, `::ffff:a.b.c.d` → `a.b.c.d`.
    #[inline]
    pub fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::from_v4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::from_v4(v4),
                None => ClientId(u128::from(v6) & !(u128::from(u64::MAX))),
            },
        }
    }

    #[inline]
    fn from_v4(v4: Ipv4Addr) -> Self {
        ClientId(V4_TAG | u128::from(u32::from(v4)))
    }

    /// A representative address: the IPv4 address, or the /64 network address.
    pub fn ip(&self) -> IpAddr {
        if self.is_v4() {
            IpAddr::V4(Ipv4Addr::from(self.0 as u32))
        } else {
            IpAddr::V6(Ipv6Addr::from(self.0))
        }
    }

    /// True for an IPv4 identity.
    #[inline]
    pub fn is_v4(&self) -> bool {
        self.0 >> 32 == 0xffff
    }

    /// The hash `lb = source_ip` uses: ahash with fixed keys, identical on every shard and
    /// in every process of the same build.
    ///
    /// ahash picks its AES or portable path at compile time, so the value is stable for a
    /// given binary (which is what consistent affinity needs), not across builds with
    /// different `target-feature`s.
    #[inline]
    pub fn source_ip_hash(&self) -> u64 {
        let [k0, k1, k2, k3] = SOURCE_IP_KEYS;
        ahash::RandomState::with_seeds(k0, k1, k2, k3).hash_one(self.0)
    }

    /// The raw 128-bit form the slot tables store.
    #[inline]
    pub(crate) fn bits(self) -> u128 {
        self.0
    }
}

impl From<IpAddr> for ClientId {
    fn from(ip: IpAddr) -> Self {
        Self::from_ip(ip)
    }
}

impl fmt::Display for ClientId {
    /// `192.0.2.7` or `2001:db8::/64`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip() {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ClientId {
        ClientId::from_ip(s.parse().unwrap())
    }

    #[test]
    fn ipv4_is_its_own_slash_32() {
        assert_eq!(id("192.0.2.7"), id("192.0.2.7"));
        assert_ne!(id("192.0.2.7"), id("192.0.2.8"));
        assert_eq!(id("192.0.2.7").ip(), "192.0.2.7".parse::<IpAddr>().unwrap());
        assert!(id("192.0.2.7").is_v4());
        assert_eq!(id("0.0.0.0").ip(), "0.0.0.0".parse::<IpAddr>().unwrap());
        assert_eq!(id("255.255.255.255").to_string(), "255.255.255.255");
    }

    #[test]
    fn ipv6_groups_by_slash_64() {
        let a = id("2001:db8:1:2:aaaa:bbbb:cccc:dddd");
        let b = id("2001:db8:1:2::1");
        let c = id("2001:db8:1:3::1");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(!a.is_v4());
        assert_eq!(a.ip(), "2001:db8:1:2::".parse::<IpAddr>().unwrap());
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        // Loopback and the unspecified address share ::/64 and are not IPv4.
        assert_eq!(id("::1"), id("::"));
        assert!(!id("::1").is_v4());
    }

    #[test]
    fn mapped_ipv4_is_the_ipv4_client() {
        assert_eq!(id("::ffff:192.0.2.7"), id("192.0.2.7"));
        assert_eq!(
            id("::ffff:192.0.2.7").ip(),
            "192.0.2.7".parse::<IpAddr>().unwrap()
        );
        assert_ne!(id("::ffff:192.0.2.7"), id("::ffff:192.0.2.8"));
        // ::/64 (which holds every mapped address) is a distinct identity from any IPv4.
        assert_ne!(id("::"), id("0.0.0.0"));
        assert_ne!(id("::1"), id("0.0.0.1"));
    }

    #[test]
    fn families_never_collide_with_the_empty_marker() {
        for s in [
            "0.0.0.0",
            "255.255.255.255",
            "::",
            "ffff:ffff:ffff:ffff::",
            "::1",
        ] {
            assert_ne!(id(s).bits(), u128::MAX, "{s}");
        }
    }

    #[test]
    fn source_ip_hash_is_fixed() {
        let a = id("192.0.2.7");
        let b = ClientId::from_ip("::ffff:192.0.2.7".parse().unwrap());
        assert_eq!(a.source_ip_hash(), b.source_ip_hash());
        assert_ne!(a.source_ip_hash(), id("192.0.2.8").source_ip_hash());
        assert_eq!(
            id("2001:db8::1").source_ip_hash(),
            id("2001:db8::ffff").source_ip_hash()
        );
        // Pinned once: a change of keys, of the identity encoding or of ahash's algorithm
        // reshuffles every source_ip affinity and must be deliberate. ahash selects its
        // AES path from compile-time target features, hence two constants.
        #[cfg(all(target_arch = "x86_64", not(target_feature = "aes")))]
        assert_eq!(a.source_ip_hash(), PINNED_PORTABLE);
        #[cfg(all(target_arch = "x86_64", target_feature = "aes"))]
        assert_eq!(a.source_ip_hash(), PINNED_AES);
    }

    #[cfg(all(target_arch = "x86_64", not(target_feature = "aes")))]
    const PINNED_PORTABLE: u64 = 15_192_141_883_437_631_258;
    #[cfg(all(target_arch = "x86_64", target_feature = "aes"))]
    const PINNED_AES: u64 = 7_511_555_496_490_293_436;
}
