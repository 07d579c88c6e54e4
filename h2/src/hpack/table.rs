//! HPACK's tables (RFC 7541 §2.3): the static table of Appendix A, and the decoder's dynamic table as a byte ring allocated on the first insert and grown by doubling up to its bound, with eviction (§4.4).

use std::collections::VecDeque;

/// The static table (RFC 7541 Appendix A); index `i` is `STATIC[i - 1]`.
pub(crate) static STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Per-entry overhead in the table's size (RFC 7541 §4.1).
pub(crate) const ENTRY_OVERHEAD: usize = 32;

/// The smallest byte ring allocated.
const MIN_RING: usize = 128;

/// Where one entry's bytes are in the ring: its name at `off`, its value
/// right after (both possibly wrapping past the ring's end).
#[derive(Clone, Copy, Debug)]
struct Entry {
    off: u32,
    name: u32,
    value: u32,
}

/// A piece of the ring: one slice, or two when it wraps.
pub(crate) type Parts<'a> = (&'a [u8], &'a [u8]);

/// The decoder's dynamic table (RFC 7541 §2.3.2). Heap held: the ring
/// (at most `limit` bytes: the largest need seen rounded up to a power of
/// two, at least 128) and 12 bytes per entry slot (at most `limit / 32`
/// entries fit, §4.1; the deque rounds to a power of two, 4 at least):
/// for 4,096, at
/// most 4,096 + 1,536 bytes; nothing before the first insert, nothing
/// after a size update to 0.
pub(crate) struct Table {
    ring: Vec<u8>,
    /// The oldest entry's first byte.
    head: usize,
    /// Bytes of names and values in the ring.
    used: usize,
    /// Oldest first.
    entries: VecDeque<Entry>,
    /// The table's size as §4.1 counts it.
    size: usize,
    /// The maximum size now (the last size update's, §6.3).
    max: usize,
    /// The most a size update may set (SETTINGS_HEADER_TABLE_SIZE, §4.2).
    limit: usize,
}

impl Table {
    pub(crate) fn new(limit: usize) -> Table {
        // Lengths are kept in u32: a bound far past any real setting.
        let limit = limit.min(u32::MAX as usize);
        Table {
            ring: Vec::new(),
            head: 0,
            used: 0,
            entries: VecDeque::new(),
            size: 0,
            max: limit,
            limit,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The size as RFC 7541 §4.1 counts it.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.ring.capacity() + self.entries.capacity() * std::mem::size_of::<Entry>()
    }

    /// Entry `k`'s name and value, each in one or two parts.
    pub(crate) fn get(&self, k: usize) -> Option<(Parts<'_>, Parts<'_>)> {
        let e = self.entry(k)?;
        let off = e.off as usize;
        let name = self.parts(off, e.name as usize);
        let value = self.parts(self.wrap(off + e.name as usize), e.value as usize);
        Some((name, value))
    }

    fn entry(&self, k: usize) -> Option<Entry> {
        let n = self.entries.len();
        if k >= n {
            return None;
        }
        self.entries.get(n - 1 - k).copied()
    }

    fn wrap(&self, at: usize) -> usize {
        if at >= self.ring.len() {
            at - self.ring.len()
        } else {
            at
        }
    }

    fn parts(&self, off: usize, len: usize) -> Parts<'_> {
        let r = &self.ring;
        match r.get(off..off + len) {
            Some(s) => (s, &[]),
            None => {
                let (a, b) = r.split_at(off.min(r.len()));
                (b, &a[..(len - b.len()).min(a.len())])
            }
        }
    }

    /// A dynamic table size update (§6.3); `false` when over the limit
    /// (a decoding error, §4.2).
    pub(crate) fn set_max(&mut self, max: usize) -> bool {
        if max > self.limit {
            return false;
        }
        self.max = max;
        self.evict_to(max);
        true
    }

    /// A new limit (SETTINGS_HEADER_TABLE_SIZE); when it is under the
    /// maximum now, the maximum comes down to it (entries evicted) and
    /// `true`: the encoder owes a size update (§4.2).
    pub(crate) fn set_limit(&mut self, limit: usize) -> bool {
        self.limit = limit.min(u32::MAX as usize);
        if self.max <= self.limit {
            return false;
        }
        self.max = self.limit;
        self.evict_to(self.max);
        true
    }

    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            let Some(e) = self.entries.pop_front() else {
                break;
            };
            let n = (e.name + e.value) as usize;
            self.head = self.wrap(self.head + n);
            self.used -= n;
            self.size -= n + ENTRY_OVERHEAD;
        }
        if self.entries.is_empty() {
            // Empty: nothing held while there is nothing to hold.
            self.head = 0;
            self.used = 0;
            self.size = 0;
            if max == 0 {
                self.ring = Vec::new();
                self.entries = VecDeque::new();
            }
        }
    }

    /// Adds an entry (§4.4): evicts the oldest until it fits; one larger
    /// than the maximum empties the table and is not added.
    pub(crate) fn insert(&mut self, name: &[u8], value: &[u8]) {
        let n = name.len() + value.len();
        let s = n + ENTRY_OVERHEAD;
        if s > self.max {
            self.evict_to(0);
            return;
        }
        self.evict_to(self.max - s);
        if self.used + n > self.ring.len() {
            self.grow(self.used + n);
        }
        let off = self.wrap(self.head + self.used);
        self.put(off, name);
        self.put(self.wrap(off + name.len()), value);
        self.used += n;
        self.size += s;
        self.entries.push_back(Entry {
            off: off as u32,
            name: name.len() as u32,
            value: value.len() as u32,
        });
    }

    fn put(&mut self, off: usize, s: &[u8]) {
        let room = self.ring.len() - off;
        if s.len() <= room {
            self.ring[off..off + s.len()].copy_from_slice(s);
        } else {
            let (a, b) = s.split_at(room);
            self.ring[off..].copy_from_slice(a);
            self.ring[..b.len()].copy_from_slice(b);
        }
    }

    /// A ring of at least `need` bytes (need <= max <= limit), the entries
    /// laid out again from its start.
    fn grow(&mut self, need: usize) {
        let cap = need
            .max(MIN_RING)
            .checked_next_power_of_two()
            .unwrap_or(need)
            .min(self.limit)
            .max(need);
        let mut ring = vec![0u8; cap];
        let (a, b) = self.parts(self.head, self.used);
        ring[..a.len()].copy_from_slice(a);
        ring[a.len()..a.len() + b.len()].copy_from_slice(b);
        let head = self.head;
        let old = self.ring.len();
        for e in &mut self.entries {
            let off = e.off as usize;
            e.off = if off >= head {
                off - head
            } else {
                off + old - head
            } as u32;
        }
        self.ring = ring;
        self.head = 0;
    }
}
