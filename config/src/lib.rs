//! zgix configuration: JSON into typed structs, with `validate()` reporting every problem with its JSON path.
