//! The HPACK encoder to the decoder: any field list (names, values, sensitivity and the status from the input) decodes to itself, and leaves nothing in the decoder's table.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zgix_h2::hpack::{Decoder, Encoder};

fuzz_target!(|data: &[u8]| {
    let Some((&[s0, s1, t], mut rest)) = data.split_first_chunk::<3>() else {
        return;
    };
    let mut e = Encoder::new();
    if t & 1 != 0 {
        e.set_peer_max_table(usize::from(t));
    }
    let mut block = Vec::new();
    e.begin(&mut block);
    let code = u16::from_be_bytes([s0, s1]);
    e.status(code, &mut block);
    let mut want = vec![(b":status".to_vec(), code.to_string().into_bytes())];
    // Each field: a length byte for the name, one for the value (the top
    // bit: sensitive), then their bytes.
    while let Some((&[nl, vl], r)) = rest.split_first_chunk::<2>() {
        let (nl, vlen) = (usize::from(nl), usize::from(vl & 0x7f));
        if r.len() < nl + vlen {
            break;
        }
        let (name, r) = r.split_at(nl);
        let (value, r) = r.split_at(vlen);
        e.field(name, value, vl & 0x80 != 0, &mut block);
        want.push((name.to_vec(), value.to_vec()));
        rest = r;
    }
    let mut d = Decoder::new(4096);
    let mut got = Vec::new();
    let r = d.decode(&block, usize::MAX, |n, v| {
        got.push((n.to_vec(), v.to_vec()));
        Ok(())
    });
    assert_eq!(r, Ok(true));
    assert_eq!(got, want);
    assert_eq!(d.heap_bytes(), 0);
});
