//! The HPACK decoder (RFC 7541 §3, §5, §6): one complete header block at a time, each field handed to a callback, the dynamic table kept in step even past the header-list limit.

use super::huffman;
use super::table::{Parts, Table, ENTRY_OVERHEAD, STATIC};
use super::DecodeError;

/// Decoded Huffman strings of one field up to this many bytes (their
/// bound, `huffman::max_decoded`) go to a buffer on the stack; longer
/// ones to one on the heap, freed when the block ends.
const STACK: usize = 512;

/// Decodes the client's header blocks (see `decode`). What it holds on the
/// heap between blocks is its dynamic table alone: nothing until the client
/// first adds an entry.
pub struct Decoder {
    table: Table,
    /// The limit came down: the next block must start with a size update
    /// (RFC 7541 §4.2).
    update_due: bool,
}

/// A string of a literal (RFC 7541 §5.2): where it is, raw or Huffman.
#[derive(Clone, Copy)]
struct Lit {
    start: usize,
    end: usize,
    huffman: bool,
}

/// A literal's name: from a table (§6.2, an index) or its own string.
#[derive(Clone, Copy)]
enum Name {
    Static(&'static [u8]),
    /// Dynamic table entry `k` (0: the newest).
    Dynamic(usize),
    Lit(Lit),
}

/// Where the bytes of a string ended up: in the block, or in the scratch
/// buffer (`start..end`).
#[derive(Clone, Copy)]
enum At {
    Block(usize, usize),
    Buf(usize, usize),
}

/// The header list being handed over (RFC 9113 §6.5.2).
struct List {
    /// Its size so far: name + value + 32 per field.
    size: usize,
    max: usize,
    /// Fields still go to the callback.
    deliver: bool,
    /// The callback said stop.
    stopped: bool,
    /// The size went over `max`.
    over: bool,
}

impl List {
    /// Counts a field of `n` bytes (name and value); whether to hand it over.
    fn count(&mut self, n: usize) -> bool {
        self.size = self.size.saturating_add(n + ENTRY_OVERHEAD);
        if self.size > self.max {
            self.over = true;
            self.deliver = false;
        }
        self.deliver
    }

    fn hand(&mut self, f: &mut impl FnMut(&[u8], &[u8]) -> Result<(), ()>, n: &[u8], v: &[u8]) {
        if f(n, v).is_err() {
            self.deliver = false;
            self.stopped = true;
        }
    }
}

const ERR: DecodeError = DecodeError::Compression;

/// An integer with an `prefix`-bit prefix at `b[*pos]` (RFC 7541 §5.1);
/// values past u32 and more than 5 continuation bytes are refused.
#[inline]
fn integer(b: &[u8], pos: &mut usize, prefix: u32) -> Result<usize, DecodeError> {
    let mask = (1u8 << prefix) - 1;
    let first = b.get(*pos).ok_or(ERR)? & mask;
    *pos += 1;
    if first < mask {
        return Ok(usize::from(first));
    }
    let (mut v, mut shift) = (u64::from(mask), 0);
    loop {
        let c = *b.get(*pos).ok_or(ERR)?;
        *pos += 1;
        v += u64::from(c & 0x7f) << shift;
        if c & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return Err(ERR);
        }
    }
    if v > u64::from(u32::MAX) {
        return Err(ERR);
    }
    Ok(v as usize)
}

/// A string literal at `b[*pos]` (§5.2); the block ending inside it is
/// a decoding error (§2.3.3 of RFC 7541 calls the block's end the field's).
#[inline]
fn literal(b: &[u8], pos: &mut usize) -> Result<Lit, DecodeError> {
    let huffman = b.get(*pos).ok_or(ERR)? & 0x80 != 0;
    let len = integer(b, pos, 7)?;
    let start = *pos;
    let end = start
        .checked_add(len)
        .filter(|&e| e <= b.len())
        .ok_or(ERR)?;
    *pos = end;
    Ok(Lit {
        start,
        end,
        huffman,
    })
}

/// Copies a ring's parts into the start of `buf`; their length.
fn copy(p: Parts<'_>, buf: &mut [u8]) -> usize {
    let n = p.0.len() + p.1.len();
    buf[..p.0.len()].copy_from_slice(p.0);
    buf[p.0.len()..n].copy_from_slice(p.1);
    n
}

impl Decoder {
    /// `max_table`: the SETTINGS_HEADER_TABLE_SIZE zgix advertised (4096 by
    /// default): the most a size update may set (RFC 7541 §4.2).
    pub fn new(max_table: usize) -> Decoder {
        Decoder {
            table: Table::new(max_table),
            update_due: false,
        }
    }

    /// A new SETTINGS_HEADER_TABLE_SIZE, once the client acknowledged the
    /// SETTINGS frame carrying it (RFC 9113 §6.5.3). Lowered under the
    /// table's maximum, it evicts what no longer fits and the next block
    /// must start with a size update to at most it (RFC 7541 §4.2), else
    /// `Compression`; raised, it is the most later size updates may set.
    pub fn set_max_table(&mut self, max_table: usize) {
        if self.table.set_limit(max_table) {
            self.update_due = true;
        }
    }

    /// Bytes the decoder holds on the heap now (for the idle-memory tests).
    pub fn heap_bytes(&self) -> usize {
        self.table.heap_bytes()
    }

    /// Entries in the dynamic table now.
    pub fn table_len(&self) -> usize {
        self.table.len()
    }

    /// The dynamic table's size as RFC 7541 §4.1 counts it.
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    /// Dynamic table entry `k` (0: the newest, index 62), copied out (for
    /// tests and diagnostics; not the hot path).
    pub fn table_entry(&self, k: usize) -> Option<(Vec<u8>, Vec<u8>)> {
        let ((n0, n1), (v0, v1)) = self.table.get(k)?;
        Some(([n0, n1].concat(), [v0, v1].concat()))
    }

    /// Decode one complete header block (HEADERS + CONTINUATION fragments
    /// joined, padding and priority already removed). Calls `f(name, value)`
    /// for each field in order; the slices live only for the call (from the
    /// block, the tables, or a scratch buffer for Huffman-decoded strings).
    /// If `f` returns Err(()), decoding goes on to the end of the block
    /// (table kept in step) without calling `f` again, and `decode` returns
    /// Ok(false); Ok(true) when every field was handed over.
    ///
    /// Past `max_list` (name + value + 32 per field, RFC 9113 §6.5.2) no
    /// field is handed over, nor copied or looked at beyond its length:
    /// the work is linear in the block's length plus `max_list`, whatever
    /// the block refers to (an HPACK bomb costs its own length). The
    /// result is then `Err(ListTooLarge)`, with the table in step; a
    /// decoding error anywhere in the block is `Err(Compression)` first.
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list: usize,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), ()>,
    ) -> Result<bool, DecodeError> {
        let mut scratch = Scratch {
            stack: None,
            heap: Vec::new(),
        };
        let mut list = List {
            size: 0,
            max: max_list,
            deliver: true,
            stopped: false,
            over: false,
        };
        let mut pos = 0;
        let mut fields = false;
        if self.update_due {
            if block.first().is_none_or(|&c| c & 0xe0 != 0x20) {
                return Err(ERR);
            }
            self.update_due = false;
        }
        while let Some(&c) = block.get(pos) {
            if c & 0x80 != 0 {
                // §6.1 an indexed field; 0 is refused (the static table
                // has no entry 0, the dynamic one starts at 62).
                let i = integer(block, &mut pos, 7)?;
                if i == 0 {
                    return Err(ERR);
                }
                self.indexed(i, &mut list, &mut f, &mut scratch)?;
                fields = true;
            } else if c & 0x40 != 0 {
                // §6.2.1 a literal with incremental indexing.
                self.literal(block, &mut pos, 6, true, &mut list, &mut f, &mut scratch)?;
                fields = true;
            } else if c & 0x20 != 0 {
                // §6.3 a dynamic table size update: only before the
                // block's first field (§4.2), never over the limit.
                let max = integer(block, &mut pos, 5)?;
                if fields || !self.table.set_max(max) {
                    return Err(ERR);
                }
            } else {
                // §6.2.2, §6.2.3: without indexing, never indexed.
                self.literal(block, &mut pos, 4, false, &mut list, &mut f, &mut scratch)?;
                fields = true;
            }
        }
        if list.over {
            return Err(DecodeError::ListTooLarge);
        }
        Ok(!list.stopped)
    }

    /// A name or field by index (§2.3.3): 1–61 static, then dynamic.
    fn name_at(&self, i: usize) -> Result<Name, DecodeError> {
        match i {
            0 => Err(ERR),
            1..=61 => Ok(Name::Static(STATIC[i - 1].0)),
            _ if i - 62 < self.table.len() => Ok(Name::Dynamic(i - 62)),
            _ => Err(ERR),
        }
    }

    fn indexed(
        &self,
        i: usize,
        list: &mut List,
        f: &mut impl FnMut(&[u8], &[u8]) -> Result<(), ()>,
        scratch: &mut Scratch,
    ) -> Result<(), DecodeError> {
        if let Some(&(n, v)) = i.checked_sub(1).and_then(|j| STATIC.get(j)) {
            if list.count(n.len() + v.len()) {
                list.hand(f, n, v);
            }
            return Ok(());
        }
        let (n, v) = self.table.get(i - 62).ok_or(ERR)?;
        let (nl, vl) = (n.0.len() + n.1.len(), v.0.len() + v.1.len());
        if !list.count(nl + vl) {
            return Ok(());
        }
        if n.1.is_empty() && v.1.is_empty() {
            list.hand(f, n.0, v.0);
        } else {
            // The entry wraps round the ring's end.
            let buf = scratch.get(nl + vl);
            copy(n, buf);
            copy(v, &mut buf[nl..]);
            list.hand(f, &buf[..nl], &buf[nl..nl + vl]);
        }
        Ok(())
    }

    /// A literal field (§6.2) whose first byte is at `block[*pos]`, its name
    /// index in a `prefix`-bit prefix; `insert`: with incremental indexing.
    #[allow(clippy::too_many_arguments)]
    fn literal(
        &mut self,
        block: &[u8],
        pos: &mut usize,
        prefix: u32,
        insert: bool,
        list: &mut List,
        f: &mut impl FnMut(&[u8], &[u8]) -> Result<(), ()>,
        scratch: &mut Scratch,
    ) -> Result<(), DecodeError> {
        let i = integer(block, pos, prefix)?;
        let name = if i == 0 {
            Name::Lit(literal(block, pos)?)
        } else {
            self.name_at(i)?
        };
        let value = literal(block, pos)?;
        // What the scratch buffer must hold: Huffman strings decoded, and
        // a dynamic name copied when the insert may evict it (§4.4) or
        // when it wraps round the ring.
        let mut need = 0;
        let mut copy_name = false;
        match name {
            Name::Lit(l) if l.huffman => need += huffman::max_decoded(l.end - l.start),
            Name::Dynamic(k) => {
                let (n, _) = self.table.get(k).ok_or(ERR)?;
                copy_name = insert || (list.deliver && !n.1.is_empty());
                if copy_name {
                    need += n.0.len() + n.1.len();
                }
            }
            _ => {}
        }
        if value.huffman {
            need += huffman::max_decoded(value.end - value.start);
        }
        let buf = scratch.get(need);
        let mut used = 0;
        let name_at = match name {
            Name::Lit(l) if l.huffman => {
                let n =
                    huffman::decode(&block[l.start..l.end], &mut buf[used..]).map_err(|_| ERR)?;
                used += n;
                Some(At::Buf(0, n))
            }
            Name::Lit(l) => Some(At::Block(l.start, l.end)),
            Name::Dynamic(k) if copy_name => {
                let (n, _) = self.table.get(k).ok_or(ERR)?;
                let len = copy(n, buf);
                used += len;
                Some(At::Buf(0, len))
            }
            _ => None,
        };
        let value_at = if value.huffman {
            let v = &block[value.start..value.end];
            let n = huffman::decode(v, &mut buf[used..]).map_err(|_| ERR)?;
            At::Buf(used, used + n)
        } else {
            At::Block(value.start, value.end)
        };
        let buf: &[u8] = buf;
        let bytes = |a: At| match a {
            At::Block(s, e) => &block[s..e],
            At::Buf(s, e) => &buf[s..e],
        };
        let v = bytes(value_at);
        match (name_at, name) {
            (Some(a), _) => {
                let n = bytes(a);
                if list.count(n.len() + v.len()) {
                    list.hand(f, n, v);
                }
                if insert {
                    self.table.insert(n, v);
                }
            }
            (None, Name::Static(n)) => {
                if list.count(n.len() + v.len()) {
                    list.hand(f, n, v);
                }
                if insert {
                    self.table.insert(n, v);
                }
            }
            (None, Name::Dynamic(k)) => {
                // Not inserted (else copied above), and in one part.
                let (n, _) = self.table.get(k).ok_or(ERR)?;
                if list.count(n.0.len() + n.1.len() + v.len()) {
                    list.hand(f, n.0, v);
                }
            }
            (None, Name::Lit(_)) => return Err(ERR),
        }
        Ok(())
    }
}

/// Room for decoded Huffman strings and copied entries: a buffer on the
/// stack, zeroed only in a block that needs it, or one on the heap for
/// what does not fit, dropped with the block.
struct Scratch {
    stack: Option<[u8; STACK]>,
    heap: Vec<u8>,
}

impl Scratch {
    /// At least `need` bytes.
    fn get(&mut self, need: usize) -> &mut [u8] {
        if need == 0 {
            return &mut [];
        }
        if need <= STACK {
            return &mut self.stack.get_or_insert([0; STACK])[..];
        }
        if self.heap.len() < need {
            self.heap.resize(need, 0);
        }
        &mut self.heap[..]
    }
}
