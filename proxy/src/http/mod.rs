//! HTTP pieces that know no connection and no socket: rewriting heads on the way through, the responses zgix writes itself, the compiled request filters. Above the driver and observability; used by the runtime, the exchange and the admin endpoint.

pub mod filters;
pub mod ratelimit;
pub mod respond;
pub mod wire;
