//! zgix-bench: a fast glommio HTTP/1.1 origin and a keep-alive load generator for measuring zgix.
fn main() {}
