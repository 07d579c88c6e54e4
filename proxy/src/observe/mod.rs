//! Observability, the bottom floor every other module may use: counters and their Prometheus rendering, the access log, the error log, the clock, integers as text, the decision behind each status, heap counting. It imports nothing above it.

pub mod access_log;
pub mod alloc;
pub mod clock;
pub mod counter;
pub mod decimal;
pub mod decision;
pub mod engine_metrics;
pub mod log;
pub mod metrics;
pub mod request_id;
