//! Config loading and validation never panic; every error has a rule and either a JSON path or none (a document-level error); a config that loads round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zgix_config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_json(text) {
        Ok(c) => {
            let again = serde_json::to_string(&c).expect("a loaded config serializes");
            assert_eq!(Config::from_json(&again).as_ref(), Ok(&c), "round trip");
        }
        Err(errors) => {
            assert!(!errors.is_empty());
            for e in &errors {
                assert!(!e.rule.is_empty(), "an error without a rule: {e:?}");
                // A path names a place (an unknown key's path is the key itself, whatever
                // it holds); never a "?" segment for a key serde could not read, which no
                // operator can look up.
                assert!(e.path != "?" && !e.path.ends_with(".?"), "unlocated {e:?}");
            }
        }
    }
});
