//! The one place an AWS answer is classed: a throttle or a service fault is worth another try; a
//! fault of this one message (too large, an invalid attribute) is a bad event; a fault of the
//! setup (no such queue, access denied, a bad signature) stops the relay with a message naming it.
//! Decided on the error code AWS returns (the `Code` of the error, or of a batch entry), never on
//! message text; a call that failed before it was sent is classed by the type of its error
//! ([`setup_failure`]): no usable credentials, or a request the SDK could not build, is a fault of
//! the setup, not "no answer".
//!
//! Invariant: a service's message reaches a log line or an error only through [`service_text`]
//! (or [`error_text`], [`context_text`] built on it): AWS's signature-mismatch messages quote the
//! canonical request, session token included, over several lines.

use std::error::Error;
use std::sync::LazyLock;
use std::time::Duration;

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use regex::Regex;
use tokio::time::Instant;

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
    if code.is_some_and(expired) {
        // Transient here; a run stops on them only when they last ([`Expiry`]).
        return Class::Transient;
    }
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

/// Codes that say the session (or the request's signing time) ran out: with temporary credentials
/// (an assumed role, web identity, a container or instance role) the SDK's credentials cache
/// fetches new ones a little before they expire by the local clock, so a clock running behind
/// sends the old ones for a while. Retried, not a stop, until they last [`EXPIRED_FOR`].
const EXPIRED: &[&str] = &["ExpiredToken", "ExpiredTokenException", "RequestExpired"];

/// Whether `code` says the credentials or the request's signing time expired.
pub fn expired(code: &str) -> bool {
    EXPIRED.iter().any(|c| c.eq_ignore_ascii_case(code))
}

/// How long calls may be answered "expired" before the relay stops: ten minutes is twice the five
/// minutes of clock skew AWS accepts in a signature, and the SDK's cache refreshes well within it
/// once the local clock reaches the credentials' expiry.
pub const EXPIRED_FOR: Duration = Duration::from_secs(600);

/// Since when the calls have been answered "expired" (none answered otherwise since).
#[derive(Debug, Default)]
pub struct Expiry {
    since: Option<Instant>,
}

impl Expiry {
    /// The class of a call that failed as a whole with `code` and `status` at `now`: as
    /// [`class_of`], except that an expired session answered for [`EXPIRED_FOR`] on end is a
    /// fault of the setup.
    pub fn class(&mut self, code: Option<&str>, status: Option<u16>, now: Instant) -> Class {
        if !code.is_some_and(expired) {
            return class_of(code, status, false);
        }
        let since = *self.since.get_or_insert(now);
        if now.saturating_duration_since(since) >= EXPIRED_FOR {
            Class::Setup
        } else {
            Class::Transient
        }
    }

    /// A call was answered: the credentials work (again).
    pub fn answered(&mut self) {
        self.since = None;
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
        Some(c) if expired(c) => format!(
            "the credentials were answered as expired for {} minutes on end: check that the machine's clock is \
             right (AWS accepts 5 minutes of skew) and that the chain can renew them (the role it assumes, \
             the web identity token file, the container or instance role), or renew expired ones",
            EXPIRED_FOR.as_secs() / 60
        ),
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
            return credentials_setup_failure(ce);
        }
        cause = c.source();
    }
    match e {
        SdkError::ConstructionFailure(_) => Some((
            format!("the AWS SDK could not build the request ({})", context_text(e)),
            "check --aws-region and --aws-endpoint-url",
        )),
        _ => None,
    }
}

/// The setup's fault in a credential chain's error, if it is one (what is wrong, how to fix it);
/// `None` for a provider that timed out or failed on its way (the instance metadata service, STS,
/// the container endpoint): that one is retried.
fn credentials_setup_failure(ce: &CredentialsError) -> Option<(String, &'static str)> {
    match ce {
        // A file the chain was told to read (AWS_WEB_IDENTITY_TOKEN_FILE) is not there or not
        // readable: no retry brings it; the rest of provider errors may pass.
        CredentialsError::ProviderError(_) if unreadable_file(ce) => Some((
            format!(
                "no usable AWS credentials: {} could not be read ({})",
                token_files(|v| std::env::var(v).ok()),
                context_text(ce)
            ),
            CREDENTIALS_FIX,
        )),
        CredentialsError::ProviderTimedOut(_) | CredentialsError::ProviderError(_) => None,
        _ => Some((format!("no usable AWS credentials ({})", context_text(ce)), CREDENTIALS_FIX)),
    }
}

/// What `outboxd check` says of a credential chain that gave no credentials: the setup's fault as
/// [`setup_failure`] words it; for a source that did not answer (timed out, or a connection or name
/// lookup that failed under it), that; for a source that answered with a refusal or failed
/// otherwise (STS's AccessDenied or InvalidIdentityToken, a `credential_process` that exited
/// non-zero), that, with its own error. `run` retries the last two.
pub fn credentials_verdict(ce: &CredentialsError) -> (String, &'static str) {
    if let Some(setup) = credentials_setup_failure(ce) {
        return setup;
    }
    if matches!(ce, CredentialsError::ProviderTimedOut(_)) || under_a_connection_failure(ce) {
        return (
            format!("the AWS credential chain's source did not answer ({})", context_text(ce)),
            "check that the credentials' source is reachable (STS or AWS_ENDPOINT_URL_STS for a role or \
web identity, the EC2 instance metadata service, the ECS/EKS container endpoint); `run` retries it",
        );
    }
    (
        format!("the AWS credential chain's source refused or failed ({})", context_text(ce)),
        "see its error: for a role or web identity, the role's trust policy and the token's audience; \
for credential_process, the command; `run` retries it",
    )
}

/// Whether a connection that was never answered is among `e`'s causes: the connector's own error
/// (a refused or reset connection, a name lookup, a TLS handshake, a timeout), or an `io::Error`.
fn under_a_connection_failure(e: &(dyn Error + 'static)) -> bool {
    let mut cause = e.source();
    while let Some(c) = cause {
        if c.is::<aws_sdk_sqs::error::ConnectorError>() || c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Whether a credential provider failed on a file it could not read (not found, no permission):
/// its own error is an `io::Error` of that kind, as aws-config's providers give when reading a
/// token file fails. Only the immediate source: an `io::Error` deeper down (under an STS call's
/// dispatch failure: a name lookup, a firewall) is the network's, and worth another try.
fn unreadable_file(e: &CredentialsError) -> bool {
    e.source()
        .and_then(|c| c.downcast_ref::<std::io::Error>())
        .is_some_and(|io| matches!(io.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied))
}

/// The token files the chain reads, as set in the environment (`get` reads a variable), to name in
/// the error when one could not be read; the paths are not secret, the tokens in them are.
fn token_files(get: impl Fn(&str) -> Option<String>) -> String {
    let set: Vec<String> = ["AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"]
        .iter()
        .filter_map(|v| get(v).map(|path| format!("{v}={path}")))
        .collect();
    if set.is_empty() {
        "the token file of the profile's web_identity_token_file".into()
    } else {
        format!("the token file ({})", set.join(" or "))
    }
}

/// A session token as a header of a quoted canonical request (`x-amz-security-token:TOKEN`) or as
/// a presigned URL's query parameter (`X-Amz-Security-Token=TOKEN`).
static SESSION_TOKEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)(x-amz-security-token\s*[:=]\s*)[^\s&]+").expect("a valid pattern"));

/// A service's message as it may be logged or returned: its first part only (up to the first
/// blank line, or to "The Canonical String" / "The String-to-Sign" that signature-mismatch
/// answers add), any session token in it redacted, on one line.
pub fn service_text(text: &str) -> String {
    let mut head = String::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            if head.trim().is_empty() {
                continue;
            }
            break;
        }
        head.push_str(line);
        head.push('\n');
    }
    let cut = ["The Canonical String", "The String-to-Sign"].iter().filter_map(|m| head.find(m)).min();
    if let Some(at) = cut {
        head.truncate(at);
    }
    one_line(&SESSION_TOKEN.replace_all(&head, "${1}<redacted>"))
}

/// The service's message of `e` (or, without one, the error with its causes) through
/// [`service_text`]: what an error returned or a refusal logged says of it.
pub fn error_text<E, R>(e: &SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + Error + 'static,
    R: std::fmt::Debug + 'static,
{
    match e.message() {
        Some(m) => service_text(m),
        None => context_text(e),
    }
}

/// `e` with its causes (the SDK's `DisplayErrorContext`) through [`service_text`], for a warning.
pub fn context_text<E: Error + 'static>(e: &E) -> String {
    service_text(&DisplayErrorContext(e).to_string())
}

/// `text` on one line: the SDK's credential errors list what they tried on lines of their own.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::{
        class_of, credentials_verdict, service_text, setup_failure, setup_fix, token_files, Class, Expiry, EXPIRED_FOR,
    };
    use aws_credential_types::provider::error::CredentialsError;
    use aws_sdk_sqs::error::SdkError;
    use std::time::Duration;
    use tokio::time::Instant;

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

    #[test]
    fn a_service_message_keeps_its_first_part_on_one_line_without_a_session_token() {
        let token = "IQoJb3JpZ2luX2VjEXAMPLEsessionTOKEN/+=";
        let aws = format!(
            "The request signature we calculated does not match the signature you provided. Check your AWS \
             Secret Access Key and signing method. Consult the service documentation for details.\n\n\
             The Canonical String for this request should have been\n'POST\n/\n\n\
             content-type:application/x-amz-json-1.0\nhost:sqs.us-east-1.amazonaws.com\n\
             x-amz-date:20261206T051500Z\nx-amz-security-token:{token}\n\n\
             content-type;host;x-amz-date;x-amz-security-token\nabc123'\n\n\
             The String-to-Sign should have been\n'AWS4-HMAC-SHA256\n20261206T051500Z\n...'\n"
        );
        let m = service_text(&aws);
        assert_eq!(
            m,
            "The request signature we calculated does not match the signature you provided. Check your AWS \
             Secret Access Key and signing method. Consult the service documentation for details."
        );
        // The same on one paragraph (no blank line before the quote), and a token in the part
        // kept, as a header or a presigned URL's parameter, is redacted.
        let flat = aws.replace("\n\n", "\n");
        let m = service_text(&flat);
        assert!(!m.contains(token) && !m.contains('\n') && !m.contains("Canonical"), "{m}");
        let m = service_text(&format!(
            "denied x-amz-security-token:{token}\nfor https://q?X-Amz-Security-Token={token}&X-Amz-Date=1"
        ));
        assert_eq!(
            m,
            "denied x-amz-security-token:<redacted> for https://q?X-Amz-Security-Token=<redacted>&X-Amz-Date=1"
        );
        assert_eq!(service_text("\n  Access to the resource is denied.\n"), "Access to the resource is denied.");
    }

    #[test]
    fn an_expired_session_is_retried_and_stops_only_when_it_lasts() {
        for code in ["ExpiredToken", "ExpiredTokenException", "RequestExpired"] {
            assert_eq!(class_of(Some(code), Some(400), false), Class::Transient, "{code}");
            let mut e = Expiry::default();
            let t0 = Instant::now();
            assert_eq!(e.class(Some(code), Some(400), t0), Class::Transient, "{code}");
            assert_eq!(e.class(Some(code), Some(400), t0 + EXPIRED_FOR / 2), Class::Transient, "{code}");
            // Another failure meanwhile neither resets nor ends the count.
            assert_eq!(e.class(Some("Throttling"), Some(400), t0 + EXPIRED_FOR / 2), Class::Transient);
            assert_eq!(e.class(Some(code), Some(400), t0 + EXPIRED_FOR), Class::Setup, "{code}");
            // The final stop names the credentials.
            assert!(setup_fix(Some(code), "check the URL").contains("renew expired ones"), "{code}");
            // An answered call starts the count again: a refresh that came late stops nothing.
            e.answered();
            let t1 = t0 + EXPIRED_FOR * 3;
            assert_eq!(e.class(Some(code), Some(400), t1), Class::Transient, "{code}");
            assert_eq!(e.class(Some(code), Some(400), t1 + EXPIRED_FOR - Duration::from_secs(1)), Class::Transient);
        }
        // Other codes are classed as before.
        let mut e = Expiry::default();
        assert_eq!(e.class(Some("AccessDenied"), Some(403), Instant::now()), Class::Setup);
        assert_eq!(e.class(Some("InvalidClientTokenId"), Some(403), Instant::now()), Class::Setup);
    }

    #[test]
    fn only_the_providers_own_io_error_is_an_unreadable_file() {
        type E = SdkError<std::io::Error, ()>;
        // STS could not be reached: a name lookup or a firewall answers with an io error, under
        // the STS call's dispatch failure under the provider's error. Worth another try.
        let lookup = std::io::Error::from(std::io::ErrorKind::NotFound);
        let sts: E = SdkError::dispatch_failure(aws_sdk_sqs::error::ConnectorError::io(lookup.into()));
        let through: E = SdkError::construction_failure(CredentialsError::provider_error(sts));
        assert_eq!(setup_failure(&through), None);
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let sts: E = SdkError::dispatch_failure(aws_sdk_sqs::error::ConnectorError::io(denied.into()));
        let through: E = SdkError::construction_failure(CredentialsError::provider_error(sts));
        assert_eq!(setup_failure(&through), None);
        // The token file itself not there stops, naming the file.
        let no_file: E = SdkError::construction_failure(CredentialsError::provider_error(std::io::Error::from(
            std::io::ErrorKind::NotFound,
        )));
        assert!(setup_failure(&no_file).is_some_and(|(m, _)| m.contains("could not be read")));
        let env = |v: &str| (v == "AWS_WEB_IDENTITY_TOKEN_FILE").then(|| "/var/run/token".to_owned());
        assert_eq!(token_files(env), "the token file (AWS_WEB_IDENTITY_TOKEN_FILE=/var/run/token)");
        assert!(token_files(|_| None).contains("web_identity_token_file"));
    }

    /// `outboxd check`'s words for a chain that gave nothing: a source that was never reached (or
    /// timed out) "did not answer"; one that answered with a refusal (STS's AccessDenied, wrapped
    /// by aws-config as a provider error with no connection failure under it) "refused or failed";
    /// the setup's faults as `run` words them.
    #[test]
    fn check_tells_a_source_not_reached_from_one_that_refused() {
        type E = SdkError<std::io::Error, ()>;
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let sts: E = SdkError::dispatch_failure(aws_sdk_sqs::error::ConnectorError::io(refused.into()));
        let (what, fix) = credentials_verdict(&CredentialsError::provider_error(sts));
        assert!(what.contains("did not answer") && fix.contains("AWS_ENDPOINT_URL_STS"), "{what}");
        let (what, _) = credentials_verdict(&CredentialsError::provider_timed_out(Duration::from_secs(5)));
        assert!(what.contains("did not answer"), "{what}");
        let denied: Box<dyn std::error::Error + Send + Sync> =
            "AccessDenied: Not authorized to perform sts:AssumeRoleWithWebIdentity".into();
        let (what, fix) = credentials_verdict(&CredentialsError::provider_error(denied));
        assert!(what.contains("refused or failed") && what.contains("AccessDenied"), "{what}");
        assert!(fix.contains("trust policy"), "{fix}");
        let (what, _) =
            credentials_verdict(&CredentialsError::not_loaded("no providers in chain provided credentials"));
        assert!(what.starts_with("no usable AWS credentials"), "{what}");
    }
}
