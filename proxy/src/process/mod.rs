//! The process and its shards, the top floor: the command line, start-up and shutdown, signals, the systemd and lifecycle state, reload generations, each shard's executor with its accept loops, and the admin endpoint. Uses every floor below; nothing below uses it.

pub mod admin;
pub mod cli;
pub mod generation;
pub mod lifecycle;
pub mod server;
pub mod shard;
pub mod signals;
