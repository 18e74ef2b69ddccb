//! `outboxd check`: a preflight of everything `run` depends on, with the same flags as `run`.
//!
//! Read-only: it creates no slot and no publication; a missing topic's creation is only validated
//! (CreateTopics with `validate_only`). Each check ends as ok, info, warn or fail; every fail carries the fix.
//! The exit code is 0 when nothing failed (warnings are printed but keep 0) and 1 otherwise, so it
//! can gate a deploy. The PostgreSQL checks live in [`pg`], the broker checks in [`sink`].

mod pg;
mod sink;

use serde::Serialize;

use crate::config::Config;
use crate::error::Error;

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Info,
    Warn,
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Info => "info",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Stable name, e.g. `wal_level`, `table public.outbox columns`.
    pub name: String,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to change; set on every warn and fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// A fail that may pass by itself (the server restarting, a dropped connection): `check`
    /// could not look, rather than found something wrong. Only in `--json` when true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub transient: bool,
}

/// Everything `check` prints; `--json` prints this.
#[derive(Debug, Serialize)]
pub struct Report {
    /// No check failed (the exit code is 0).
    pub ok: bool,
    pub failures: usize,
    pub warnings: usize,
    pub checks: Vec<Check>,
}

/// The checks gathered so far.
#[derive(Default)]
pub(crate) struct Checks(Vec<Check>);

impl Checks {
    fn push(&mut self, name: impl Into<String>, status: Status, detail: impl Into<String>, fix: Option<String>) {
        self.0.push(Check { name: name.into(), status, detail: detail.into(), fix, transient: false });
    }

    pub(crate) fn ok(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(name, Status::Ok, detail, None);
    }

    pub(crate) fn info(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(name, Status::Info, detail, None);
    }

    pub(crate) fn warn(&mut self, name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) {
        self.push(name, Status::Warn, detail, Some(fix.into()));
    }

    pub(crate) fn fail(&mut self, name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) {
        self.push(name, Status::Fail, detail, Some(fix.into()));
    }

    /// A fail that may pass by itself (see [`Check::transient`]).
    pub(crate) fn fail_transient(
        &mut self,
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.push(name, Status::Fail, detail, Some(fix.into()));
        if let Some(c) = self.0.last_mut() {
            c.transient = true;
        }
    }

    fn into_report(self) -> Report {
        let failures = self.0.iter().filter(|c| c.status == Status::Fail).count();
        let warnings = self.0.iter().filter(|c| c.status == Status::Warn).count();
        Report { ok: failures == 0, failures, warnings, checks: self.0 }
    }
}

/// Run every check, print the report, return the exit code.
pub async fn run(cfg: &Config, json: bool) -> Result<u8, Error> {
    let mut checks = Checks::default();
    let routed = pg::check(cfg, &mut checks).await;
    sink::check(cfg, &routed, &mut checks).await;
    let report = checks.into_report();
    if json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| crate::error::Definite::Config(format!("rendering the report as JSON: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", render(&report));
    }
    Ok(if report.ok { 0 } else { 1 })
}

/// The human table: one line per check, the fix indented under each warn and fail.
pub fn render(report: &Report) -> String {
    let width = report.checks.iter().map(|c| c.name.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for c in &report.checks {
        out.push_str(&format!("{:<4}  {:<width$}  {}\n", c.status.label(), c.name, c.detail));
        if let Some(fix) = &c.fix {
            out.push_str(&format!("      {:<width$}  fix: {fix}\n", ""));
        }
    }
    out.push_str(&format!(
        "{}: {} checks, {} failed, {} warnings\n",
        if report.ok { "check passed" } else { "check FAILED" },
        report.checks.len(),
        report.failures,
        report.warnings
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_keeps_success_and_a_failure_does_not() {
        let mut c = Checks::default();
        c.ok("wal_level", "logical");
        c.warn("slot WAL retention", "unlimited", "set max_slot_wal_keep_size");
        let r = c.into_report();
        assert!(r.ok && r.warnings == 1 && r.failures == 0);
        let text = render(&r);
        assert!(text.contains("WARN") && text.contains("fix: set max_slot_wal_keep_size"), "{text}");
        assert!(text.ends_with("check passed: 2 checks, 0 failed, 1 warnings\n"), "{text}");

        let mut c = Checks::default();
        c.fail("wal_level", "replica", "ALTER SYSTEM SET wal_level = logical");
        let r = c.into_report();
        assert!(!r.ok && r.failures == 1);
        let json: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(json["checks"][0]["status"], "fail");
        assert_eq!(json["checks"][0]["fix"], "ALTER SYSTEM SET wal_level = logical");
    }
}
