//! A stand-in for helper A's HPACK (RFC 7541) until branch `h2-hpack` is merged: the interface of h2-common.md, with a plain decoder (no Huffman) and a literal-only encoder, enough for the server's tests.

/// RFC 7541 Appendix A, names and values, index 1..=61.
const STATIC: [(&[u8], &[u8]); 61] = [
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

pub struct Decoder {
    max: usize,
    size: usize,
    table: Vec<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    Compression,
    ListTooLarge,
}

fn int(b: &[u8], at: &mut usize, prefix: u8) -> Result<usize, DecodeError> {
    let mask = (1u16 << prefix) as usize - 1;
    let first = *b.get(*at).ok_or(DecodeError::Compression)? as usize & mask;
    *at += 1;
    if first < mask {
        return Ok(first);
    }
    let mut v = mask;
    let mut shift = 0;
    loop {
        let c = *b.get(*at).ok_or(DecodeError::Compression)? as usize;
        *at += 1;
        if shift > 21 {
            return Err(DecodeError::Compression);
        }
        v += (c & 0x7f) << shift;
        shift += 7;
        if c & 0x80 == 0 {
            return Ok(v);
        }
    }
}

fn string<'b>(b: &'b [u8], at: &mut usize) -> Result<&'b [u8], DecodeError> {
    if b.get(*at).is_some_and(|c| c & 0x80 != 0) {
        return Err(DecodeError::Compression);
    }
    let n = int(b, at, 7)?;
    let s = b.get(*at..*at + n).ok_or(DecodeError::Compression)?;
    *at += n;
    Ok(s)
}

impl Decoder {
    pub fn new(max_table: usize) -> Decoder {
        Decoder {
            max: max_table,
            size: 0,
            table: Vec::new(),
        }
    }

    fn get(&self, i: usize) -> Result<(Vec<u8>, Vec<u8>), DecodeError> {
        match i {
            0 => Err(DecodeError::Compression),
            1..=61 => Ok((STATIC[i - 1].0.to_vec(), STATIC[i - 1].1.to_vec())),
            _ => self
                .table
                .get(i - 62)
                .cloned()
                .ok_or(DecodeError::Compression),
        }
    }

    fn evict(&mut self, limit: usize) {
        while self.size > limit {
            let Some((n, v)) = self.table.pop() else { break };
            self.size -= n.len() + v.len() + 32;
        }
    }

    pub fn decode(
        &mut self,
        block: &[u8],
        max_list: usize,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), ()>,
    ) -> Result<bool, DecodeError> {
        let mut at = 0;
        let mut list = 0;
        let mut calling = true;
        let mut over = false;
        while at < block.len() {
            let c = block[at];
            let (n, v) = if c & 0x80 != 0 {
                let i = int(block, &mut at, 7)?;
                self.get(i)?
            } else if c & 0xe0 == 0x20 {
                let s = int(block, &mut at, 5)?;
                if s > self.max {
                    return Err(DecodeError::Compression);
                }
                self.evict(s);
                continue;
            } else {
                let (prefix, index) = if c & 0x40 != 0 { (6, true) } else { (4, false) };
                let i = int(block, &mut at, prefix)?;
                let name = if i == 0 {
                    string(block, &mut at)?.to_vec()
                } else {
                    self.get(i)?.0
                };
                let value = string(block, &mut at)?.to_vec();
                if index {
                    let sz = name.len() + value.len() + 32;
                    self.evict(self.max.saturating_sub(sz));
                    if sz <= self.max {
                        self.table.insert(0, (name.clone(), value.clone()));
                        self.size += sz;
                    }
                }
                (name, value)
            };
            list += n.len() + v.len() + 32;
            if list > max_list {
                over = true;
                calling = false;
            }
            if calling && f(&n, &v).is_err() {
                calling = false;
            }
        }
        if over {
            return Err(DecodeError::ListTooLarge);
        }
        Ok(calling)
    }

    pub fn heap_bytes(&self) -> usize {
        self.table
            .iter()
            .map(|(n, v)| n.capacity() + v.capacity() + 48)
            .sum()
    }
}

#[derive(Default)]
pub struct Encoder {}

fn put_int(dst: &mut Vec<u8>, first: u8, prefix: u8, mut v: usize) {
    let mask = (1usize << prefix) - 1;
    if v < mask {
        dst.push(first | v as u8);
        return;
    }
    dst.push(first | mask as u8);
    v -= mask;
    while v >= 128 {
        dst.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    dst.push(v as u8);
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder {}
    }
    pub fn set_peer_max_table(&mut self, _n: usize) {}
    pub fn begin(&mut self, _dst: &mut Vec<u8>) {}
    pub fn status(&mut self, code: u16, dst: &mut Vec<u8>) {
        put_int(dst, 0, 4, 8);
        let s = [
            b'0' + (code / 100 % 10) as u8,
            b'0' + (code / 10 % 10) as u8,
            b'0' + (code % 10) as u8,
        ];
        put_int(dst, 0, 7, 3);
        dst.extend_from_slice(&s);
    }
    pub fn field(&mut self, name: &[u8], value: &[u8], sensitive: bool, dst: &mut Vec<u8>) {
        dst.push(if sensitive { 0x10 } else { 0 });
        put_int(dst, 0, 7, name.len());
        dst.extend_from_slice(name);
        put_int(dst, 0, 7, value.len());
        dst.extend_from_slice(value);
    }
}
