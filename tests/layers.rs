//! The layers point one way (issue 36): a lower module never names a higher one. Read from the
//! source text, so a new upward import fails here with the file and the line to move, before it
//! can grow into a circle. No services; reads files only.
//!
//! The floors checked, top to bottom: tools and sources, relay, sinks (with the dead-letter
//! record model under `sink/dead_letter/`), the HTTP endpoint (`serve.rs`) over the status page
//! over `health.rs`, config, format and the ground (`secret.rs`, `metrics/`, `error.rs`).
//! Comments are not imports and test modules may reach anywhere: both are skipped.

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir` (a file or a folder of `src/`).
fn files(dir: &Path) -> Vec<PathBuf> {
    if dir.is_file() {
        return vec![dir.to_owned()];
    }
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("tests.rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The code lines of `file` before its test module, with their numbers: comments left out.
fn code_lines(file: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(file).unwrap();
    text.lines()
        .enumerate()
        .take_while(|(_, l)| l.trim() != "#[cfg(test)]")
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_owned()))
        .collect()
}

/// Lines under `from` (a path inside `src/`) that name any of `banned`.
fn offences(from: &str, banned: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files(&src().join(from)) {
        for (n, line) in code_lines(&f) {
            if let Some(b) = banned.iter().find(|b| line.contains(**b)) {
                out.push(format!("src/{}:{n} names {b}: {}", f.strip_prefix(src()).unwrap().display(), line.trim()));
            }
        }
    }
    out
}

fn assert_none(what: &str, found: Vec<String>) {
    assert!(found.is_empty(), "{what}; move the shared part down instead:\n{}", found.join("\n"));
}

#[test]
fn sinks_never_reach_up_into_the_relay_the_sources_or_the_tools() {
    let up = ["crate::relay", "crate::tools", "crate::source", "crate::app"];
    assert_none("a sink names a module above the sinks", offences("sink", &up));
}

#[test]
fn health_and_the_status_page_never_name_the_server_that_serves_them() {
    let mut found = offences("health.rs", &["crate::status", "crate::serve"]);
    found.extend(offences("status", &["crate::serve"]));
    assert_none("health or status names a module above it", found);
}

#[test]
fn the_ground_floor_never_names_config_or_anything_above() {
    let up = ["crate::config", "crate::sink", "crate::relay", "crate::tools", "crate::status", "crate::serve"];
    let mut found = offences("format", &up);
    for ground in ["secret.rs", "metrics", "units.rs", "properties.rs", "debezium_offset.rs", "lineage.rs"] {
        found.extend(offences(ground, &up));
        found.extend(offences(ground, &["crate::pg", "crate::router"]));
    }
    assert_none("a ground-floor module names a module above it", found);
}

#[test]
fn every_metric_handle_is_made_in_the_metrics_folder() {
    let mut found = Vec::new();
    for from in ["sink", "relay", "source", "tools", "status", "pg", "router", "health.rs", "serve.rs", "app.rs"] {
        found.extend(offences(from, &["counter!(", "gauge!(", "histogram!("]));
    }
    assert_none("a metric handle is made outside src/metrics/ (its catalogue)", found);
}

/// The router's input is its own (`router::Table`, `router::Row`): it names neither PostgreSQL's
/// protocol nor anything above it, and `format/` encodes what it is handed without the router.
/// The sinks name nothing of PostgreSQL, and of `config/` only the validated `Config` they are
/// built from (the one import that points up, named in docs/src/layout.md).
#[test]
fn the_router_and_the_sinks_know_nothing_of_postgresql_and_the_sinks_only_the_config() {
    let up = ["crate::pg", "crate::config", "crate::sink", "crate::relay", "crate::source", "crate::tools"];
    let mut found = offences("router", &up);
    found.extend(offences("format", &["crate::router", "crate::pg"]));
    found.extend(offences("sink", &["crate::pg"]));
    found.extend(offences("sink", &["crate::config"]).into_iter().filter(|f| !f.contains("crate::config::Config")));
    assert_none("the router, format or a sink names a module it must not", found);
}
