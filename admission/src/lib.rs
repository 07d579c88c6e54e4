//! Admission controls shared by every shard: client identity, the lock-free rate and connection tables, and the WAF-lite matcher.
