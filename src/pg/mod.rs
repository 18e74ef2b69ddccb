//! PostgreSQL side: the catalog checks ([`admin`]), the walsender connection ([`replication`]), which
//! servers both try and for how long ([`hosts`]), what a refused login means for both ([`login`]),
//! TLS for both ([`tls`]; tokio-postgres's side in [`admin_tls`]), the pgoutput decoder
//! ([`pgoutput`]), and which WAL history a stored position belongs to ([`lineage`]).

pub mod admin;
pub mod admin_tls;
pub mod hosts;
pub mod lineage;
pub mod login;
pub mod pgoutput;
pub mod replication;
pub mod tls;
