//! The HPACK Huffman code (RFC 7541 §5.2, Appendix B): encoding from the code table, and decoding by an 11-bit lookup table built at compile time (one lookup per symbol of up to 11 bits, a canonical-code search for the rare longer ones).

/// Code lengths of the HPACK Huffman code (RFC 7541 Appendix B), octets
/// 0–255 then EOS. The code is canonical (codes of one length are
/// consecutive, in symbol order), so the lengths are the whole code
/// (the same table as proxy/src/conn/h2/hpack_scan.rs).
#[rustfmt::skip]
pub(crate) const BITS: [u8; 257] = [
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
/// The end-of-string symbol (RFC 7541 §5.2): never valid inside a string.
pub(crate) const EOS: u16 = 256;

/// The codes themselves, right-aligned, in symbol order.
pub(crate) static CODES: [u32; 257] = codes();

const fn codes() -> [u32; 257] {
    let mut count = [0u32; 31];
    let mut s = 0;
    while s < 257 {
        count[BITS[s] as usize] += 1;
        s += 1;
    }
    // The canonical construction (as RFC 1951 §3.2.2 gives it).
    let mut next = [0u32; 31];
    let (mut code, mut len) = (0u32, 1);
    while len < 31 {
        code = (code + count[len - 1]) << 1;
        next[len] = code;
        len += 1;
    }
    let mut out = [0u32; 257];
    s = 0;
    while s < 257 {
        let l = BITS[s] as usize;
        out[s] = next[l];
        next[l] += 1;
        s += 1;
    }
    out
}

/// The canonical code's decoding tables, per code length: its first code,
/// how many codes it has, and where its symbols start in `symbols`.
struct Canon {
    first: [u32; 31],
    count: [u32; 31],
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
        c.count[BITS[s] as usize] += 1;
        s += 1;
    }
    let (mut code, mut at, mut len) = (0u32, 0u16, 1);
    while len < 31 {
        code = (code + c.count[len - 1]) << 1;
        c.first[len] = code;
        c.offset[len] = at;
        at += c.count[len] as u16;
        len += 1;
    }
    let mut next = c.offset;
    s = 0;
    while s < 257 {
        let l = BITS[s] as usize;
        c.symbols[next[l] as usize] = s as u16;
        next[l] += 1;
        s += 1;
    }
    c
}

static CANON: Canon = canon();

/// Bits the lookup table takes at once.
const PEEK: u32 = 11;

/// For each 11-bit pattern, what it starts with: the first symbol (bits
/// 0–7) and its code's length (bits 16–19); when a second whole code
/// follows within the 11 bits, that symbol (bits 8–15); the bits both take
/// (20–24) and how many symbols (1 or 2, bits 25–26). 0 when the first code
/// is longer than 11 bits (no code is 0 bits long, so 0 is free).
static FAST: [u32; 1 << PEEK] = fast();

const fn fast() -> [u32; 1 << PEEK] {
    // One symbol per pattern first: `sym | len << 8`.
    let mut one = [0u16; 1 << PEEK];
    let mut s = 0;
    while s < 256 {
        let l = BITS[s] as u32;
        if l <= PEEK {
            let start = (CODES[s] << (PEEK - l)) as usize;
            let mut j = 0;
            while j < 1 << (PEEK - l) {
                one[start + j] = s as u16 | (l as u16) << 8;
                j += 1;
            }
        }
        s += 1;
    }
    let mut t = [0u32; 1 << PEEK];
    let mut p = 0;
    while p < 1 << PEEK {
        let e = one[p];
        if e != 0 {
            let (s1, l1) = ((e & 0xff) as u32, (e >> 8) as u32);
            let mut v = s1 | l1 << 16 | l1 << 20 | 1 << 25;
            // What follows the first code, its unknown low bits zero: a
            // second code counts only if it ends within the known bits.
            let e2 = one[(p << l1) & ((1 << PEEK) - 1)];
            let l2 = (e2 >> 8) as u32;
            if e2 != 0 && l1 + l2 <= PEEK {
                v = s1 | ((e2 & 0xff) as u32) << 8 | l1 << 16 | (l1 + l2) << 20 | 2 << 25;
            }
            t[p] = v;
        }
        p += 1;
    }
    t
}

/// A code longer than 11 bits at the top of `top30` (the next 30 bits):
/// its symbol and length.
#[cold]
fn long_code(top30: u32) -> Option<(u16, u32)> {
    let mut l = PEEK as usize + 1;
    while l <= 30 {
        let at = (top30 >> (30 - l)).wrapping_sub(CANON.first[l]);
        if at < CANON.count[l] {
            return Some((
                CANON.symbols[CANON.offset[l] as usize + at as usize],
                l as u32,
            ));
        }
        l += 1;
    }
    None
}

/// An upper bound of the decoded length of `n` Huffman-coded bytes (no
/// code is shorter than 5 bits), plus the byte `decode` may write past
/// the last symbol.
pub(crate) fn max_decoded(n: usize) -> usize {
    n / 5 * 8 + (n % 5) * 8 / 5 + 2
}

/// Decodes `src` into `out` (at least `max_decoded(src.len())` long);
/// returns the decoded length. `Err` for EOS in the string, or a padding
/// longer than 7 bits or not all ones (RFC 7541 §5.2).
pub(crate) fn decode(src: &[u8], out: &mut [u8]) -> Result<usize, ()> {
    // The bits not yet decoded, left-aligned in `acc`; below them, bits of
    // the bytes from `src[i]` on, or zeros.
    let (mut acc, mut nbits, mut i, mut n) = (0u64, 0u32, 0usize, 0usize);
    loop {
        if let Some(w) = src.get(i..).and_then(|r| r.first_chunk::<8>()) {
            acc |= u64::from_be_bytes(*w) >> nbits;
            let k = (63 - nbits) / 8;
            i += k as usize;
            nbits += 8 * k;
        } else {
            while nbits <= 55 {
                let Some(&b) = src.get(i) else { break };
                acc |= u64::from(b) << (56 - nbits);
                i += 1;
                nbits += 8;
            }
            if i == src.len() {
                break;
            }
        }
        // Whole codes, up to two at a time, while 30 bits (the longest
        // code) are there.
        while nbits >= 30 {
            let e = FAST[(acc >> (64 - PEEK)) as usize];
            let len = if e != 0 {
                let o = out.get_mut(n..n + 2).ok_or(())?;
                o[0] = e as u8;
                o[1] = (e >> 8) as u8;
                n += (e >> 25) as usize;
                (e >> 20) & 0x1f
            } else {
                let (sym, len) = long_code((acc >> 34) as u32).ok_or(())?;
                if sym == EOS {
                    return Err(());
                }
                *out.get_mut(n).ok_or(())? = sym as u8;
                n += 1;
                len
            };
            acc <<= len;
            nbits -= len;
        }
    }
    // All the input is in `acc` now (`nbits` <= 63): codes checked
    // against what is left.
    while nbits > 0 {
        // Past the last bit, ones: a valid padding reads as EOS's start.
        let padded = acc | (u64::MAX >> nbits);
        let e = FAST[(padded >> (64 - PEEK)) as usize];
        let len = if e != 0 && (e >> 20) & 0x1f <= nbits {
            let o = out.get_mut(n..n + 2).ok_or(())?;
            o[0] = e as u8;
            o[1] = (e >> 8) as u8;
            n += (e >> 25) as usize;
            (e >> 20) & 0x1f
        } else if e != 0 && (e >> 16) & 0xf <= nbits {
            *out.get_mut(n).ok_or(())? = e as u8;
            n += 1;
            (e >> 16) & 0xf
        } else if e == 0 && nbits > PEEK {
            let (sym, len) = long_code((padded >> 34) as u32).ok_or(())?;
            if len > nbits {
                break;
            }
            if sym == EOS {
                return Err(());
            }
            *out.get_mut(n).ok_or(())? = sym as u8;
            n += 1;
            len
        } else {
            break;
        };
        acc <<= len;
        nbits -= len;
    }
    // No symbol in what is left: the padding, under 8 bits and all ones
    // (the start of EOS, §5.2).
    if nbits > 7 || (nbits > 0 && acc >> (64 - nbits) != (1 << nbits) - 1) {
        return Err(());
    }
    Ok(n)
}

/// The length of `s` Huffman-coded, in bytes.
pub(crate) fn encoded_len(s: &[u8]) -> usize {
    let bits: usize = s.iter().map(|&c| usize::from(BITS[usize::from(c)])).sum();
    bits.div_ceil(8)
}

/// Appends `s` Huffman-coded to `dst`, padded with ones (RFC 7541 §5.2).
pub(crate) fn encode(s: &[u8], dst: &mut Vec<u8>) {
    // `n` bits wait in the low end of `acc` (fewer than 32 between symbols).
    let (mut acc, mut n) = (0u64, 0u32);
    for &c in s {
        let l = u32::from(BITS[usize::from(c)]);
        acc = (acc << l) | u64::from(CODES[usize::from(c)]);
        n += l;
        if n >= 32 {
            n -= 32;
            dst.extend_from_slice(&((acc >> n) as u32).to_be_bytes());
        }
    }
    while n >= 8 {
        n -= 8;
        dst.push((acc >> n) as u8);
    }
    if n > 0 {
        dst.push(((acc << (8 - n)) as u8) | ((1u16 << (8 - n)) - 1) as u8);
    }
}
