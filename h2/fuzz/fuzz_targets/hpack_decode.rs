//! The HPACK decoder on arbitrary blocks, one decoder across them (the input cut at 0xf7 0x7f pairs): never a panic, the fields handed over within the list limit, the table within its size and its heap bound, the same outcome from a second decoder fed the same blocks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zgix_h2::hpack::{DecodeError, Decoder};

type Outcome = (Result<bool, DecodeError>, Vec<(Vec<u8>, Vec<u8>)>);

fn run(d: &mut Decoder, block: &[u8], max_list: usize) -> Outcome {
    let mut fields = Vec::new();
    let mut size = 0;
    let r = d.decode(block, max_list, |n, v| {
        size += n.len() + v.len() + 32;
        fields.push((n.to_vec(), v.to_vec()));
        Ok(())
    });
    assert!(size <= max_list, "{size} > {max_list}");
    (r, fields)
}

fuzz_target!(|data: &[u8]| {
    let Some((&[a, b], rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let limit = [0, 64, 256, 4096][usize::from(a & 3)];
    let max_list = 1 + usize::from(b) * 64;
    let (mut d, mut twin) = (Decoder::new(limit), Decoder::new(limit));
    let mut at = 0;
    while at <= rest.len() {
        let end = rest[at..]
            .windows(2)
            .position(|w| w == [0xf7, 0x7f])
            .map_or(rest.len(), |p| at + p);
        let block = &rest[at..end];
        let one = run(&mut d, block, max_list);
        assert_eq!(one, run(&mut twin, block, max_list));
        assert!(d.table_size() <= limit);
        // The ring, and 12 bytes per entry slot (the deque allocates 4 at least).
        let slots = (limit / 32).next_power_of_two().max(4);
        assert!(d.heap_bytes() <= limit + 12 * slots);
        if one.0 == Err(DecodeError::Compression) {
            // The connection would end here.
            return;
        }
        at = end + 2;
    }
});
