//! PostgreSQL side: the catalog checks ([`admin`]), the walsender connection ([`replication`]), what a
//! refused login means for both ([`login`]), TLS
//! for both ([`tls`]), and the pgoutput decoder ([`pgoutput`]).

pub mod admin;
pub mod login;
pub mod pgoutput;
pub mod replication;
pub mod tls;
