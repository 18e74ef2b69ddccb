//! PostgreSQL side: the catalog checks ([`admin`]), the walsender connection ([`replication`]), what a
//! refused login means for both ([`login`]), TLS
//! for both ([`tls`]), the pgoutput decoder ([`pgoutput`]), and which WAL history a stored position
//! belongs to ([`lineage`]).

pub mod admin;
pub mod lineage;
pub mod login;
pub mod pgoutput;
pub mod replication;
pub mod tls;
