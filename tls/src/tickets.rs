//! Stateless session tickets (RFC 5077 §4's recommended format: key name, IV, AES-256-CBC of the session state, HMAC-SHA256 over all three) with keys every shard shares and every box of a fleet can share.
//!
//! Two sources of keys:
//!
//! - **Derived** (`session_tickets` omitted): one 32-byte master secret made
//!   at start; the keys of 12-hour period `k` are HMAC-SHA256(master,
//!   label ‖ k). A ticket is sealed with the current period's key and opened
//!   with the current or the previous one, so a key encrypts for 12 h and
//!   decrypts for 24 h. Nothing rotates and nothing is locked: every shard
//!   computes the same keys from the clock, and keeping the master across a
//!   reload or an `--upgrade` (it travels with the sockets) keeps every
//!   ticket valid.
//! - **A key file** in HAProxy's `tls-ticket-keys` format: one base64 line
//!   per 80-byte key (16-byte name, 32-byte AES key, 32-byte HMAC key). As
//!   in HAProxy, the last [`FILE_KEYS_USED`] keys are used: the penultimate
//!   one seals, all of them open. Rotating is appending a line and reloading,
//!   on every box.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_lc_rs::cipher::{
    DecryptionContext, EncryptionContext, PaddedBlockDecryptingKey, PaddedBlockEncryptingKey,
    UnboundCipherKey, AES_256,
};
use aws_lc_rs::hmac;
use base64::Engine as _;

/// How long a sealing key seals (the period of derived keys).
pub const PERIOD_SECS: u64 = 12 * 3600;

/// Keys of a key file in use, as HAProxy's `TLS_TICKETS_NO` (3).
pub const FILE_KEYS_USED: usize = 3;

const NAME: usize = 16;
const IV: usize = 16;
const MAC: usize = 32;

/// One ticket key.
#[derive(Clone)]
pub struct Key {
    name: [u8; NAME],
    aes: [u8; 32],
    mac: hmac::Key,
}

impl Key {
    fn from_parts(name: &[u8], aes: &[u8], mac: &[u8]) -> Key {
        let mut k = Key {
            name: [0; NAME],
            aes: [0; 32],
            mac: hmac::Key::new(hmac::HMAC_SHA256, mac),
        };
        k.name.copy_from_slice(&name[..NAME]);
        k.aes.copy_from_slice(&aes[..32]);
        k
    }

    fn seal(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut iv = [0u8; IV];
        aws_lc_rs::rand::fill(&mut iv).ok()?;
        let key =
            PaddedBlockEncryptingKey::cbc_pkcs7(UnboundCipherKey::new(&AES_256, &self.aes).ok()?)
                .ok()?;
        let mut body = plain.to_vec();
        key.less_safe_encrypt(&mut body, EncryptionContext::Iv128(iv.into()))
            .ok()?;
        let mut out = Vec::with_capacity(NAME + IV + body.len() + MAC);
        out.extend_from_slice(&self.name);
        out.extend_from_slice(&iv);
        out.extend_from_slice(&body);
        let tag = hmac::sign(&self.mac, &out);
        out.extend_from_slice(tag.as_ref());
        Some(out)
    }

    /// Opens a ticket sealed with this key (its name already matched).
    fn open(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        if ticket.len() < NAME + IV + 16 + MAC {
            return None;
        }
        let (signed, tag) = ticket.split_at(ticket.len() - MAC);
        hmac::verify(&self.mac, signed, tag).ok()?;
        let iv: [u8; IV] = signed[NAME..NAME + IV].try_into().ok()?;
        let mut body = signed[NAME + IV..].to_vec();
        let key =
            PaddedBlockDecryptingKey::cbc_pkcs7(UnboundCipherKey::new(&AES_256, &self.aes).ok()?)
                .ok()?;
        let n = key
            .decrypt(&mut body, DecryptionContext::Iv128(iv.into()))
            .ok()?
            .len();
        body.truncate(n);
        Some(body)
    }
}

/// Where the keys come from.
enum Source {
    Derived {
        master: [u8; 32],
    },
    /// The keys in use, and which of them seals.
    File {
        open: Vec<Key>,
        seal: usize,
    },
}

/// The ticket keys of a listener (or of every listener: one value is
/// shared by all shards through an `Arc`).
pub struct Tickets {
    source: Source,
}

impl std::fmt::Debug for Tickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.source {
            Source::Derived { .. } => "Tickets(derived)",
            Source::File { .. } => "Tickets(file)",
        })
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Tickets {
    /// Keys derived from a new random master secret.
    pub fn generate() -> Result<Tickets, String> {
        let mut master = [0u8; 32];
        aws_lc_rs::rand::fill(&mut master).map_err(|_| "no randomness for ticket keys")?;
        Ok(Tickets::derived(master))
    }

    /// Keys derived from `master` (kept across reloads and handed over on
    /// `--upgrade`).
    pub fn derived(master: [u8; 32]) -> Tickets {
        Tickets {
            source: Source::Derived { master },
        }
    }

    /// The master secret of derived keys, to hand to a new instance.
    pub fn master(&self) -> Option<[u8; 32]> {
        match &self.source {
            Source::Derived { master } => Some(*master),
            Source::File { .. } => None,
        }
    }

    /// Keys read from a file in HAProxy's `tls-ticket-keys` format.
    pub fn from_file(path: &Path) -> Result<Tickets, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read it: {e}", path.display()))?;
        Tickets::parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn parse_file(text: &str) -> Result<Tickets, String> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let raw = base64::engine::general_purpose::STANDARD
                .decode(line)
                .map_err(|e| format!("line {}: not base64: {e}", i + 1))?;
            if raw.len() != 80 {
                return Err(format!(
                    "line {}: a key is 80 bytes (16 name, 32 AES, 32 HMAC), this one {}; \
                     48-byte AES-128 keys are not supported",
                    i + 1,
                    raw.len()
                ));
            }
            keys.push(Key::from_parts(&raw[..16], &raw[16..48], &raw[48..80]));
        }
        if keys.is_empty() {
            return Err("no key in the file (one base64 80-byte key a line)".into());
        }
        let used = keys.split_off(keys.len().saturating_sub(FILE_KEYS_USED));
        let seal = used.len().saturating_sub(2);
        Ok(Tickets {
            source: Source::File { open: used, seal },
        })
    }

    /// The derived keys of period `k`, from this thread's cache (a shard
    /// derives each period's keys once, not three HMACs per ticket).
    fn period_key(master: &[u8; 32], k: u64) -> Key {
        thread_local! {
            static CACHE: std::cell::RefCell<Vec<([u8; 32], u64, Key)>> =
                const { std::cell::RefCell::new(Vec::new()) };
        }
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            if let Some((_, _, key)) = c.iter().find(|(m, p, _)| m == master && *p == k) {
                return key.clone();
            }
            let key = Tickets::derive_period_key(master, k);
            if c.len() >= 4 {
                c.remove(0);
            }
            c.push((*master, k, key.clone()));
            key
        })
    }

    fn derive_period_key(master: &[u8; 32], k: u64) -> Key {
        let root = hmac::Key::new(hmac::HMAC_SHA256, master);
        let part = |label: &[u8]| {
            let mut ctx = hmac::Context::with_key(&root);
            ctx.update(label);
            ctx.update(&k.to_be_bytes());
            ctx.sign()
        };
        let (n, a, m) = (
            part(b"zgix ticket name"),
            part(b"zgix ticket aes"),
            part(b"zgix ticket mac"),
        );
        Key::from_parts(n.as_ref(), a.as_ref(), m.as_ref())
    }

    /// Seals session state into a ticket at time `now` (seconds).
    pub fn seal_at(&self, plain: &[u8], now: u64) -> Option<Vec<u8>> {
        match &self.source {
            Source::Derived { master } => {
                Tickets::period_key(master, now / PERIOD_SECS).seal(plain)
            }
            Source::File { open, seal } => open[*seal].seal(plain),
        }
    }

    /// Opens a ticket at time `now`: `None` when no key in use sealed it or
    /// it was altered.
    pub fn open_at(&self, ticket: &[u8], now: u64) -> Option<Vec<u8>> {
        let name = ticket.get(..NAME)?;
        match &self.source {
            Source::Derived { master } => {
                let k = now / PERIOD_SECS;
                [k, k.wrapping_sub(1)]
                    .into_iter()
                    .map(|p| Tickets::period_key(master, p))
                    .find(|key| key.name == name)?
                    .open(ticket)
            }
            Source::File { open, .. } => open.iter().find(|key| key.name == name)?.open(ticket),
        }
    }
}

impl rustls::server::ProducesTickets for Tickets {
    fn enabled(&self) -> bool {
        true
    }

    /// The lifetime hint (RFC 8446 §4.6.1): a ticket opens for at least
    /// one period after it was sealed.
    fn lifetime(&self) -> u32 {
        PERIOD_SECS as u32
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal_at(plain, now_secs())
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.open_at(cipher, now_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_800_000_000;

    #[test]
    fn a_derived_key_seals_for_one_period_and_opens_for_two() {
        let t = Tickets::derived([7; 32]);
        let start = T0 - T0 % PERIOD_SECS;
        let ticket = t.seal_at(b"session state", start + 10).unwrap();
        assert_eq!(t.open_at(&ticket, start + 10).unwrap(), b"session state");
        assert_eq!(
            t.open_at(&ticket, start + 2 * PERIOD_SECS - 1).unwrap(),
            b"session state",
            "opens through the next period"
        );
        assert!(
            t.open_at(&ticket, start + 2 * PERIOD_SECS).is_none(),
            "not after 24 h"
        );
        let later = t.seal_at(b"x", start + PERIOD_SECS).unwrap();
        assert_ne!(
            later[..NAME],
            ticket[..NAME],
            "a new period seals with a new key"
        );
    }

    #[test]
    fn every_holder_of_the_master_opens_the_others_tickets_and_nobody_else_does() {
        let a = Tickets::derived([1; 32]);
        let b = Tickets::derived([1; 32]);
        let other = Tickets::derived([2; 32]);
        let ticket = a.seal_at(b"s", T0).unwrap();
        assert_eq!(b.open_at(&ticket, T0).unwrap(), b"s");
        assert!(other.open_at(&ticket, T0).is_none());
    }

    #[test]
    fn an_altered_ticket_does_not_open() {
        let t = Tickets::derived([3; 32]);
        let mut ticket = t.seal_at(b"session", T0).unwrap();
        for i in [NAME + 1, NAME + IV + 2, ticket.len() - 1] {
            ticket[i] ^= 1;
            assert!(t.open_at(&ticket, T0).is_none(), "byte {i} flipped");
            ticket[i] ^= 1;
        }
        assert!(t.open_at(&ticket[..NAME + 4], T0).is_none(), "truncated");
        assert!(t.open_at(&ticket, T0).is_some());
    }

    fn key_line(seed: u8) -> String {
        base64::engine::general_purpose::STANDARD.encode([seed; 80])
    }

    #[test]
    fn a_key_file_seals_with_the_penultimate_of_the_last_three_and_opens_with_each() {
        let four = [1, 2, 3, 4].map(key_line).join("\n");
        let t = Tickets::parse_file(&four).unwrap();
        let ticket = t.seal_at(b"s", T0).unwrap();
        assert_eq!(&ticket[..NAME], &[3u8; NAME], "the penultimate key seals");
        for seed in [2u8, 4] {
            let only = Tickets::parse_file(&[key_line(seed)].join("\n")).unwrap();
            let sealed = only.seal_at(b"s", T0).unwrap();
            assert!(t.open_at(&sealed, T0).is_some(), "key {seed} opens");
        }
        let first = Tickets::parse_file(&key_line(1))
            .unwrap()
            .seal_at(b"s", T0)
            .unwrap();
        assert!(
            t.open_at(&first, T0).is_none(),
            "a key past the last three does not"
        );
    }

    #[test]
    fn a_bad_key_file_names_the_line_and_the_rule() {
        let e = Tickets::parse_file(&format!("{}\n!!!", key_line(1))).unwrap_err();
        assert!(e.starts_with("line 2: not base64"), "{e}");
        let short = base64::engine::general_purpose::STANDARD.encode([0u8; 48]);
        let e = Tickets::parse_file(&short).unwrap_err();
        assert!(
            e.contains("a key is 80 bytes") && e.contains("this one 48"),
            "{e}"
        );
        assert!(Tickets::parse_file("\n# none\n").is_err());
    }
}
