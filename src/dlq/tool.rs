//! `outboxd dlq list` and `outboxd dlq replay`.

use crate::config::DlqCommand;
use crate::error::{Definite, Error};

/// Returns the process exit code.
pub async fn run(_cmd: DlqCommand) -> Result<u8, Error> {
    Err(Definite::Config("outboxd dlq is not available in this build".into()).into())
}
