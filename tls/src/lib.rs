//! zgix TLS: a listener's certificates and keys read and checked ([`certs`]), picked by SNI ([`sni`]), a first look at the ClientHello ([`hello`]), a listener's rustls configuration ([`server`]), one connection on rustls' unbuffered API ([`session`]), the client side towards origins ([`client`]), and session-ticket keys every shard and every box can share ([`tickets`]). rustls (0.23, aws-lc-rs provider) stays behind these types.

pub mod certs;
pub mod client;
pub mod hello;
pub mod server;
pub mod session;
pub mod sni;
pub mod tickets;

#[cfg(test)]
mod client_tests;
#[cfg(test)]
mod testkeys;
#[cfg(test)]
mod tests;

pub use certs::{load, validity, Loaded, EXPIRY_WARNING_SECS};
pub use client::ClientSession;
pub use rustls::ClientConfig;
pub use rustls::ServerConfig;
pub use rustls_pki_types::ServerName;
pub use session::{Failure, Info, Progress, Session};
pub use sni::{CertStore, UnknownSni};
pub use tickets::Tickets;
