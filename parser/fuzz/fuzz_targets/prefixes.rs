//! The split-point oracle both head targets share: growing prefixes give Partial until the first that decides, then always that outcome and head.

use std::fmt::Debug;

use zgix_parser::{ParseError, Status};

/// Parses every prefix of `data` with `parse` and checks the oracle; returns the deciding
/// outcome and head, or `None` when no prefix decides.
pub fn decided<H: PartialEq + Debug>(
    data: &[u8],
    mut parse: impl FnMut(&[u8]) -> (Result<Status<()>, ParseError>, H),
) -> Option<(Result<Status<()>, ParseError>, H)> {
    let mut decided: Option<(Result<Status<()>, ParseError>, H)> = None;
    for end in 0..=data.len() {
        let (r, h) = parse(&data[..end]);
        match &decided {
            None if r == Ok(Status::Partial) => {}
            None => decided = Some((r, h)),
            Some((first, first_head)) => {
                assert_eq!(r, *first, "prefix {end} changed the outcome");
                if r.is_ok() {
                    assert_eq!(&h, first_head, "prefix {end} changed the head");
                }
            }
        }
    }
    decided
}
