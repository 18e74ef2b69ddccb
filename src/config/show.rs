//! The inverse of parsing: a validated [`Config`] as the `outboxd run` flags that rebuild it, for
//! `outboxd config`, one group after another. The flags only `outboxd poll` takes (`--poll-*`,
//! `--retention`) are printed under a heading of their own ([`Config::to_text`]).
//!
//! Invariant, held by the round-trip property test in `config::tests`: parsing [`Config::to_argv`]
//! again gives an equal `Config`. So every field a flag sets appears here, spelled so that clap
//! reads it back (a value starting with `-` as `--flag=value`). Secrets are the one exception: a
//! password written in the conninfo, secret librdkafka properties and sink URL secrets show as
//! `****`; a password, properties or a sink URL read from a file show as that file's flag.

use super::{postgres, Config};
use crate::router::contract::SchemaMissing;
use crate::router::{HeadersField, PlacementTarget};
use crate::units::{millis, value_name};

impl Config {
    /// `(flag without --, value)` pairs, in the order `outboxd config` prints them: one group
    /// after another.
    pub fn to_args(&self) -> Vec<(&'static str, String)> {
        let mut f: Vec<(&'static str, String)> = Vec::new();
        let mut push = |k: &'static str, v: String| f.push((k, v));
        self.show_source(&mut push);
        super::sinks::show(self, &mut push);
        self.show_route(&mut push);
        self.show_process(&mut push);
        super::sinks::show_delivery(self, &mut push);
        push("on-bad-event", value_name(self.on_bad_event));
        push("dlq-topic", self.dlq_topic.clone());
        if let Some(k) = self.dlq_sink {
            push("dlq-sink", value_name(k));
        }
        self.show_wal(&mut push);
        self.poll.show(&mut push);
        self.show_mask(&mut push);
        f
    }

    /// The connection and the outbox tables.
    fn show_source(&self, push: &mut dyn FnMut(&'static str, String)) {
        push("postgres-url", self.postgres.to_url_masked());
        if let Some(postgres::PasswordSource::File(p)) = &self.postgres.password_source {
            push("postgres-password-file", p.display().to_string());
        }
        push("slot", self.slot.clone());
        push("publication", self.publication.clone());
        for t in &self.tables {
            push("table", t.to_string());
        }
        if self.tables.is_empty() {
            push("table", String::new());
        }
        for p in &self.messages_prefixes {
            push("messages-prefix", p.clone());
        }
        push("publication-autocreate", value_name(self.publication_autocreate));
    }

    /// Routing, columns, converters and the schema registry, and the contracts.
    fn show_route(&self, push: &mut dyn FnMut(&'static str, String)) {
        let r = &self.route;
        push("route-by-field", r.route_by_field.clone());
        push("route-topic-regex", r.topic.regex_text().to_owned());
        push("route-topic-replacement", r.topic.replacement_text().to_owned());
        push("route-tombstone-on-empty-payload", r.tombstone_on_empty_payload.to_string());
        push("table-field-event-id", r.id_field.clone());
        push("table-field-event-key", r.key_field.clone());
        push("table-field-event-type", r.type_field.clone());
        push("table-field-event-payload", r.payload_field.clone());
        push("table-field-event-timestamp", r.timestamp_field.clone().unwrap_or_default());
        let placements: Vec<String> = r
            .placements
            .iter()
            .map(|p| match &p.target {
                PlacementTarget::Header(a) => format!("{}:header:{a}", p.column),
                PlacementTarget::Envelope(a) => format!("{}:envelope:{a}", p.column),
                PlacementTarget::Partition => format!("{}:partition", p.column),
            })
            .collect();
        // Left out means none; an empty value would be refused.
        if !placements.is_empty() {
            push("table-fields-additional-placement", placements.join(","));
        }
        push("table-field-additional-missing", value_name(r.additional_missing));
        push("time-precision-mode", value_name(r.mapping.time_precision));
        push("decimal-handling-mode", value_name(r.mapping.decimal));
        push("binary-handling-mode", value_name(r.mapping.binary));
        push("interval-handling-mode", value_name(r.mapping.interval));
        push("table-op-invalid-behavior", value_name(self.op_invalid));
        push("table-expand-json-payload", r.expand_json_payload.to_string());
        push("key-converter", value_name(r.key_converter));
        push("value-converter", value_name(r.value_converter));
        if let Some(u) = &self.otlp_endpoint {
            push("otlp-endpoint", super::secret::mask_url(u));
        }
        if let Some(reg) = &self.registry {
            push("schema-registry-url", super::secret::mask_url(reg.url.as_str()));
            if let Some(u) = &reg.user {
                push("schema-registry-user", u.clone());
            }
            // The password's file, never the password.
            if let Some(p) = &reg.password {
                push("schema-registry-password-file", p.path.display().to_string());
            }
            if let Some(c) = &reg.ca_file {
                push("schema-registry-ca-file", c.display().to_string());
            }
            push("subject-name-strategy", reg.strategy.flag().to_owned());
            push("schema-auto-register", reg.auto_register.to_string());
        }
        for (flag, field) in
            [("table-field-event-headers", &r.headers_field), ("tracing-span-context-field", &r.trace_field)]
        {
            match field {
                HeadersField::IfPresent(_) => {}
                HeadersField::Required(c) => push(flag, c.clone()),
                HeadersField::Disabled => push(flag, String::new()),
            }
        }
        if let Some(c) = &r.contracts {
            push("schema-dir", c.dir().display().to_string());
        }
        push("schema-missing", value_name(r.contracts.as_ref().map_or(SchemaMissing::Allow, |c| c.missing())));
    }

    /// The budgets and a long-running process's settings.
    fn show_process(&self, push: &mut dyn FnMut(&'static str, String)) {
        push("max-in-flight", self.max_in_flight.to_string());
        push("max-in-flight-bytes", self.max_in_flight_bytes.to_string());
        push("health-stall-timeout", millis(self.health_stall_timeout));
        push("status-interval", millis(self.status_interval));
        push("shutdown-timeout", millis(self.shutdown_timeout));
        push("wal-receiver-timeout", millis(self.wal_receiver_timeout));
        push("log-format", value_name(self.log_format));
        push("metrics-addr", self.metrics_addr.map_or("off".to_owned(), |a| a.to_string()));
        if let Some(t) = &self.status_page_token {
            push("status-page-token-file", t.path.display().to_string());
        }
        if !self.status_page_allowed_hosts.is_empty() {
            push("status-page-allowed-hosts", self.status_page_allowed_hosts.join(","));
        }
    }

    /// Heartbeats, the pacing of the replication loop, and the slot's options.
    fn show_wal(&self, push: &mut dyn FnMut(&'static str, String)) {
        push("heartbeat-interval", millis(self.heartbeat_interval));
        if let Some(q) = &self.heartbeat_action_query {
            push("heartbeat-action-query", q.clone());
        }
        push("lag-poll-interval", millis(self.lag_poll_interval));
        push("reconnect-max-backoff", millis(self.reconnect_max_backoff));
        push("standby-retry-interval", millis(self.standby_retry_interval));
        push("slot-failover", self.slot_failover.to_string());
        push("slot-recreate-after-loss", self.slot_recreate_after_loss.to_string());
        if let Some((path, _)) = &self.debezium_offsets {
            push("debezium-offsets", path.display().to_string());
        }
    }

    /// `--mask` and `--encrypt`, their key files by path: key bytes never print.
    fn show_mask(&self, push: &mut dyn FnMut(&'static str, String)) {
        let m = self.mask.spec();
        for r in &m.masks {
            push("mask", r.clone());
        }
        if let Some(p) = &m.mask_key_file {
            push("mask-key-file", p.display().to_string());
        }
        for r in &m.encrypt {
            push("encrypt", r.clone());
        }
        if let Some(p) = &m.encrypt_key_file {
            push("encrypt-key-file", p.display().to_string());
        }
        if let Some(re) = &m.event_type {
            push("mask-event-type", re.clone());
        }
    }

    /// The argv after `outboxd run` that rebuilds this configuration.
    pub fn to_argv(&self) -> Vec<String> {
        let mut argv = Vec::new();
        for (k, v) in self.to_args() {
            if v.starts_with('-') {
                // clap would take `-x` after `--flag` for a flag of its own.
                argv.push(format!("--{k}={v}"));
            } else {
                argv.push(format!("--{k}"));
                argv.push(v);
            }
        }
        argv
    }

    /// What `outboxd config` prints: `outboxd run` with one shell-quoted flag a line, then, after
    /// a blank line and a `# outboxd poll: …` heading, the flags only `outboxd poll` reads, in the
    /// same form.
    pub fn to_text(&self) -> String {
        let (poll, run): (Vec<_>, Vec<_>) = self.to_args().into_iter().partition(|(k, _)| poll_only(k));
        let run: Vec<String> = run.iter().map(|(k, v)| shell_flag(k, v)).collect();
        let poll: Vec<String> = poll.iter().map(|(k, v)| format!("  {}", shell_flag(k, v))).collect();
        format!("outboxd run \\\n  {}\n\n{POLL_HEADING}\n{}", run.join(" \\\n  "), poll.join(" \\\n"))
    }
}

/// The line above the poll flags in [`Config::to_text`].
pub const POLL_HEADING: &str =
    "# outboxd poll: the flags above but the slot, WAL and --delivery ones, and these (outboxd run does not take them):";

/// Flags that only `outboxd poll` reads.
fn poll_only(flag: &str) -> bool {
    flag.starts_with("poll-") || flag == "retention"
}

/// `--flag value`, quoted for a POSIX shell (`--flag=value` for a value starting with `-`).
fn shell_flag(k: &str, v: &str) -> String {
    if v.starts_with('-') {
        shell_quote(&format!("--{k}={v}"))
    } else {
        format!("--{k} {}", shell_quote(v))
    }
}

/// Single-quote for a POSIX shell when needed.
fn shell_quote(v: &str) -> String {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@".contains(&b)) {
        v.to_owned()
    } else {
        format!("'{}'", v.replace('\'', "'\\''"))
    }
}
