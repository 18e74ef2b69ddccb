//! `outboxd status`: the slot, the publication and the server settings, for humans or `--json`.

use crate::config::StatusArgs;
use crate::error::{Definite, Error};

/// Returns the process exit code: 0 when the slot is healthy, 1 when it is missing or lost.
pub async fn run(_args: &StatusArgs) -> Result<u8, Error> {
    Err(Definite::Config("outboxd status is not available in this build".into()).into())
}
