//! Admission controls shared by every shard: client identity, the lock-free rate and connection tables, and the WAF-lite matcher.
//!
//! The rate and connection tables are the only state zgix shares between shards. Each
//! is a fixed array of atomic slots sized once at load: the request path does a hash,
//! at most eight slot probes and a few CASes — no lock, no allocation, no scan of the
//! table — so a client's bucket and connection count are global across cores. When a
//! table has no room within the probe window it fails open (`TableFull`), which the
//! proxy counts; it never refuses a client for lack of memory.

#![deny(missing_debug_implementations)]

mod clock;
mod conn_table;
mod identity;
#[cfg(all(test, loom))]
mod loom_models;
mod rate_table;
mod slot_table;
mod sync;
mod token_bucket;
mod waf;

pub use clock::{monotonic_now_ns, monotonic_ns_at};
pub use conn_table::{ConnDecision, ConnDecisionKind, ConnGuard, ConnTable};
pub use identity::ClientId;
pub use rate_table::{Overflow, RateCheck, RateTable, Spent, PROBE_DEPTH_FULL};
pub use token_bucket::{RateDecision, RateParams, TokenBucket, MAX_BURST, MICROTOKENS_PER_TOKEN};
pub use waf::{MemchrMatcher, WafMatcher};
