//! The `--aws-*` flags every AWS sink shares (`--sink sqs`, `--sink sns`): the region, the endpoint (a VPC
//! endpoint, or a local test server) and the shared-config profile, and their validated form.
//! Credentials have no flags: they come from the SDK's default chain (see [`super`]).

use crate::error::Definite;

/// How outboxd reaches AWS, for every AWS sink.
#[derive(Debug, Clone, clap::Args)]
pub struct AwsArgs {
    /// AWS region for the AWS sinks (e.g. eu-west-1). Default: AWS_REGION, then the profile's
    /// region, then the instance's.
    #[arg(long, env = "OUTBOXD_AWS_REGION", value_name = "REGION")]
    pub aws_region: Option<String>,
    /// Send AWS requests to this endpoint instead of the region's (a VPC endpoint, a local test
    /// server): http(s)://host[:port].
    #[arg(long, env = "OUTBOXD_AWS_ENDPOINT_URL", hide_env_values = true, value_name = "URL")]
    pub aws_endpoint_url: Option<String>,
    /// The profile of the shared AWS config and credentials files (default: AWS_PROFILE, then
    /// "default").
    #[arg(long, env = "OUTBOXD_AWS_PROFILE", value_name = "NAME")]
    pub aws_profile: Option<String>,
}

/// The validated `--aws-*` settings. Nothing in it is secret.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AwsConfig {
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
    pub profile: Option<String>,
}

impl AwsArgs {
    pub fn validate(&self) -> Result<AwsConfig, Definite> {
        let bad = |m: String| Definite::Config(m);
        if let Some(r) = &self.aws_region {
            if r.is_empty() || !r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                return Err(bad(format!("--aws-region {r:?} is not a region name; give one such as eu-west-1")));
            }
        }
        if let Some(u) = &self.aws_endpoint_url {
            let scheme_ok = u.starts_with("http://") || u.starts_with("https://");
            if !scheme_ok || u.contains('@') || u.len() <= "https://".len() {
                return Err(bad(format!(
                    "--aws-endpoint-url {u:?} is not an endpoint URL; give http(s)://host[:port] (no user or password)"
                )));
            }
        }
        if self.aws_profile.as_deref() == Some("") {
            return Err(bad("--aws-profile is empty; give a profile name of ~/.aws/config or leave it out".into()));
        }
        Ok(AwsConfig {
            region: self.aws_region.clone(),
            endpoint_url: self.aws_endpoint_url.clone(),
            profile: self.aws_profile.clone(),
        })
    }
}

impl AwsConfig {
    /// The flags that rebuild this, for `outboxd config`.
    pub fn show(&self, push: &mut dyn FnMut(&'static str, String)) {
        if let Some(r) = &self.region {
            push("aws-region", r.clone());
        }
        if let Some(u) = &self.endpoint_url {
            push("aws-endpoint-url", u.clone());
        }
        if let Some(p) = &self.profile {
            push("aws-profile", p.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(region: Option<&str>, url: Option<&str>) -> AwsArgs {
        AwsArgs { aws_region: region.map(Into::into), aws_endpoint_url: url.map(Into::into), aws_profile: None }
    }

    #[test]
    fn bad_regions_and_endpoints_are_refused_with_the_flag_named() {
        assert!(args(Some("eu-west-1"), Some("http://127.0.0.1:4566")).validate().is_ok());
        for (r, u) in [(Some("eu west"), None), (None, Some("ftp://x")), (None, Some("https://u:p@host"))] {
            let e = args(r, u).validate().unwrap_err().to_string();
            assert!(e.contains("--aws-"), "{e}");
            assert!(!e.contains("u:p@") || e.contains("no user"), "{e}");
        }
    }
}
