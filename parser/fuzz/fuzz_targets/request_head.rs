//! Request heads: the outcome on the whole input equals the outcome when the bytes arrive in growing prefixes (Partial until the first prefix that decides, then always that result).
#![no_main]

mod prefixes;

use libfuzzer_sys::fuzz_target;
use zgix_parser::{Limits, RequestHead, RequestParser, Status};

fuzz_target!(|data: &[u8]| {
    // Small limits so the 414/431 windows are inside the inputs the fuzzer makes.
    let limits = Limits {
        max_request_line: 64,
        max_header_bytes: 256,
        max_headers: 8,
        max_body: 1000,
    };
    let parser = RequestParser::new(limits);
    let mut head = RequestHead::new(&limits);
    let whole = parser.parse(data, &mut head);
    let whole_head = head.clone();
    let decided = prefixes::decided(data, |prefix| {
        let mut h = RequestHead::new(&limits);
        (parser.parse(prefix, &mut h), h)
    });
    match decided {
        None => assert_eq!(whole, Ok(Status::Partial)),
        Some((r, h)) => {
            assert_eq!(whole, r);
            if r == Ok(Status::Complete(())) {
                assert_eq!(whole_head, h);
                assert!(whole_head.head_len <= data.len());
                assert!(
                    whole_head.canonical_path.starts_with(b"/")
                        || whole_head.canonical_path == b"*"
                );
            }
        }
    }
});
