//! PostgreSQL side: the catalog checks ([`admin`]), the walsender connection ([`replication`]), and
//! the pgoutput decoder ([`pgoutput`]).

pub mod admin;
pub mod pgoutput;
pub mod replication;
