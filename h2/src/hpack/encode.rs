//! The HPACK encoder of zgix's responses (RFC 7541 §6): static-table indexes and literals never added to a table, Huffman-coded when shorter — no dynamic table, so no memory per connection (as nginx and HAProxy do); the last value coded for each static-table name is kept per thread and its bytes copied when it comes again.

use std::cell::RefCell;

use super::huffman;

/// Encodes response header blocks. It never inserts into the client's
/// dynamic table, so the table stays empty whatever its size; after each
/// `set_peer_max_table` (the client's SETTINGS_HEADER_TABLE_SIZE) the next
/// block starts with a size update to 0 (RFC 7541 §4.2: one is due at the
/// start of the first block after a change, and some decoders, nghttp2's,
/// insist on one after the setting is lowered; 0 is at most any setting
/// and says what the table is: empty).
///
/// What `status` and `field` write depends on their arguments alone (no
/// table, no state), so their bytes can be kept and copied into later
/// blocks of any connection. `field` does so itself for names in the
/// static table ([`Memo`]): a value that changes seldom (`server`,
/// `content-type`, `date` within its second) is Huffman-coded once.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    /// A size update is due at the next block's start.
    owe_update: bool,
}

/// An integer with a `prefix`-bit prefix (RFC 7541 §5.1), the first byte's
/// other bits `flags`.
#[inline]
pub(crate) fn integer(dst: &mut Vec<u8>, flags: u8, prefix: u32, v: usize) {
    let mask = (1usize << prefix) - 1;
    if v < mask {
        dst.push(flags | v as u8);
        return;
    }
    dst.push(flags | mask as u8);
    let mut v = v - mask;
    while v >= 0x80 {
        dst.push(v as u8 | 0x80);
        v >>= 7;
    }
    dst.push(v as u8);
}

/// A string literal (§5.2), Huffman-coded when that is shorter: coded in
/// one pass behind a one-byte length, moved along when the length takes
/// more, replaced by the raw bytes when not shorter.
#[inline]
pub(crate) fn string(dst: &mut Vec<u8>, s: &[u8]) {
    let at = dst.len();
    dst.push(0x80);
    if huffman::encode_shorter(s, dst) {
        let h = dst.len() - at - 1;
        if h < 0x7f {
            dst[at] = 0x80 | h as u8;
        } else {
            // At least 127 bytes coded: a longer length, rare.
            let mut len = Vec::with_capacity(6);
            integer(&mut len, 0x80, 7, h);
            dst.splice(at..at + 1, len);
        }
    } else {
        dst.truncate(at);
        integer(dst, 0, 7, s.len());
        dst.extend_from_slice(s);
    }
}

/// Longest value [`Memo`] keeps.
const MEMO_VALUE: usize = 40;

/// One static-table name's last value and its coded string literal.
#[derive(Clone, Copy)]
struct Kept {
    value: [u8; MEMO_VALUE],
    value_len: u8,
    coded: [u8; MEMO_VALUE + 1],
    /// 0: nothing kept.
    coded_len: u8,
}

/// The last value coded for each static-table name (index 1 to 61), per
/// thread (zgix runs a connection's codec on one shard's thread): about
/// 5 KiB a thread, nothing per connection. Responses repeat most values
/// (`server`, `content-type`, `cache-control`, `vary`; `date` for a
/// second), so their Huffman coding (about 200 instructions a value) is
/// done once. Left out: `content-length` (it changes with nearly every
/// answer and its digits code cheaply), and values that may be secrets
/// (`set-cookie`, the `authorization` fields, any never-indexed field),
/// which are not kept in memory past their block.
struct Memo {
    slots: [Kept; 62],
}

thread_local! {
    static MEMO: RefCell<Memo> = const {
        RefCell::new(Memo {
            slots: [Kept {
                value: [0; MEMO_VALUE],
                value_len: 0,
                coded: [0; MEMO_VALUE + 1],
                coded_len: 0,
            }; 62],
        })
    };
}

/// `value`'s string literal for the static name `i`: copied from the
/// memo when it is the value last coded for that name, else coded (and
/// kept when it fits).
fn memo_string(i: usize, value: &[u8], dst: &mut Vec<u8>) {
    if value.len() > MEMO_VALUE || matches!(i, 23 | 28 | 49 | 55) {
        string(dst, value);
        return;
    }
    MEMO.with(|m| {
        let Ok(mut m) = m.try_borrow_mut() else {
            string(dst, value);
            return;
        };
        let k = &mut m.slots[i];
        let n = usize::from(k.value_len);
        if k.coded_len > 0 && &k.value[..n] == value {
            dst.extend_from_slice(&k.coded[..usize::from(k.coded_len)]);
            return;
        }
        let at = dst.len();
        string(dst, value);
        let coded = &dst[at..];
        // A value of at most 40 bytes codes into at most 41 (length byte
        // and the raw bytes when Huffman is not shorter).
        if coded.len() <= k.coded.len() {
            k.value[..value.len()].copy_from_slice(value);
            k.value_len = value.len() as u8;
            k.coded[..coded.len()].copy_from_slice(coded);
            k.coded_len = coded.len() as u8;
        }
    });
}

/// The static table's first index with this name (RFC 7541 Appendix A).
pub(crate) fn static_name(name: &[u8]) -> Option<usize> {
    Some(match name {
        b":authority" => 1,
        b":method" => 2,
        b":path" => 4,
        b":scheme" => 6,
        b":status" => 8,
        b"accept-charset" => 15,
        b"accept-encoding" => 16,
        b"accept-language" => 17,
        b"accept-ranges" => 18,
        b"accept" => 19,
        b"access-control-allow-origin" => 20,
        b"age" => 21,
        b"allow" => 22,
        b"authorization" => 23,
        b"cache-control" => 24,
        b"content-disposition" => 25,
        b"content-encoding" => 26,
        b"content-language" => 27,
        b"content-length" => 28,
        b"content-location" => 29,
        b"content-range" => 30,
        b"content-type" => 31,
        b"cookie" => 32,
        b"date" => 33,
        b"etag" => 34,
        b"expect" => 35,
        b"expires" => 36,
        b"from" => 37,
        b"host" => 38,
        b"if-match" => 39,
        b"if-modified-since" => 40,
        b"if-none-match" => 41,
        b"if-range" => 42,
        b"if-unmodified-since" => 43,
        b"last-modified" => 44,
        b"link" => 45,
        b"location" => 46,
        b"max-forwards" => 47,
        b"proxy-authenticate" => 48,
        b"proxy-authorization" => 49,
        b"range" => 50,
        b"referer" => 51,
        b"refresh" => 52,
        b"retry-after" => 53,
        b"server" => 54,
        b"set-cookie" => 55,
        b"strict-transport-security" => 56,
        b"transfer-encoding" => 57,
        b"user-agent" => 58,
        b"vary" => 59,
        b"via" => 60,
        b"www-authenticate" => 61,
        _ => return None,
    })
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// The client's SETTINGS_HEADER_TABLE_SIZE (RFC 7541 §4.2). The encoder
    /// never inserts, so the value itself does not matter: the next block
    /// starts with a size update to 0 (see `Encoder`).
    pub fn set_peer_max_table(&mut self, _n: usize) {
        self.owe_update = true;
    }

    /// Start a block: writes any size update owed (§6.3).
    pub fn begin(&mut self, dst: &mut Vec<u8>) {
        if self.owe_update {
            self.owe_update = false;
            dst.push(0x20);
        }
    }

    /// `:status` (static-table index for 200, 204, 206, 304, 400, 404, 500;
    /// literal without indexing with the static name index 8 otherwise).
    pub fn status(&mut self, code: u16, dst: &mut Vec<u8>) {
        let i = match code {
            200 => 8,
            204 => 9,
            206 => 10,
            304 => 11,
            400 => 12,
            404 => 13,
            500 => 14,
            _ => {
                // §6.2.2 with name index 8; the code in decimal.
                dst.push(0x08);
                let mut d = [0u8; 5];
                let (mut at, mut c) = (d.len(), code);
                loop {
                    at -= 1;
                    d[at] = b'0' + (c % 10) as u8;
                    c /= 10;
                    if c == 0 {
                        break;
                    }
                }
                string(dst, &d[at..]);
                return;
            }
        };
        dst.push(0x80 | i);
    }

    /// A regular field; `name` already lowercase. Static-table name index
    /// where one exists; Huffman when it is shorter; `sensitive` →
    /// never-indexed literal (§6.2.3), else without indexing (§6.2.2).
    pub fn field(&mut self, name: &[u8], value: &[u8], sensitive: bool, dst: &mut Vec<u8>) {
        let flags = if sensitive { 0x10 } else { 0 };
        match static_name(name) {
            Some(16) if !sensitive && value == b"gzip, deflate" => dst.push(0x80 | 16),
            Some(i) => {
                integer(dst, flags, 4, i);
                if sensitive {
                    string(dst, value);
                } else {
                    memo_string(i, value, dst);
                }
            }
            None => {
                dst.push(flags);
                string(dst, name);
                string(dst, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `field` without the memo: the bytes it must write.
    fn plain(i: usize, value: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        integer(&mut b, 0, 4, i);
        string(&mut b, value);
        b
    }

    #[test]
    fn a_kept_value_is_copied_as_coded_and_a_changed_one_coded_again() {
        let mut e = Encoder::new();
        let values: [&[u8]; 6] = [
            b"zgix-bench",
            b"zgix-bench",
            b"nginx",
            b"zgix-bench",
            b"\x01\x02 not shorter in huffman",
            &[b'x'; MEMO_VALUE + 1],
        ];
        for v in values {
            let mut b = Vec::new();
            e.field(b"server", v, false, &mut b);
            assert_eq!(b, plain(54, v), "{v:?}");
        }
        // A value longer than the memo keeps was not kept: the last kept
        // one is still the one before it.
        let k = MEMO.with(|m| m.borrow().slots[54]);
        assert_eq!(&k.value[..usize::from(k.value_len)], values[4]);
    }

    #[test]
    fn secrets_and_lengths_are_not_kept() {
        let mut e = Encoder::new();
        for (name, i, sensitive) in [
            (&b"set-cookie"[..], 55, false),
            (b"authorization", 23, false),
            (b"content-length", 28, false),
            (b"etag", 34, true),
        ] {
            let mut b = Vec::new();
            e.field(name, b"v=1", sensitive, &mut b);
            let k = MEMO.with(|m| m.borrow().slots[i]);
            assert_eq!(k.coded_len, 0, "{name:?}");
        }
    }
}
