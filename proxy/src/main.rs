//! The `zgix` binary.
fn main() {}
