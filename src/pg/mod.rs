//! PostgreSQL side: the catalog checks ([`admin`]), the walsender connection ([`replication`]), which
//! servers both try and for how long ([`hosts`]), what a refused login means for both ([`login`]),
//! TLS for both ([`tls`]; tokio-postgres's side in [`admin_tls`]), the pgoutput decoder
//! ([`pgoutput`]), which WAL history a stored position belongs to ([`lineage`]), what a failed statement
//! means ([`sqlstate`], by SQLSTATE only) and how a name is quoted in SQL ([`ident`]).

pub mod admin;
pub mod admin_tls;
pub mod hosts;
pub mod ident;
pub mod login;
pub mod pgoutput;
pub mod replication;
pub mod sqlstate;
pub mod tls;
