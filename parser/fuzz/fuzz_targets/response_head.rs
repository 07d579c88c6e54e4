//! Response heads: never panics, and growing prefixes give Partial until the first that decides, then always that result.
#![no_main]

mod prefixes;

use libfuzzer_sys::fuzz_target;
use zgix_parser::{Method, ResponseHead, ResponseParser, Status};

fuzz_target!(|data: &[u8]| {
    let Some((&m, data)) = data.split_first() else {
        return;
    };
    let method = if m & 1 == 0 {
        Method::Get
    } else {
        Method::Head
    };
    let parser = ResponseParser::new(512, 8);
    let decided = prefixes::decided(data, |prefix| {
        let mut h = ResponseHead::new(8);
        (parser.parse(prefix, method, &mut h), h)
    });
    if let Some((Ok(Status::Complete(())), h)) = decided {
        assert!((100..=599).contains(&h.status));
        assert!(h.head_len <= data.len());
    }
});
