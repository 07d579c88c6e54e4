//! The upstreams: endpoint choice (the balancer), upstream connections (plain or TLS) and their keep-alive pools, endpoint health and its active prober, address resolution, and the per-endpoint counters. Uses the driver and observability; knows nothing of client connections.

pub mod budget;
pub mod cluster;
pub mod conn;
pub mod health;
pub mod lb;
pub mod metrics;
pub mod pool;
pub mod reload;
pub mod render;
pub mod resolve;
pub mod resolver;
pub mod tls;
