//! Two `outboxd run` on one slot: one streams, the other is a standby that takes over when the
//! first dies.
//!
//! * Under load, the waiting instance exports `outboxd_role{role="standby"} 1`, answers `/readyz`
//!   with 503 and a body saying "standby", and keeps running; the streaming one exports
//!   `outboxd_role{role="active"} 1`.
//! * kill -9 of the active instance: the standby takes over within `--standby-retry-interval`
//!   (default 5s) plus jitter and connection time; every event reaches Kafka (lost = 0). The
//!   takeover time and the duplicates are printed.
//! * The shipped alert rules (promtool test rules) do not fire `OutboxdNotConnected` for a
//!   standby, and still fire it for a disconnected active instance.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const TOPIC: &str = "standby.v1.events";

#[test]
fn standby_takes_over_after_kill9_under_load_and_loses_nothing() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let (port_a, port_b) = (free_port(), free_port());
    let addr = |p: u16| format!("127.0.0.1:{p}");
    let (addr_a, addr_b) = (addr(port_a), addr(port_b));
    let common = ["--status-interval", "200ms"];
    let mut a_args = common.to_vec();
    a_args.extend(["--metrics-addr", &addr_a]);
    let mut b_args = common.to_vec();
    b_args.extend(["--metrics-addr", &addr_b]);
    let mut active = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &a_args));
    let mut standby = Outboxd::spawn(&daemon_args(&pg, &broker, &b_args));
    assert!(
        standby.wait_for_log("standing by to take it over", Duration::from_secs(30)),
        "the second instance did not become a standby:\n{}",
        standby.log()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (events, stop) = (Numbered::new(&pg, "standby", 13), stop.clone());
        std::thread::spawn(move || {
            let mut next = 0;
            while !stop.load(Ordering::Relaxed) {
                assert!(events.insert(next, 10), "insert failed");
                next += 10;
                std::thread::sleep(Duration::from_millis(5));
            }
            next
        })
    };
    std::thread::sleep(Duration::from_secs(2));

    // Roles, readiness, and that the standby is still waiting.
    let metrics = |port| http_get(port, "/metrics").map(|(_, b)| b).unwrap_or_default();
    let role = |port, r: &str| metric(&metrics(port), &format!("outboxd_role{{role=\"{r}\"}}"));
    assert!(wait_until(Duration::from_secs(10), || role(port_a, "active") == Some(1.0)), "{}", metrics(port_a));
    assert_eq!(role(port_a, "standby"), Some(0.0));
    assert_eq!(role(port_b, "standby"), Some(1.0), "{}", metrics(port_b));
    assert_eq!(role(port_b, "active"), Some(0.0));
    let (code, body) = http_get(port_b, "/readyz").expect("standby answers /readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("standby"), "{body}");
    assert_eq!(http_get(port_a, "/readyz").map(|(c, _)| c), Some(200));
    assert!(standby.is_running() && !streaming_started(&standby.log()), "{}", standby.log());

    active.kill9();
    let killed = Instant::now();
    let took_over = standby.wait_for_streaming(Duration::from_secs(60));
    let takeover = killed.elapsed().as_secs_f64();
    assert!(took_over, "the standby never took over:\n{}", standby.log());
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().expect("writer");
    assert!(wait_until(Duration::from_secs(10), || role(port_b, "active") == Some(1.0)), "{}", metrics(port_b));
    assert_eq!(role(port_b, "standby"), Some(0.0));
    assert_eq!(http_get(port_b, "/readyz").map(|(c, _)| c), Some(200));

    let got = broker.consume_all(TOPIC, 1, written, Duration::from_secs(120));
    let count = count_by_id(&got);
    let ids: Vec<String> = pg.psql("SELECT event_id FROM outbox").lines().map(str::to_owned).collect();
    assert_eq!(ids.len(), written);
    let lost: Vec<&String> = ids.iter().filter(|id| !count.contains_key(*id)).collect();
    let duplicates: usize = count.values().map(|c| c - 1).sum();
    eprintln!(
        "standby figures: events {written}, lost {}, duplicates {duplicates}, records read {}, \
         kill-to-streaming {takeover:.2}s (--standby-retry-interval 5s, the default)",
        lost.len(),
        got.len()
    );
    assert!(lost.is_empty(), "{} events lost, e.g. {:?}\n{}", lost.len(), &lost[..lost.len().min(5)], standby.log());
    standby.stop_cleanly();
}

/// `promtool test rules` on the shipped alert file: a standby (not connected on purpose) raises
/// no `OutboxdNotConnected`; an active instance that lost PostgreSQL still does.
#[test]
fn alert_rules_spare_a_standby() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The shipped rules with their annotations left out: promtool compares annotations too, and
    // this test is about which alerts fire, not their wording.
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/prometheus-alerts.yml");
    let mut doc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&shipped).expect("read alert rules"))
            .expect("alert rules are YAML");
    for group in doc["groups"].as_sequence_mut().expect("groups") {
        for rule in group["rules"].as_sequence_mut().expect("rules") {
            rule.as_mapping_mut().expect("rule").remove("annotations");
        }
    }
    let rules = dir.path().join("alerts.yml");
    std::fs::write(&rules, serde_yaml::to_string(&doc).expect("yaml")).expect("write rules");
    let test = format!(
        r#"rule_files: ["{rules}"]
evaluation_interval: 30s
tests:
  - interval: 30s
    input_series:
      - series: 'outboxd_connected{{job="outboxd", instance="a:9464", component="postgres"}}'
        values: '1x20'
      - series: 'outboxd_role{{job="outboxd", instance="a:9464", role="active"}}'
        values: '1x20'
      - series: 'outboxd_connected{{job="outboxd", instance="b:9464", component="postgres"}}'
        values: '0x20'
      - series: 'outboxd_role{{job="outboxd", instance="b:9464", role="standby"}}'
        values: '1x20'
      - series: 'outboxd_role{{job="outboxd", instance="b:9464", role="active"}}'
        values: '0x20'
      - series: 'outboxd_connected{{job="outboxd", instance="c:9464", component="postgres"}}'
        values: '0x20'
      - series: 'outboxd_role{{job="outboxd", instance="c:9464", role="standby"}}'
        values: '0x20'
    alert_rule_test:
      - eval_time: 5m
        alertname: OutboxdNotConnected
        exp_alerts:
          - exp_labels:
              severity: critical
              job: outboxd
              instance: c:9464
              component: postgres
      - eval_time: 10m
        alertname: OutboxdNoActiveInstance
        exp_alerts: []
  - interval: 30s
    input_series:
      - series: 'outboxd_role{{job="outboxd", instance="b:9464", role="standby"}}'
        values: '1x20'
      - series: 'outboxd_role{{job="outboxd", instance="b:9464", role="active"}}'
        values: '0x20'
    alert_rule_test:
      - eval_time: 10m
        alertname: OutboxdNoActiveInstance
        exp_alerts:
          - exp_labels:
              severity: critical
              job: outboxd
"#,
        rules = rules.display()
    );
    let file = dir.path().join("standby-alerts.test.yml");
    std::fs::write(&file, test).expect("write promtool test");
    let out = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool is installed (Debian package prometheus)");
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
