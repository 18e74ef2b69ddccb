//! What the AWS sinks share: the `--aws-*` flags ([`AwsArgs`]), the SDK configuration they build
//! their clients from ([`sdk_config`]), and the one place an AWS error is classed as transient or
//! definite ([`class_of`]).
//!
//! Credentials are found the way the AWS CLI finds them, by the SDK's default chain (aws-config):
//! the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), the shared
//! config and credentials files with `AWS_PROFILE` (or `--aws-profile`), web identity
//! (`AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`: IRSA on EKS), the container endpoint (ECS,
//! EKS Pod Identity) and the instance metadata service. outboxd never reads or shows them itself:
//! `outboxd config` prints the region, endpoint and profile only, and the SDK's `Credentials`
//! redacts its secrets in `Debug`.
//!
//! Invariant: every AWS client is built from [`sdk_config`], so the region, the endpoint and the
//! HTTP client (rustls with ring, see Cargo.toml) are the same for all of them.

pub mod config;
pub(crate) mod errors;
pub mod publisher;

use std::time::Duration;

pub use config::{AwsArgs, AwsConfig};
pub use errors::{class_of, context_text, error_text, service_text, setup_failure, setup_fix, Class, CREDENTIALS_FIX};

/// `outboxd check`'s SDK configuration: [`sdk_config`] with the credentials its chain gave, asked
/// once before any service is (so the check's calls sign with them and the chain, an STS call or a
/// `credential_process`, runs once), or the reason it gave none ([`errors::credentials_verdict`]:
/// what, and the fix). Without this, a source that fails on its way (STS, the instance metadata
/// service) would read as the service's silence ("no answer from SQS"). Bounded by
/// [`CREDENTIALS_WAIT`]: the chain called directly has no load timeout of its own, and a
/// `credential_process` waiting for an unlock would hang `check`. Credential errors carry no key;
/// a failed `credential_process` brings its stderr, which `run` logs too.
pub async fn check_sdk_config(cfg: &AwsConfig) -> Result<aws_config::SdkConfig, (String, &'static str)> {
    use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
    let sdk = sdk_config(cfg).await;
    let Some(provider) = sdk.credentials_provider() else { return Ok(sdk) };
    match tokio::time::timeout(CREDENTIALS_WAIT, provider.provide_credentials()).await {
        Ok(Ok(creds)) => Ok(sdk.into_builder().credentials_provider(SharedCredentialsProvider::new(creds)).build()),
        Ok(Err(e)) => Err(errors::credentials_verdict(&e)),
        Err(_) => Err((
            format!("the AWS credential chain gave no credentials within {} s", CREDENTIALS_WAIT.as_secs()),
            "check the credentials' source: a credential_process that waits (for an unlock, a prompt), \
a source that does not answer (STS, the instance metadata service, the container endpoint)",
        )),
    }
}

/// How long `outboxd check` waits for the credential chain.
const CREDENTIALS_WAIT: Duration = Duration::from_secs(60);

/// The SDK configuration for `cfg`: the default credential and region chains, `--aws-region` and
/// `--aws-endpoint-url` over them.
pub async fn sdk_config(cfg: &AwsConfig) -> aws_config::SdkConfig {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    // Bounded waits: a call that hangs (a frozen link) fails and is retried by the publisher
    // instead of holding its events for good.
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(5))
        .operation_attempt_timeout(Duration::from_secs(15))
        .operation_timeout(Duration::from_secs(30))
        .build();
    let mut loader =
        aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http).timeout_config(timeouts);
    if let Some(region) = &cfg.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(url) = &cfg.endpoint_url {
        loader = loader.endpoint_url(url.clone());
    }
    if let Some(profile) = &cfg.profile {
        loader = loader.profile_name(profile);
    }
    loader.load().await
}
