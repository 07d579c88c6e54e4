//! Request IDs (`X-Request-ID`): a client's acceptable one kept, or a new 128-bit random one written as 32 hex digits, in a fixed buffer that never allocates.

use std::cell::Cell;

use zgix_config::{RequestIdMode, MAX_REQUEST_ID_BYTES};

/// One request's ID, as sent upstream, in zgix's own answers and in the logs.
/// Empty when the listener's `request_id` is `false`.
#[derive(Clone, Copy)]
pub struct RequestId {
    buf: [u8; MAX_REQUEST_ID_BYTES],
    len: u8,
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId {
            buf: [0; MAX_REQUEST_ID_BYTES],
            len: 0,
        }
    }
}

impl PartialEq for RequestId {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RequestId({:?})",
            String::from_utf8_lossy(self.as_bytes())
        )
    }
}

thread_local! {
    /// A SplitMix64 state per thread, seeded on first use from the OS's
    /// randomness through std's `RandomState` (no extra crate, no syscall per
    /// request); 0 until then (a const initialiser: no lazy-init check).
    static STATE: Cell<u64> = const { Cell::new(0) };
}

fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish() | 1
}

/// SplitMix64 (Steele, Lea, Flood 2014): full-period, well mixed; the IDs must
/// be unique and unguessable enough not to collide across a fleet, not secret.
/// Two outputs, one thread-local access.
fn next_pair() -> (u64, u64) {
    fn mix(z: u64) -> u64 {
        let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    STATE.with(|s| {
        let mut z = s.get();
        if z == 0 {
            z = seed();
        }
        let a = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let b = a.wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(b);
        (mix(a), mix(b))
    })
}

/// `x` as 8 lowercase hex digits, most significant first, the nibbles
/// spread one to a byte and turned into digits eight at a time.
fn hex8(x: u32) -> [u8; 8] {
    const LO: u64 = 0x0101_0101_0101_0101;
    let x = u64::from(x);
    let x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    let x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    let x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // Byte k holds nibble k (the least significant first): flip for text.
    let x = x.swap_bytes();
    // 1 in each byte whose nibble is 10 or more ('a'..'f').
    let letters = ((x + 6 * LO) >> 4) & LO;
    (x + u64::from(b'0') * LO + letters * u64::from(b'a' - b'0' - 10)).to_le_bytes()
}

impl RequestId {
    /// The bytes to send and log; empty for none.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ID of a request under `mode`, given the values of its `X-Request-ID`
    /// fields (`client`): in `"generate"` mode one acceptable value is kept
    /// (two fields, or a bad value, get a new ID); `"replace"` always makes a
    /// new one; `false` gives none.
    pub fn choose<'a>(&mut self, mode: RequestIdMode, mut client: impl Iterator<Item = &'a [u8]>) {
        self.len = 0;
        match mode {
            RequestIdMode::Off => {}
            RequestIdMode::Generate => match (client.next(), client.next()) {
                (Some(v), None) if RequestIdMode::acceptable(v) => {
                    self.buf[..v.len()].copy_from_slice(v);
                    self.len = v.len() as u8;
                }
                _ => self.generate(),
            },
            RequestIdMode::Replace => self.generate(),
        }
    }

    /// A new random 128-bit ID, 32 lowercase hex digits.
    pub fn generate(&mut self) {
        let (a, b) = next_pair();
        for (at, w) in [(0, a >> 32), (8, a), (16, b >> 32), (24, b)] {
            self.buf[at..at + 8].copy_from_slice(&hex8(w as u32));
        }
        self.len = 32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_digits_are_the_formatters() {
        for x in [
            0,
            1,
            9,
            10,
            15,
            0x1234_abcd,
            0xdead_beef,
            0xa0b0_c0d0,
            u32::MAX,
        ] {
            assert_eq!(&hex8(x), format!("{x:08x}").as_bytes(), "{x:#x}");
        }
        let mut id = RequestId::default();
        id.generate();
        let text = std::str::from_utf8(id.as_bytes()).unwrap();
        assert_eq!(
            u128::from_str_radix(text, 16).map(|v| format!("{v:032x}")),
            Ok(text.to_string())
        );
    }

    #[test]
    fn generate_keep_replace_and_off() {
        let mut id = RequestId::default();
        id.choose(RequestIdMode::Generate, std::iter::empty());
        assert_eq!(id.as_bytes().len(), 32);
        assert!(id
            .as_bytes()
            .iter()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            id.generate();
            assert!(seen.insert(id.as_bytes().to_vec()), "a repeated ID");
        }
        id.choose(RequestIdMode::Generate, [&b"client-7"[..]].into_iter());
        assert_eq!(id.as_bytes(), b"client-7");
        // Two fields or a bad value: a new one.
        id.choose(RequestIdMode::Generate, [&b"a"[..], &b"b"[..]].into_iter());
        assert_eq!(id.as_bytes().len(), 32);
        id.choose(RequestIdMode::Generate, [&b"has space"[..]].into_iter());
        assert_eq!(id.as_bytes().len(), 32);
        id.choose(RequestIdMode::Replace, [&b"client-7"[..]].into_iter());
        assert_ne!(id.as_bytes(), b"client-7");
        assert_eq!(id.as_bytes().len(), 32);
        id.choose(RequestIdMode::Off, [&b"client-7"[..]].into_iter());
        assert!(id.is_empty());
    }
}
