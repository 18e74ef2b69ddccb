//! PostgreSQL side: the catalog checks ([`admin`]), the walsender connection ([`replication`]), TLS
//! for both ([`tls`]), and the pgoutput decoder ([`pgoutput`]).

pub mod admin;
pub mod pgoutput;
pub mod replication;
pub mod tls;
