//! zgix: a thread-per-core io_uring HTTP/1.1 edge proxy.
//!
//! # The shard model
//!
//! zgix runs one glommio executor per configured CPU, pinned to it: a *shard*.
//! Each shard binds every listener itself with `SO_REUSEPORT`, so the kernel
//! spreads new connections over the shards and no connection ever moves between
//! cores. A shard owns, with no locks and no sharing:
//!
//! - its listening sockets and every connection accepted on them;
//! - each connection's parser state and buffers, made once per connection and
//!   reused for every request on it (the request path allocates nothing);
//! - its upstream keep-alive pool, bounded per endpoint;
//! - its counters, which only it writes (the admin endpoint sums them on read).
//!
//! The only mutable state shared between shards is the admission tables
//! ([`zgix_admission::RateTable`], [`zgix_admission::ConnTable`]): fixed-size
//! arrays of atomic slots, sized once at load, so a client's rate bucket and
//! connection count are global while the hot path never allocates and never
//! locks. Everything else shared ([`runtime::Runtime`]) is read-only after load.
//! With `"scope": "fleet"` one more thread, off the shards ([`fleet`]), drains
//! and debits the rate table through the same atomics; a shard never waits on it
//! or on Redis.
//!
//! # Locked memory
//!
//! io_uring rings and glommio's registered buffers live in locked memory. Each
//! shard asks for [`process::shard::IO_MEMORY`] bytes; with the common 8 MiB
//! `RLIMIT_MEMLOCK` that fits a handful of shards. Raise `ulimit -l` (systemd:
//! `LimitMEMLOCK=`) for more.
//!
//! # The floors
//!
//! The modules stand in floors, and a module imports only from floors below
//! its own (no import circle):
//!
//! | floor | module | what |
//! | --- | --- | --- |
//! | 7 | [`process`] | the process and its shards: command line, start-up, signals, reload generations, the shard's executor and accept loops, the admin endpoint (with [`instance`], the control channel between two processes) |
//! | 6 | [`fleet`] | the fleet sync thread: rate-limit spending summed over a fleet through Redis, debited into the rate table |
//! | 6 | [`conn`] | the exchange: one client connection, its requests, the forwarding to an upstream and back, tunnels; the shard state a connection runs on |
//! | 5 | [`runtime`] | the loaded configuration every shard reads: listeners, clusters, endpoints, timeouts, tables |
//! | 4 | [`upstream`] | the upstreams: endpoint choice, keep-alive pools, health, address resolution, per-endpoint counters |
//! | 3 | [`http`] | HTTP pieces that know no connection: head rewriting, the responses zgix writes itself, request filters |
//! | 2 | [`io`] | the socket driver (io_uring or epoll): sockets, listeners, buffers, timers; knows no HTTP |
//! | 1 | [`observe`] | what everything reports to: counters and metrics, the access and error logs, the clock, decisions |

#![deny(unsafe_op_in_unsafe_fn)]

// The floors, bottom up: observe, io, http, upstream, runtime, conn and fleet,
// process (with instance); each imports only from the floors below it.
pub mod conn;
pub mod fleet;
pub mod http;
pub mod instance;
pub mod io;
pub mod observe;
pub mod process;
pub mod runtime;
pub mod upstream;

// io/tests.rs names `crate::shard::IO_MEMORY` (the shard now lives in `process/`).
#[cfg(test)]
use process::shard;
