//! PROXY v1/v2 headers: never panics, Partial only on a prefix that may still become valid, and every prefix of a decided input gives Partial or that same answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zgix_parser::proxy_protocol::{parse_proxy_header, ProxyStatus};

fuzz_target!(|data: &[u8]| {
    let whole = parse_proxy_header(data);
    if let Ok(ProxyStatus::Complete(h)) = whole {
        assert!(h.consumed <= data.len() && h.consumed > 0);
        assert!(h.version == 1 || h.version == 2);
        assert_eq!(h.source.is_none(), h.destination.is_none());
    }
    let mut decided = None;
    for end in 0..=data.len() {
        let r = parse_proxy_header(&data[..end]);
        match decided {
            None if r == Ok(ProxyStatus::Partial) => {}
            None => decided = Some(r),
            Some(first) => assert_eq!(r, first, "prefix {end} changed the outcome"),
        }
    }
    assert_eq!(decided.unwrap_or(Ok(ProxyStatus::Partial)), whole);
});
