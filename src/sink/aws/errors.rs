//! The one place an AWS answer is classed: a throttle or a service fault is worth another try; a
//! fault of this one message (too large, an invalid attribute) is a bad event; a fault of the
//! setup (no such queue, access denied, a bad signature) stops the relay with a message naming it.
//! Decided on the error code AWS returns (the `Code` of the error, or of a batch entry), never on
//! message text.

/// What to do about an AWS error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Try again after a backoff: throttling, a service error, a connection or timeout.
    Transient,
    /// This message can never be written as it is: a bad event under `--on-bad-event`.
    BadEvent,
    /// The destination or our credentials are wrong: stop, and say what to fix.
    Setup,
}

/// Codes that mean "slow down" or "try later".
const TRANSIENT: &[&str] = &[
    "ThrottlingException",
    "Throttling",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "LimitExceededException",
    "KMS.ThrottlingException",
    "KmsThrottled",
    "KMSThrottlingException",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "InternalError",
    "InternalFailure",
    "InternalServerError",
    "RequestTimeout",
    "RequestTimeoutException",
    "RequestExpired",
    "SlowDown",
    "AWS.SimpleQueueService.RequestThrottled",
    "KMS.KMSInternalException",
];

/// Codes that blame one message of a batch.
const BAD_EVENT: &[&str] = &[
    "InvalidParameterValue",
    "InvalidParameterValueException",
    "InvalidMessageContents",
    "InvalidAttributeName",
    "InvalidAttributeValue",
    "MessageTooLong",
    "AWS.SimpleQueueService.MessageTooLong",
    "InvalidParameter",
    "ValidationError",
    "ValidationException",
];

/// Class an error `code` (as AWS names it; `None` when the request got no answer) with the HTTP
/// status, if any. A batch entry's failure passes `per_message`: only then may the codes that
/// blame one message make it a bad event; every other client fault blames the setup.
pub fn class_of(code: Option<&str>, status: Option<u16>, per_message: bool) -> Class {
    let Some(code) = code else {
        return match status {
            Some(s) if (400..500).contains(&s) && s != 408 && s != 429 => Class::Setup,
            _ => Class::Transient,
        };
    };
    if TRANSIENT.iter().any(|c| c.eq_ignore_ascii_case(code)) {
        return Class::Transient;
    }
    if per_message && BAD_EVENT.iter().any(|c| c.eq_ignore_ascii_case(code)) {
        return Class::BadEvent;
    }
    // Anything else (a disabled KMS key, access denied, no such queue) is not this event's
    // fault, and dead-lettering every event until it is fixed would be worse than stopping.
    match status {
        Some(s) if s >= 500 || s == 429 => Class::Transient,
        _ => Class::Setup,
    }
}

#[cfg(test)]
mod tests {
    use super::{class_of, Class};

    #[test]
    fn throttles_retry_message_faults_are_bad_events_setup_faults_stop() {
        for code in ["ThrottlingException", "KMS.ThrottlingException", "ProvisionedThroughputExceededException"] {
            assert_eq!(class_of(Some(code), Some(400), true), Class::Transient, "{code}");
            assert_eq!(class_of(Some(code), Some(400), false), Class::Transient, "{code}");
        }
        assert_eq!(class_of(Some("InvalidParameterValue"), Some(400), true), Class::BadEvent);
        assert_eq!(class_of(Some("InvalidParameterValue"), Some(400), false), Class::Setup);
        assert_eq!(class_of(Some("AWS.SimpleQueueService.NonExistentQueue"), Some(400), false), Class::Setup);
        assert_eq!(class_of(Some("AccessDenied"), Some(403), false), Class::Setup);
        assert_eq!(class_of(Some("KMS.DisabledException"), Some(400), true), Class::Setup);
        assert_eq!(class_of(Some("Whatever"), Some(503), false), Class::Transient);
        assert_eq!(class_of(None, None, false), Class::Transient);
        assert_eq!(class_of(None, Some(429), false), Class::Transient);
        assert_eq!(class_of(None, Some(404), false), Class::Setup);
    }
}
