//! The shipped operations files agree with the binary and with the metrics interface:
//! `config/prometheus-alerts.yml` (structure, metric names, `promtool check rules` when installed),
//! `config/grafana-dashboard.json` (structure, metric names), and the flags and `OUTBOXD_*`
//! variables used by the `Dockerfile`, `config/outboxd.env` and `config/outboxd.service`.
//!
//! No servers needed: these tests read files and run `outboxd ... --help`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use outboxd::metrics::NAMES as METRICS;

/// Histograms, which Prometheus exposes as `_bucket`, `_sum` and `_count` series.
const HISTOGRAMS: &[&str] =
    &["outboxd_commit_to_ack_seconds", "outboxd_kafka_transaction_records", "outboxd_kafka_transaction_commit_seconds"];

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Every `outboxd_*` identifier in `text` (PromQL or prose).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("outboxd_") {
        if text[..i].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let len = text[i..].find(|c: char| !is_ident(c)).unwrap_or(text.len() - i);
        out.insert(text[i..i + len].to_owned());
    }
    out
}

fn is_documented(name: &str) -> bool {
    METRICS.contains(&name)
        || HISTOGRAMS.iter().any(|h| ["_bucket", "_sum", "_count"].iter().any(|s| name.strip_prefix(h) == Some(*s)))
}

fn assert_documented(what: &str, text: &str) {
    for name in metric_names(text) {
        assert!(is_documented(&name), "{what} uses {name}, which is not one of outboxd's metrics: {METRICS:?}");
    }
}

fn yaml_str<'a>(v: &'a serde_yaml::Value, key: &str, ctx: &str) -> &'a str {
    v.get(key)
        .and_then(|x| x.as_str())
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| panic!("{ctx}: missing or empty {key:?}"))
}

#[test]
fn prometheus_alerts_are_well_formed_and_use_only_real_metrics() {
    let text = read("config/prometheus-alerts.yml");
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("alerts file is YAML");
    let groups = doc["groups"].as_sequence().expect("top-level `groups` list");
    assert!(!groups.is_empty(), "no rule groups");
    let mut names = BTreeSet::new();
    for g in groups {
        let gname = yaml_str(g, "name", "rule group");
        let rules = g["rules"].as_sequence().unwrap_or_else(|| panic!("group {gname}: no `rules` list"));
        assert!(!rules.is_empty(), "group {gname} has no rules");
        for r in rules {
            let alert = yaml_str(r, "alert", &format!("a rule of group {gname}"));
            assert!(names.insert(alert.to_owned()), "alert {alert} defined twice");
            let expr = yaml_str(r, "expr", alert);
            let severity = yaml_str(&r["labels"], "severity", &format!("{alert} labels"));
            assert!(
                ["critical", "warning", "info"].contains(&severity),
                "{alert}: severity {severity:?} is not critical/warning/info"
            );
            let ann = &r["annotations"];
            yaml_str(ann, "summary", &format!("{alert} annotations"));
            yaml_str(ann, "description", &format!("{alert} annotations"));
            assert_documented(&format!("alert {alert} expr"), expr);
            assert!(
                !metric_names(expr).is_empty() || expr.contains("up{"),
                "{alert}: expr uses no outboxd metric: {expr}"
            );
            for (k, v) in ann.as_mapping().expect("annotations mapping") {
                let k = k.as_str().unwrap_or("?");
                assert_documented(&format!("alert {alert} annotation {k}"), v.as_str().unwrap_or(""));
            }
        }
    }
    for want in [
        "OutboxdDown",
        "OutboxdNotConnected",
        "OutboxdLagHigh",
        "OutboxdPublishErrorRate",
        "OutboxdBacklogGrowing",
        "OutboxdInFlightStuck",
        "OutboxdSlotSafeWalLow",
        "OutboxdDeadLetters",
    ] {
        assert!(names.contains(want), "alert {want} is missing; have {names:?}");
    }

    // The authoritative syntax check, where promtool is installed (Debian: package prometheus).
    if let Ok(out) =
        Command::new("promtool").args(["check", "rules"]).arg(repo("config/prometheus-alerts.yml")).output()
    {
        assert!(
            out.status.success(),
            "promtool check rules failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Panels, including those nested in collapsed rows.
fn panels(v: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in v["panels"].as_array().into_iter().flatten() {
        if p["type"] == "row" {
            out.extend(panels(p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn grafana_dashboard_is_valid_and_uses_only_real_metrics() {
    let text = read("config/grafana-dashboard.json");
    let d: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()), "no title");
    assert!(d["uid"].as_str().is_some_and(|t| !t.is_empty()), "no uid");
    let schema = d["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");

    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let ds = vars.iter().find(|v| v["type"] == "datasource").expect("a data source variable");
    assert_eq!(ds["query"], "prometheus", "the data source variable must pick Prometheus");
    let ds_ref = format!("${{{}}}", ds["name"].as_str().expect("variable name"));
    for v in vars.iter().filter(|v| v["type"] == "query") {
        assert_documented(&format!("variable {}", v["name"]), &v["definition"].to_string());
    }

    let all = panels(&d);
    assert!(!all.is_empty(), "no panels");
    let mut ids = BTreeSet::new();
    let mut used = BTreeSet::new();
    for p in all {
        let title = p["title"].as_str().expect("panel title");
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "duplicate id on {title}");
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
        }
        assert_eq!(p["datasource"]["uid"], ds_ref.as_str(), "{title}: datasource");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        let targets = targets.unwrap_or_else(|| panic!("panel {title} has no targets"));
        for t in targets {
            let expr = t["expr"].as_str().filter(|e| !e.trim().is_empty());
            let expr = expr.unwrap_or_else(|| panic!("panel {title}: a target without expr"));
            let names = metric_names(expr);
            assert!(!names.is_empty(), "panel {title}: {expr} uses no outboxd metric");
            assert_documented(&format!("panel {title:?}"), expr);
            used.extend(names);
        }
    }
    for m in METRICS {
        assert!(used.iter().any(|u| u.starts_with(m)), "no panel shows {m}");
    }
}

// ---------------------------------------------------------------------------
// flags and environment variables against the binary
// ---------------------------------------------------------------------------

/// `outboxd <args> --help`, with no OUTBOXD_* of ours leaking into clap's `[env: ...]` values.
fn help(sub: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outboxd"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OUTBOXD_") {
            cmd.env_remove(&k);
        }
    }
    let out = cmd.args(sub).arg("--help").output().expect("run outboxd --help");
    assert!(out.status.success(), "outboxd {sub:?} --help failed");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

fn help_flags(help: &str) -> BTreeSet<String> {
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == '<')
        .filter_map(|w| w.strip_prefix("--"))
        .map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()))
        .filter(|w| !w.is_empty())
        .map(|w| format!("--{w}"))
        .collect()
}

fn help_envs(help: &str) -> BTreeSet<String> {
    help.match_indices("[env: ")
        .map(|(i, m)| {
            let rest = &help[i + m.len()..];
            let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            rest[..len.unwrap_or(rest.len())].to_owned()
        })
        .collect()
}

/// Every OUTBOXD_* variable any subcommand reads.
fn all_envs() -> BTreeSet<String> {
    let subs: &[&[&str]] = &[
        &["run"],
        &["config"],
        &["check"],
        &["status"],
        &["dlq", "list"],
        &["dlq", "replay"],
        &["shadow", "compare"],
        &["backfill"],
    ];
    subs.iter().flat_map(|s| help_envs(&help(s))).collect()
}

fn outboxd_vars(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("OUTBOXD_") {
        let len = text[i..]
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(text.len() - i);
        // `OUTBOXD_*` in prose names the family, not a variable.
        if len > "OUTBOXD_".len() {
            out.insert(text[i..i + len].to_owned());
        }
    }
    out
}

/// Dockerfile instructions with `\` continuations joined.
fn docker_instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    out
}

#[test]
fn dockerfile_uses_only_existing_flags_and_variables() {
    let text = read("Dockerfile");
    let instrs = docker_instructions(&text);
    let exec_form = |kw: &str| -> Vec<String> {
        let line = instrs
            .iter()
            .rfind(|l| l.starts_with(&format!("{kw} ")))
            .unwrap_or_else(|| panic!("Dockerfile has no {kw}"));
        let json = line[kw.len()..].trim();
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{kw} must be exec form (a JSON array): {json}: {e}"))
    };
    let entry = exec_form("ENTRYPOINT");
    assert_eq!(entry, ["/usr/local/bin/outboxd"], "ENTRYPOINT");
    let cmd = exec_form("CMD");
    let sub = cmd.first().expect("CMD names a subcommand");
    assert!(!sub.starts_with('-'), "CMD must start with the subcommand: {cmd:?}");
    let sub_help = help(&[sub.as_str()]);
    let flags = help_flags(&sub_help);
    for a in cmd.iter().chain(&entry).filter(|a| a.starts_with("--")) {
        let flag = a.split('=').next().unwrap();
        assert!(flags.contains(flag), "Dockerfile passes {flag}, which `outboxd {sub}` lacks");
    }

    let known = all_envs();
    let mut set = BTreeSet::new();
    for l in instrs.iter().filter(|l| l.starts_with("ENV ")) {
        let body = l[4..].trim();
        if body.contains('=') {
            set.extend(body.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, _)| k.to_owned()));
        } else if let Some(k) = body.split_whitespace().next() {
            set.insert(k.to_owned());
        }
    }
    assert!(set.contains("OUTBOXD_METRICS_ADDR"), "the image should set OUTBOXD_METRICS_ADDR");
    let run_envs = help_envs(&sub_help);
    for k in set.iter().filter(|k| k.starts_with("OUTBOXD_")) {
        assert!(run_envs.contains(k), "Dockerfile sets {k}, which `outboxd {sub}` does not read");
    }
    for k in outboxd_vars(&text) {
        assert!(known.contains(&k), "Dockerfile mentions {k}, which outboxd does not read");
    }
    assert!(text.contains("EXPOSE 9464"), "the metrics port is not exposed");
    assert!(text.contains("HEALTHCHECK"), "no HEALTHCHECK");
}

#[test]
fn env_example_lists_every_variable_and_no_other() {
    let text = read("config/outboxd.env");
    let known = all_envs();
    assert!(known.contains("OUTBOXD_POSTGRES_URL"), "help parsing broke: {known:?}");
    // Set (`VAR=value`) or shown with its default (`# VAR=value`): either way, listed.
    let mut listed = BTreeSet::new();
    for l in text.lines().map(str::trim) {
        let shown = l.strip_prefix('#').map(str::trim_start);
        if let Some(k) = shown.and_then(|c| c.split_once('=')).map(|(k, _)| k).filter(|k| k.starts_with("OUTBOXD_")) {
            listed.insert(k.to_owned());
        }
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        assert!(!l.starts_with("export "), "outboxd.env: no `export` (docker --env-file): {l}");
        let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("outboxd.env: not VAR=value: {l}"));
        // clap rejects an empty value; an unset variable must be commented out.
        assert!(!v.trim().is_empty(), "outboxd.env: {k} is set to an empty value; comment it out");
        assert!(!v.starts_with('"') && !v.starts_with('\''), "outboxd.env: {k}: docker keeps quotes literally");
        listed.insert(k.to_owned());
    }
    for k in &known {
        assert!(listed.contains(k), "config/outboxd.env lacks {k}, which outboxd reads");
    }
    for k in outboxd_vars(&text) {
        assert!(known.contains(&k), "config/outboxd.env mentions {k}, which outboxd does not read");
    }
}

#[test]
fn systemd_unit_uses_existing_flags() {
    let text = read("config/outboxd.service");
    let exec = text.lines().find_map(|l| l.trim().strip_prefix("ExecStart=")).expect("ExecStart");
    let mut words = exec.split_whitespace().skip(1);
    let sub = words.next().expect("a subcommand");
    let flags = help_flags(&help(&[sub]));
    for w in words.filter(|w| w.starts_with("--")) {
        let flag = w.split('=').next().unwrap();
        assert!(flags.contains(flag), "outboxd.service passes {flag}, which `outboxd {sub}` lacks");
    }
}
