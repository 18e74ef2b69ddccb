//! PostgreSQL side: the catalog checks ([`admin`]), the walsender connection ([`replication`]), which
//! servers both try and for how long ([`hosts`]), what a refused login means for both ([`login`]),
//! TLS for both ([`tls`]; tokio-postgres's side in [`admin_tls`]), and the pgoutput decoder ([`pgoutput`]).

pub mod admin;
pub mod admin_tls;
pub mod hosts;
pub mod login;
pub mod pgoutput;
pub mod replication;
pub mod tls;
