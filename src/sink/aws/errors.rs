//! The one place an AWS answer is classed: a throttle or a service fault is worth another try; a
//! fault of this one message (too large, an invalid attribute) is a bad event; a fault of the
//! setup (no such queue, access denied, a bad signature) stops the relay with a message naming it.
//! Decided on the error code AWS returns (the `Code` of the error, or of a batch entry), never on
//! message text; a call that failed before it was sent is classed by the type of its error
//! ([`setup_failure`]): no usable credentials, or a request the SDK could not build, is a fault of
//! the setup, not "no answer".

use std::error::Error;

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_sqs::error::{DisplayErrorContext, SdkError};

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
    // SNS's names for the same.
    "Throttled",
    "KMSThrottling",
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
    // SNS's code for InvalidParameterValueException (a batch entry's `Code`).
    "ParameterValueInvalid",
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

/// Codes that say the service refused the credentials themselves (not what they may do): a wrong
/// secret, an unknown or deleted key, an expired session.
const REFUSED_CREDENTIALS: &[&str] = &[
    "SignatureDoesNotMatch",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "IncompleteSignature",
    "IncompleteSignatureException",
    "InvalidSignatureException",
    "ExpiredToken",
    "ExpiredTokenException",
    "MissingAuthenticationToken",
    "MissingAuthenticationTokenException",
    "AuthFailure",
];

/// The fix for a fault of the setup the service answered with `code`: for refused credentials,
/// which ones to check; for anything else (no such queue, access denied), `otherwise`.
pub fn setup_fix(code: Option<&str>, otherwise: &str) -> String {
    match code {
        Some(c) if REFUSED_CREDENTIALS.iter().any(|r| r.eq_ignore_ascii_case(c)) => {
            "the credentials were refused: check the access key and secret the chain found (the environment, \
             the profile of AWS_PROFILE or --aws-profile and the role it assumes, web identity), or renew \
             expired ones"
                .into()
        }
        _ => otherwise.into(),
    }
}

/// How to give outboxd credentials, said with every error that found none usable.
pub const CREDENTIALS_FIX: &str = "provide AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
a profile of ~/.aws/credentials or ~/.aws/config (AWS_PROFILE or --aws-profile; static keys, \
credential_process or a role, not SSO), web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN), \
or an ECS/EKS container or EC2 instance role";

/// The fault of the setup in an error the SDK gave before sending anything, if it is one: no
/// usable credentials (the chain found none, a profile it cannot use, such as SSO, which is not
/// built in) or a request it could not build. Such an error has no code and no HTTP status, and
/// [`class_of`] would take it for "no answer" and retry it forever. Decided by the error's type:
/// a [`CredentialsError`] anywhere in its source chain, or `SdkError::ConstructionFailure`. A
/// provider that timed out or failed on its way (the instance metadata service, STS) is left to
/// the retries; one that could not read its file (a web identity token file not there) is not. What it gives: what is wrong, and how to fix it. No secret is in either:
/// credential errors carry none.
pub fn setup_failure<E, R>(e: &SdkError<E, R>) -> Option<(String, &'static str)>
where
    E: Error + 'static,
    R: std::fmt::Debug + 'static,
{
    let mut cause: Option<&(dyn Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(ce) = c.downcast_ref::<CredentialsError>() {
            return match ce {
                // A file the chain was told to read (AWS_WEB_IDENTITY_TOKEN_FILE) is not there or
                // not readable: no retry brings it; the rest of provider errors may pass.
                CredentialsError::ProviderError(_) if unreadable_file(ce) => Some((
                    format!("no usable AWS credentials ({})", one_line(&DisplayErrorContext(ce).to_string())),
                    CREDENTIALS_FIX,
                )),
                CredentialsError::ProviderTimedOut(_) | CredentialsError::ProviderError(_) => None,
                _ => Some((
                    format!("no usable AWS credentials ({})", one_line(&DisplayErrorContext(ce).to_string())),
                    CREDENTIALS_FIX,
                )),
            };
        }
        cause = c.source();
    }
    match e {
        SdkError::ConstructionFailure(_) => Some((
            format!("the AWS SDK could not build the request ({})", one_line(&DisplayErrorContext(e).to_string())),
            "check --aws-region and --aws-endpoint-url",
        )),
        _ => None,
    }
}

/// Whether a credential provider failed on a file it could not read (not found, no permission),
/// by the `io::Error` kind in its source chain.
fn unreadable_file(e: &CredentialsError) -> bool {
    let mut cause = e.source();
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return matches!(io.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied);
        }
        cause = c.source();
    }
    false
}

/// `text` on one line: the SDK's credential errors list what they tried on lines of their own.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::{class_of, setup_failure, setup_fix, Class};
    use aws_credential_types::provider::error::CredentialsError;
    use aws_sdk_sqs::error::SdkError;

    #[test]
    fn throttles_retry_message_faults_are_bad_events_setup_faults_stop() {
        for code in ["ThrottlingException", "KMS.ThrottlingException", "ProvisionedThroughputExceededException"] {
            assert_eq!(class_of(Some(code), Some(400), true), Class::Transient, "{code}");
            assert_eq!(class_of(Some(code), Some(400), false), Class::Transient, "{code}");
        }
        assert_eq!(class_of(Some("InvalidParameterValue"), Some(400), true), Class::BadEvent);
        assert_eq!(class_of(Some("InvalidParameterValue"), Some(400), false), Class::Setup);
        // SNS names an entry it refuses so; only per entry is it the event's fault.
        assert_eq!(class_of(Some("ParameterValueInvalid"), None, true), Class::BadEvent);
        assert_eq!(class_of(Some("ParameterValueInvalid"), Some(400), false), Class::Setup);
        assert_eq!(class_of(Some("AWS.SimpleQueueService.NonExistentQueue"), Some(400), false), Class::Setup);
        assert_eq!(class_of(Some("AccessDenied"), Some(403), false), Class::Setup);
        assert_eq!(class_of(Some("KMS.DisabledException"), Some(400), true), Class::Setup);
        assert_eq!(class_of(Some("Whatever"), Some(503), false), Class::Transient);
        assert_eq!(class_of(None, None, false), Class::Transient);
        assert_eq!(class_of(None, Some(429), false), Class::Transient);
        assert_eq!(class_of(None, Some(404), false), Class::Setup);
    }

    #[test]
    fn refused_credentials_name_the_credentials_not_the_queue() {
        for code in ["SignatureDoesNotMatch", "InvalidClientTokenId", "UnrecognizedClientException"] {
            assert_eq!(class_of(Some(code), Some(403), false), Class::Setup, "{code}");
            assert!(setup_fix(Some(code), "check the URL").contains("credentials were refused"), "{code}");
        }
        assert_eq!(setup_fix(Some("AccessDenied"), "check the URL"), "check the URL");
        assert_eq!(setup_fix(None, "check the URL"), "check the URL");
    }

    #[test]
    fn missing_credentials_and_unbuildable_requests_are_setup_faults_by_type() {
        type E = SdkError<std::io::Error, ()>;
        let none: E = SdkError::construction_failure(CredentialsError::not_loaded(
            "no credentials found in chain. Attempted:\n  Environment: not set",
        ));
        let (m, fix) = setup_failure(&none).expect("no credentials is a setup fault");
        assert!(m.contains("no usable AWS credentials") && !m.contains('\n'), "{m}");
        assert!(fix.contains("AWS_ACCESS_KEY_ID") && fix.contains("--aws-profile"), "{fix}");
        let sso: E = SdkError::construction_failure(CredentialsError::invalid_configuration("sso is not enabled"));
        assert!(setup_failure(&sso).is_some_and(|(m, _)| m.contains("credentials")));
        // A provider that timed out may answer next time; so may a connection.
        let slow: E =
            SdkError::construction_failure(CredentialsError::provider_timed_out(std::time::Duration::from_secs(5)));
        assert_eq!(setup_failure(&slow), None);
        let timeout: E = SdkError::timeout_error("attempt timed out");
        assert_eq!(setup_failure(&timeout), None);
        // A provider that failed on its way may too (STS refused a connection), unless it could
        // not read its file (a web identity token file not there).
        let io = |k| CredentialsError::provider_error(std::io::Error::from(k));
        let refused: E = SdkError::construction_failure(io(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(setup_failure(&refused), None);
        let no_file: E = SdkError::construction_failure(io(std::io::ErrorKind::NotFound));
        assert!(setup_failure(&no_file).is_some_and(
            |(m, fix)| m.contains("no usable AWS credentials") && fix.contains("AWS_WEB_IDENTITY_TOKEN_FILE")
        ));
        let built: E = SdkError::construction_failure("no region");
        assert!(setup_failure(&built).is_some_and(|(_, fix)| fix.contains("--aws-region")));
    }
}
