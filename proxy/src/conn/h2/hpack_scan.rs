//! A pass over the header blocks a client sends (RFC 7541), ahead of the codec and without a dynamic table of its own: a block that cannot decode is a connection error `COMPRESSION_ERROR` (§4.3 of RFC 9113; the codec says `PROTOCOL_ERROR`), and a field name HTTP/2 forbids (uppercase or not a token, an unknown pseudo-header: RFC 9113 §8.2.1, §8.3), which the codec would take as the end of the connection, is overwritten in place with a valid name of the same decoded length and the stream marked malformed, so zgix resets it alone (§8.1.1); a pseudo-header in trailers marks its stream so too.

/// Code lengths of the HPACK Huffman code (RFC 7541 Appendix B), octets
/// 0–255 then EOS. The code is canonical (codes of one length are
/// consecutive, in symbol order), so the lengths are the whole code.
#[rustfmt::skip]
const HUFFMAN_BITS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
];

/// The canonical code's decoding tables, per code length: its first code,
/// how many codes it has, and where its symbols start in `symbols`.
struct Canon {
    first: [u32; 31],
    count: [u16; 31],
    offset: [u16; 31],
    symbols: [u16; 257],
}

const fn canon() -> Canon {
    let mut c = Canon {
        first: [0; 31],
        count: [0; 31],
        offset: [0; 31],
        symbols: [0; 257],
    };
    let mut s = 0;
    while s < 257 {
        c.count[HUFFMAN_BITS[s] as usize] += 1;
        s += 1;
    }
    let (mut code, mut at, mut len) = (0u32, 0u16, 1);
    while len < 31 {
        code = (code + c.count[len - 1] as u32) << 1;
        c.first[len] = code;
        c.offset[len] = at;
        at += c.count[len];
        len += 1;
    }
    let mut next = c.offset;
    let mut s = 0;
    while s < 257 {
        let l = HUFFMAN_BITS[s] as usize;
        c.symbols[next[l] as usize] = s as u16;
        next[l] += 1;
        s += 1;
    }
    c
}

static CANON: Canon = canon();

const EOS: u16 = 256;

/// Symbols of 5, 6, 7 and 8 bits a rewritten Huffman name is made of
/// (`a`, `b`, `j`, `&`: valid in a name), with their codes.
const FILL: [(u64, u32); 4] = [
    (0b00011, 5),
    (0b10_0011, 6),
    (0b111_0100, 7),
    (0b1111_1000, 8),
];

/// The pseudo-headers the codec knows (RFC 9113 §8.3, RFC 8441 §4), after the colon.
const PSEUDO: [&[u8]; 6] = [
    b"authority",
    b"method",
    b"scheme",
    b"path",
    b"protocol",
    b"status",
];

/// The largest dynamic table a client may ask for: zgix advertises no
/// SETTINGS_HEADER_TABLE_SIZE, so the default 4,096 holds (RFC 9113 §6.5.2).
const TABLE_BYTES: u64 = 4096;

/// Entries a 4,096-byte table can hold at most (32 bytes of overhead each, RFC 7541 §4.1).
const MAX_ENTRIES: u64 = TABLE_BYTES / 32;

/// Entries of the static table (RFC 7541 Appendix A); 1–14 are pseudo-headers.
const STATIC: u64 = 61;

/// Whether `c` may be in an HTTP/2 field name: a lowercase token
/// character (RFC 9110 §5.6.2, RFC 9113 §8.2.1).
fn name_byte(c: u8) -> bool {
    matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'!' | b'"' | b'#' | b'$' | b'%' | b'&' | b'\''
        | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
}

/// What an integer being read is (RFC 7541 §5.1).
#[derive(Copy, Clone)]
enum IntOf {
    /// An indexed field (§6.1).
    Index,
    /// A literal's name index (§6.2); 0: a new name follows.
    NameIndex,
    /// A dynamic table size update (§6.3).
    Size,
    /// A string's length (§5.2).
    Len { name: bool, huffman: bool },
}

#[derive(Copy, Clone)]
enum St {
    /// A representation's first byte.
    Start,
    /// An integer's continuation bytes.
    Int { of: IntOf, value: u64, shift: u32 },
    /// A string's first byte: its Huffman flag and the length's prefix.
    Len { name: bool },
    /// String bytes still to pass.
    Str { name: bool, left: u64 },
}

/// The literal name being read.
#[derive(Default)]
struct Name {
    huffman: bool,
    /// Huffman bits not yet a symbol.
    acc: u32,
    alen: u32,
    /// Symbols so far, and the bits their codes took.
    n: u64,
    bits: u64,
    pseudo: bool,
    /// A pseudo-header's name after the colon (the longest known is 9).
    tail: [u8; 9],
    tlen: usize,
    bad: bool,
    /// Where the string starts in the bytes of this `feed`; `None` when
    /// it started in earlier bytes, already handed on (then it stays).
    start: Option<usize>,
}

/// The scan of the client's header blocks (see the module docs).
pub(super) struct HpackScan {
    st: St,
    /// A field came in this block: a size update may not follow (§4.2).
    fields: bool,
    /// The block is a stream's trailers.
    trailers: bool,
    /// The literal being read adds an entry to the dynamic table.
    insert: bool,
    /// Entries added since the table was last emptied: an index past the
    /// static table and these is surely wrong.
    added: u64,
    name: Name,
    malformed: bool,
}

/// A block that cannot decode: a connection error `COMPRESSION_ERROR`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Undecodable;

type Scan = Result<(), Undecodable>;

impl Default for HpackScan {
    fn default() -> Self {
        HpackScan {
            st: St::Start,
            fields: false,
            trailers: false,
            insert: false,
            added: 0,
            name: Name::default(),
            malformed: false,
        }
    }
}

impl HpackScan {
    /// A header block starts (a HEADERS frame); `trailers` when its stream
    /// is open already.
    pub fn start_block(&mut self, trailers: bool) {
        self.st = St::Start;
        self.fields = false;
        self.trailers = trailers;
        self.malformed = false;
    }

    /// The block ended (END_HEADERS); whether its stream is malformed.
    pub fn end_block(&mut self) -> Result<bool, Undecodable> {
        if !matches!(self.st, St::Start) {
            // Cut inside a representation (§2.3.3 of RFC 7541's decoder).
            return Err(Undecodable);
        }
        Ok(std::mem::take(&mut self.malformed))
    }

    /// Scans the next bytes of the block; a forbidden name among them is
    /// overwritten in place.
    pub fn feed(&mut self, b: &mut [u8]) -> Scan {
        self.name.start = None;
        let mut i = 0;
        while i < b.len() {
            match self.st {
                // An indexed field with a one-byte index, the most common
                // representation of all, without the general path.
                St::Start if b[i] > 0x80 && b[i] != 0xff => {
                    self.fields = true;
                    self.index(u64::from(b[i] & 0x7f))?;
                    i += 1;
                }
                St::Start => {
                    i += 1;
                    self.begin(b[i - 1])?;
                }
                St::Int { of, value, shift } => {
                    let c = b[i];
                    i += 1;
                    // At most 4 continuation bytes, as the codec takes them.
                    if shift > 21 {
                        return Err(Undecodable);
                    }
                    let value = value + (u64::from(c & 0x7f) << shift);
                    if c & 0x80 != 0 {
                        self.st = St::Int {
                            of,
                            value,
                            shift: shift + 7,
                        };
                    } else {
                        self.int_done(of, value, b, i)?;
                    }
                }
                St::Len { name } => {
                    let c = b[i];
                    i += 1;
                    let huffman = c & 0x80 != 0;
                    match c & 0x7f {
                        0x7f => {
                            self.st = St::Int {
                                of: IntOf::Len { name, huffman },
                                value: 0x7f,
                                shift: 0,
                            }
                        }
                        v => self.string(name, huffman, u64::from(v), b, i)?,
                    }
                }
                St::Str { name, left } => {
                    let n = left.min((b.len() - i) as u64) as usize;
                    if name {
                        self.name_bytes(&b[i..i + n])?;
                    }
                    i += n;
                    self.st = St::Str {
                        name,
                        left: left - n as u64,
                    };
                    if left == n as u64 {
                        self.string_end(name, b, i)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A representation's first byte (RFC 7541 §6).
    fn begin(&mut self, c: u8) -> Scan {
        let (of, prefix) = match c {
            0x80.. => (IntOf::Index, 0x7f),
            0x40.. => (IntOf::NameIndex, 0x3f),
            0x20.. => (IntOf::Size, 0x1f),
            _ => (IntOf::NameIndex, 0x0f),
        };
        match of {
            IntOf::Size if self.fields => return Err(Undecodable),
            IntOf::Size => {}
            _ => self.fields = true,
        }
        self.insert = c & 0xc0 == 0x40;
        let v = u64::from(c & prefix);
        if v < u64::from(prefix) {
            return self.int_done(of, v, &mut [], 0);
        }
        self.st = St::Int {
            of,
            value: v,
            shift: 0,
        };
        Ok(())
    }

    /// An integer was read whole; `b[i..]` follows it.
    fn int_done(&mut self, of: IntOf, v: u64, b: &mut [u8], i: usize) -> Scan {
        match of {
            IntOf::Index if v == 0 => return Err(Undecodable),
            IntOf::Index => {
                self.index(v)?;
                self.st = St::Start;
            }
            IntOf::NameIndex if v == 0 => self.st = St::Len { name: true },
            IntOf::NameIndex => {
                self.index(v)?;
                self.st = St::Len { name: false };
            }
            IntOf::Size if v > TABLE_BYTES => return Err(Undecodable),
            IntOf::Size => {
                if v == 0 {
                    self.added = 0;
                }
                self.st = St::Start;
            }
            IntOf::Len { name, huffman } => self.string(name, huffman, v, b, i)?,
        }
        Ok(())
    }

    /// A field or name by index: past the tables is undecodable; a
    /// pseudo-header's in trailers marks the stream.
    fn index(&mut self, v: u64) -> Scan {
        if v > STATIC + self.added.min(MAX_ENTRIES) {
            return Err(Undecodable);
        }
        if self.trailers && v <= 14 {
            self.malformed = true;
        }
        Ok(())
    }

    /// A string of `len` bytes starts at `b[i]`.
    fn string(&mut self, name: bool, huffman: bool, len: u64, b: &mut [u8], i: usize) -> Scan {
        if name {
            self.name = Name {
                huffman,
                start: Some(i),
                ..Name::default()
            };
        }
        self.st = St::Str { name, left: len };
        if len == 0 {
            self.string_end(name, b, i)?;
        }
        Ok(())
    }

    /// A string ended at `b[..end]`: after a name its value comes, after a
    /// value the next representation.
    fn string_end(&mut self, name: bool, b: &mut [u8], end: usize) -> Scan {
        if name {
            self.name_end(b, end)?;
            self.st = St::Len { name: false };
        } else {
            if self.insert {
                self.added += 1;
            }
            self.st = St::Start;
        }
        Ok(())
    }

    fn name_bytes(&mut self, b: &[u8]) -> Scan {
        if !self.name.huffman {
            for &c in b {
                self.symbol(c);
            }
            return Ok(());
        }
        for &byte in b {
            for k in (0..8).rev() {
                let nm = &mut self.name;
                nm.acc = (nm.acc << 1) | u32::from(byte >> k & 1);
                nm.alen += 1;
                let l = nm.alen as usize;
                if l > 30 {
                    return Err(Undecodable);
                }
                let at = nm.acc.wrapping_sub(CANON.first[l]);
                if at >= u32::from(CANON.count[l]) {
                    continue;
                }
                let s = CANON.symbols[(CANON.offset[l] as u32 + at) as usize];
                if s == EOS {
                    // RFC 7541 §5.2: EOS in a string is a decoding error.
                    return Err(Undecodable);
                }
                nm.bits += u64::from(nm.alen);
                (nm.acc, nm.alen) = (0, 0);
                self.symbol(s as u8);
            }
        }
        Ok(())
    }

    fn symbol(&mut self, c: u8) {
        let nm = &mut self.name;
        if nm.n == 0 && c == b':' {
            nm.pseudo = true;
        } else if nm.pseudo {
            if nm.tlen < nm.tail.len() {
                nm.tail[nm.tlen] = c;
                nm.tlen += 1;
            } else {
                nm.bad = true;
            }
        } else if !name_byte(c) {
            nm.bad = true;
        }
        nm.n += 1;
    }

    /// The name in `b[start..end]` is whole: a forbidden one is rewritten
    /// and its stream marked; a pseudo-header in trailers marks it.
    fn name_end(&mut self, b: &mut [u8], end: usize) -> Scan {
        let nm = &self.name;
        // Padding: under 8 bits, all ones (RFC 7541 §5.2).
        if nm.huffman && (nm.alen > 7 || nm.acc != (1 << nm.alen) - 1) {
            return Err(Undecodable);
        }
        if nm.n == 0 {
            // An empty name: the codec's to refuse.
            return Ok(());
        }
        let known = nm.pseudo && PSEUDO.contains(&&nm.tail[..nm.tlen]);
        if nm.bad || (nm.pseudo && !known) {
            if let Some(s) = nm.start {
                if rewrite(nm, &mut b[s..end]) {
                    self.malformed = true;
                }
            }
        } else if nm.pseudo && self.trailers {
            self.malformed = true;
        }
        Ok(())
    }
}

/// Overwrites a forbidden name with one as long decoded and encoded, so
/// that the codec's dynamic table keeps the client's sizes (RFC 7541 §4.1);
/// `false` when no such name is made of 5–8-bit symbols (the codec then
/// ends the connection, as it would).
fn rewrite(nm: &Name, s: &mut [u8]) -> bool {
    if !nm.huffman {
        s.fill(b'a');
        return true;
    }
    if nm.bits > 8 * nm.n {
        return false;
    }
    let mut extra = nm.bits - 5 * nm.n;
    let (mut acc, mut nbits, mut at) = (0u64, 0u32, 0usize);
    for _ in 0..nm.n {
        let e = extra.min(3);
        extra -= e;
        let (code, len) = FILL[e as usize];
        acc = (acc << len) | code;
        nbits += len;
        while nbits >= 8 {
            nbits -= 8;
            s[at] = (acc >> nbits) as u8;
            at += 1;
        }
    }
    if nbits > 0 {
        s[at] = ((acc << (8 - nbits)) as u8) | ((1u16 << (8 - nbits)) - 1) as u8;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The code of symbol `s`, from the canonical table.
    fn code(s: u16) -> (u64, u32) {
        let l = HUFFMAN_BITS[s as usize] as usize;
        let at = (0..257).filter(|&t| HUFFMAN_BITS[t] as usize == l && t < s as usize);
        (u64::from(CANON.first[l]) + at.count() as u64, l as u32)
    }

    fn huff(s: &[u8]) -> Vec<u8> {
        let (mut acc, mut n, mut out) = (0u64, 0u32, Vec::new());
        for &c in s {
            let (v, l) = code(u16::from(c));
            acc = (acc << l) | v;
            n += l;
            while n >= 8 {
                n -= 8;
                out.push((acc >> n) as u8);
            }
        }
        if n > 0 {
            out.push(((acc << (8 - n)) as u8) | ((1u16 << (8 - n)) - 1) as u8);
        }
        out
    }

    fn unhuff(b: &[u8]) -> Vec<u8> {
        let (mut out, mut acc, mut l) = (Vec::new(), 0u32, 0usize);
        for k in 0..b.len() * 8 {
            acc = (acc << 1) | u32::from(b[k / 8] >> (7 - k % 8) & 1);
            l += 1;
            let at = acc.wrapping_sub(CANON.first[l]);
            if at < u32::from(CANON.count[l]) {
                out.push(CANON.symbols[CANON.offset[l] as usize + at as usize] as u8);
                (acc, l) = (0, 0);
            }
        }
        out
    }

    /// A literal with a new name (`first`: 0x40 incremental, 0 without).
    fn literal(first: u8, name: &[u8], huffman: bool, value: &[u8]) -> Vec<u8> {
        let name = if huffman { huff(name) } else { name.to_vec() };
        let mut b = vec![first, (u8::from(huffman) << 7) | name.len() as u8];
        b.extend_from_slice(&name);
        b.push(value.len() as u8);
        b.extend_from_slice(value);
        b
    }

    fn scan(block: &mut [u8], trailers: bool) -> Result<bool, Undecodable> {
        let mut s = HpackScan::default();
        s.start_block(trailers);
        s.feed(block)?;
        s.end_block()
    }

    #[test]
    fn the_lengths_make_the_rfc_7541_code() {
        assert_eq!(code(u16::from(b'a')), (0b00011, 5));
        assert_eq!(code(u16::from(b'A')), (0b10_0001, 6));
        assert_eq!(code(u16::from(b'&')), (0b1111_1000, 8));
        assert_eq!(code(EOS), (0x3fff_ffff, 30));
        for (e, c) in [b'a', b'b', b'j', b'&'].into_iter().enumerate() {
            assert_eq!(FILL[e], code(u16::from(c)), "{}", c as char);
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unhuff(&huff(&all)), all);
    }

    #[test]
    fn a_forbidden_name_is_rewritten_to_the_same_lengths_and_marks_its_stream() {
        for name in [
            &b"X-Up"[..],
            b"x-Upper-Case",
            b"a b",
            b":foo",
            b":PATH",
            b"\xc3\xa9t\xc3\xa9",
        ] {
            for huffman in [false, true] {
                let mut b = literal(0x40, name, huffman, b"1");
                let before = b.clone();
                let fits = !huffman || name.iter().all(|&c| HUFFMAN_BITS[c as usize] <= 8);
                assert_eq!(scan(&mut b, false), Ok(fits), "{name:?} {huffman}");
                if !fits {
                    continue;
                }
                assert_eq!(b.len(), before.len());
                let n = usize::from(b[1] & 0x7f);
                let new = if huffman {
                    unhuff(&b[2..2 + n])
                } else {
                    b[2..2 + n].to_vec()
                };
                assert_eq!(new.len(), name.len(), "{name:?} {huffman}: {new:?}");
                assert!(new.iter().all(|&c| name_byte(c)), "{new:?}");
                // What it became passes.
                assert_eq!(scan(&mut b.clone(), false), Ok(false));
            }
        }
        for name in [
            &b"x-ok"[..],
            b":path",
            b":authority",
            b"!#$%&'*+-.^_`|~09az",
        ] {
            for huffman in [false, true] {
                let mut b = literal(0, name, huffman, b"v");
                let before = b.clone();
                assert_eq!(scan(&mut b, false), Ok(false), "{name:?}");
                assert_eq!(b, before);
            }
        }
    }

    #[test]
    fn blocks_split_anywhere_scan_alike() {
        let mut block = [0x82, 0x86, 0x84].to_vec();
        block.extend(literal(0x40, b"x-long", true, &[b'v'; 100]));
        block.extend(literal(0x10, b"x-Up", false, b"1"));
        block.push(0x80 | 62);
        let p = block.windows(4).position(|w| w == b"x-Up").unwrap();
        for step in [1, 2, 3, 5, 7, block.len()] {
            let mut b = block.clone();
            let mut s = HpackScan::default();
            s.start_block(false);
            for c in b.chunks_mut(step) {
                s.feed(c).unwrap();
            }
            // A name split across feeds is left as it is, to the codec.
            let rewritten = p / step == (p + 3) / step;
            assert_eq!(s.end_block(), Ok(rewritten), "step {step}");
        }
    }

    #[test]
    fn what_cannot_decode_is_found() {
        let bad: [&[u8]; 6] = [
            &[0xff, 0xff, 0xff, 0xff, 0xff],
            &[0x80],
            &[0x82, 0x20],
            &[0x3f, 0xe2, 0x1f],
            &[0x80 | 62],
            &[0x82, 0x40, 0x81, 0xff],
        ];
        for b in bad {
            assert_eq!(scan(&mut b.to_vec(), false), Err(Undecodable), "{b:x?}");
        }
        let mut s = HpackScan::default();
        s.start_block(false);
        s.feed(&mut literal(0x40, b"x-a", false, b"1")).unwrap();
        assert_eq!(s.end_block(), Ok(false));
        // Index 62 is the entry just added; 63 is past it.
        s.start_block(false);
        assert_eq!(s.feed(&mut [0x80 | 62]), Ok(()));
        assert_eq!(s.feed(&mut [0x80 | 63]), Err(Undecodable));
        // A size update first, and to 0, are fine; the table is then empty.
        s.start_block(false);
        assert_eq!(s.feed(&mut [0x20, 0x3f, 0xe1, 0x1f, 0x82]), Ok(()));
        assert_eq!(s.feed(&mut [0x80 | 62]), Err(Undecodable));
    }

    #[test]
    fn a_pseudo_header_in_trailers_marks_its_stream() {
        assert_eq!(scan(&mut literal(0, b":path", false, b"/"), true), Ok(true));
        assert_eq!(scan(&mut [0x84], true), Ok(true));
        assert_eq!(scan(&mut [0x04, 0x01, b'/'], true), Ok(true));
        assert_eq!(scan(&mut literal(0, b"x-t", true, b"1"), true), Ok(false));
        assert_eq!(scan(&mut [0x80 | 15], true), Ok(false));
        assert_eq!(scan(&mut [0x84], false), Ok(false));
    }
}
