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

/// Fixed keys for [`ClientId::from_key`]: every shard and every process of a fleet must
/// map one API key to the same identity (the fleet sync names keys by it).
const KEY_KEYS: [u64; 4] = [
    0xbe54_66cf_34e9_0c6c, // further fractional digits of pi
    0xc0ac_29b7_c97c_50dd,
    0x3f84_d5b5_b547_0917,
    0x9216_d5d9_8979_fb1b,
];

/// Bit 127 marks a hashed key: no IPv4 identity has it (their top 80 bits are zero), and
/// a key's low 64 bits are never zero, so no IPv6 /64 (low 64 bits zero) equals one.
const KEY_TAG: u128 = 1 << 127;
/// Bit 126 is always clear in a key, so a key is never the all-ones empty marker.
const KEY_CLEAR: u128 = 1 << 126;

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

    /// The identity of a request keyed by a header field's value (`"key": {"header":
    /// ...}`): the value hashed with fixed keys into the same 128-bit space, disjoint from
    /// every address identity. Allocation-free.
    #[inline]
    pub fn from_key(value: &[u8]) -> Self {
        let [k0, k1, k2, k3] = KEY_KEYS;
        let hi = ahash::RandomState::with_seeds(k0, k1, k2, k3).hash_one(value);
        let lo = ahash::RandomState::with_seeds(k3, k2, k1, k0).hash_one(value);
        let bits = (u128::from(hi) << 64 | u128::from(lo | 1)) & !KEY_CLEAR;
        ClientId(bits | KEY_TAG)
    }

    /// True for an identity made by [`ClientId::from_key`].
    #[inline]
    pub fn is_key(&self) -> bool {
        self.0 & KEY_TAG != 0 && self.0 as u64 != 0
    }

    /// The raw 128 bits, stable across processes for keys and addresses (names the
    /// identity outside the process, e.g. in a fleet counter's key).
    #[inline]
    pub fn to_bits(self) -> u128 {
        self.0
    }

    /// The identity whose [`ClientId::to_bits`] is `bits` (the fleet sync reads keys
    /// back from the table with it).
    #[inline]
    pub fn from_bits(bits: u128) -> Self {
        ClientId(bits)
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
    /// `192.0.2.7`, `2001:db8::/64`, or `key:<32 hex digits>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_key() {
            return write!(f, "key:{:032x}", self.0);
        }
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
    fn keys_never_equal_an_address_or_the_empty_marker() {
        let k = ClientId::from_key(b"alice-key");
        assert_eq!(k, ClientId::from_key(b"alice-key"));
        assert_ne!(k, ClientId::from_key(b"bob-key"));
        assert!(k.is_key() && !k.is_v4());
        assert_ne!(k.bits(), u128::MAX);
        assert_eq!(k.bits() >> 126, 0b10, "tag set, bit 126 clear");
        assert_ne!(k.bits() as u64, 0, "a /64 has zero low bits, a key never");
        for s in ["0.0.0.0", "255.255.255.255", "::", "ffff:ffff:ffff:ffff::"] {
            assert!(!id(s).is_key(), "{s}");
        }
        assert!(ClientId::from_key(b"").is_key());
        assert!(k.to_string().starts_with("key:"));
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
