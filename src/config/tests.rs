//! Config tests: validation messages, defaults, and the round trip through `outboxd config`.

use std::time::Duration;

use clap::Parser;

use super::validate::{check_identifier, parse_table};
use super::*;

#[test]
fn durations() {
    let d = |s| parse_duration("--x", s);
    assert_eq!(d("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(d("10s").unwrap(), Duration::from_secs(10));
    assert_eq!(d("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(d("7").unwrap(), Duration::from_secs(7));
    for s in ["", "s", "10x", "-1s", "1.5s"] {
        let e = d(s).unwrap_err().to_string();
        assert!(e.contains("--x") && e.contains("500ms"), "{e}");
    }
}

#[test]
fn table_and_identifiers() {
    assert_eq!(parse_table("public.outbox").unwrap().to_string(), "public.outbox");
    assert!(parse_table("outbox").is_err());
    assert!(check_identifier("--slot", "Bad-Slot", true).is_err());
    assert!(check_identifier("--slot", "outboxd_1", true).is_ok());
}

#[test]
fn cli_defaults_validate() {
    let cli = Cli::try_parse_from(["outboxd", "run", "--postgres-url", "postgres://u@127.0.0.1/db"]).unwrap();
    let Command::Run(a) = cli.command else { panic!("run") };
    let c = Config::from_args(&a).unwrap();
    assert_eq!(c.slot, "outboxd");
    assert_eq!(c.tables[0].to_string(), "public.outbox");
    assert_eq!(c.status_interval, Duration::from_secs(10));
    assert_eq!(c.max_in_flight, 10_000);
    assert_eq!(c.route.timestamp_field.as_deref(), Some("created_at"));
}

/// Debezium refuses an empty `table.fields.additional.placement`; so do we, while the flag left
/// out stays valid and means no placements.
#[test]
fn empty_placement_is_an_error_but_absent_is_none() {
    let parse = |extra: &[&str]| {
        let mut argv = vec!["outboxd", "run", "--postgres-url", "postgres://u@127.0.0.1/db"];
        argv.extend_from_slice(extra);
        let Command::Run(a) = Cli::try_parse_from(argv).unwrap().command else { panic!("run") };
        Config::from_args(&a)
    };
    assert!(parse(&[]).unwrap().route.placements.is_empty());
    let flag = "--table-fields-additional-placement";
    for bad in ["", " ", "a:header,,", "a:header,,b:header", ","] {
        let e = parse(&[flag, bad]).unwrap_err().to_string();
        assert!(e.contains(flag) && (e.contains("empty")), "{bad:?}: {e}");
    }
    assert_eq!(parse(&[flag, "a:header,b:envelope:x"]).unwrap().route.placements.len(), 2);
}

#[test]
fn kafka_property_conflicts_are_rejected() {
    let cli = Cli::try_parse_from([
        "outboxd",
        "run",
        "--postgres-url",
        "postgres://u@h/db",
        "--kafka-property",
        "bootstrap.servers=x:1",
    ])
    .unwrap();
    let Command::Run(a) = cli.command else { panic!("run") };
    assert!(Config::from_args(&a).unwrap_err().to_string().contains("--kafka-brokers"));
}

// ---------------------------------------------------------------------------------------------
// `outboxd config` round trip
// ---------------------------------------------------------------------------------------------

/// `outboxd config ARGV` (the flags of `run` and `poll`) as a Config, without a Debezium file.
fn config_of(argv: &[String]) -> Result<Config, String> {
    let mut full = vec!["outboxd".to_owned(), "config".to_owned()];
    full.extend_from_slice(argv);
    let cli = Cli::try_parse_from(&full).map_err(|e| e.to_string())?;
    let Command::Config(a) = cli.command else { unreachable!("config") };
    Config::from_args(&a).map_err(|e| e.to_string())
}

/// Words of a POSIX shell command as `outboxd config` prints it: backslash-newline continuations,
/// single quotes (with `'\''`), backslash escapes. Enough for what [`show`] emits.
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let (mut cur, mut in_word, mut quoted) = (String::new(), false, false);
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '\'') => quoted = false,
            (true, c) => cur.push(c),
            (false, '\'') => (quoted, in_word) = (true, true),
            (false, '\\') => match chars.next() {
                // A line continuation (only outside quotes; inside them it is literal).
                Some('\n') => {
                    if in_word {
                        words.push(std::mem::take(&mut cur));
                        in_word = false;
                    }
                }
                next => {
                    cur.extend(next);
                    in_word = true;
                }
            },
            (false, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (false, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// Assert that `outboxd config`'s output, as argv and as printed text, parses back to `c`.
fn assert_round_trip(c: &Config) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::{prop_assert, prop_assert_eq};
    let again = config_of(&c.to_argv()).map_err(proptest::test_runner::TestCaseError::fail)?;
    // Flags first: their diff names the field; PgTarget's Debug hides most of itself.
    prop_assert_eq!(again.to_args(), c.to_args());
    prop_assert_eq!(&again, c);
    let printed = c.to_text();
    // The run command, then the poll-only flags under their heading.
    let (run, poll) = printed.split_once(&format!("\n\n{}\n", super::show::POLL_HEADING)).expect("poll heading");
    let mut words = shell_words(run);
    prop_assert_eq!(&words[..2], &["outboxd".to_owned(), "run".to_owned()][..], "{}", printed);
    let poll_words = shell_words(poll);
    // Values never start with `-` (such a value is printed as `--flag=value`).
    let poll_flag = |w: &String| w.starts_with("--poll-") || w.starts_with("--retention");
    prop_assert!(poll_words.iter().filter(|w| w.starts_with('-')).all(poll_flag), "{}", printed);
    prop_assert!(!words.iter().any(poll_flag), "{}", printed);
    words.extend(poll_words);
    let from_text = config_of(&words[2..]).map_err(proptest::test_runner::TestCaseError::fail)?;
    prop_assert_eq!(&from_text, c, "{}", printed);
    Ok(())
}

mod gen {
    //! Valid `outboxd run` flag sets: each flag left out (its default) or given a value drawn
    //! from what the validator accepts, with the awkward spellings (quotes, spaces, leading
    //! dashes, non-ASCII, newlines) where a flag allows free text.
    use proptest::prelude::*;
    use proptest::sample::select;

    /// Free text: anything but NUL, sometimes starting with a dash.
    pub fn text(max: usize) -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::string::string_regex(&format!("[a-z][a-z0-9_.]{{0,{max}}}")).unwrap(),
            proptest::string::string_regex(&format!("[^\\x00]{{1,{max}}}")).unwrap(),
            proptest::string::string_regex(&format!("-[ -~]{{0,{max}}}")).unwrap(),
        ]
    }

    fn ident() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[a-z_][a-z0-9_]{0,12}").unwrap()
    }

    fn duration() -> impl Strategy<Value = String> {
        (1u64..5000, select(vec!["ms", "s", "m", "h", ""])).prop_map(|(n, u)| format!("{n}{u}"))
    }

    /// A conninfo with every part `outboxd config` must keep, and no password in it.
    fn postgres_url() -> impl Strategy<Value = String> {
        let enc = |s: &str| percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string();
        (
            ident(),
            select(vec!["127.0.0.1", "db.example.com", "[::1]", "h1:5433,h2"]),
            proptest::option::of(1000u16..65000),
            proptest::option::of("[^\\x00]{1,12}"),
            proptest::option::of("[^\\x00]{1,16}"),
            proptest::option::of(1u64..120),
            select(vec![None, Some("disable"), Some("allow"), Some("prefer"), Some("require")]),
            proptest::option::of("-c [a-z_]{1,10}=[0-9]{1,3}"),
            proptest::option::of((0u8..2, 1u64..100, 1u64..100, 1u64..10)),
            any::<bool>(),
            select(vec![None, Some("any"), Some("primary"), Some("read-write")]),
        )
            .prop_map(move |(user, host, port, db, app, timeout, ssl, options, keep, unix, attrs)| {
                let mut q = Vec::new();
                if let Some(a) = attrs {
                    q.push(format!("target_session_attrs={a}"));
                }
                let authority = if unix {
                    q.push(format!("host={}", enc("/run/pg sock")));
                    String::new()
                } else {
                    match port {
                        Some(p) if !host.contains(',') => format!("{host}:{p}"),
                        _ => host.to_owned(),
                    }
                };
                if let Some(a) = app {
                    q.push(format!("application_name={}", enc(&a)));
                }
                if let Some(t) = timeout {
                    q.push(format!("connect_timeout={t}"));
                }
                if let Some(s) = ssl {
                    q.push(format!("sslmode={s}"));
                }
                if let Some(o) = options {
                    q.push(format!("options={}", enc(&o)));
                }
                if let Some((on, idle, interval, count)) = keep {
                    q.push(format!(
                        "keepalives={on}&keepalives_idle={idle}&keepalives_interval={interval}&keepalives_count={count}"
                    ));
                }
                let db = db.map(|d| enc(&d)).unwrap_or_default();
                format!("postgres://{user}@{authority}/{db}?{}", q.join("&"))
            })
    }

    /// `(flag, values)`: each present flag with the value(s) to pass.
    /// `property_file` and `schema_dir` exist: flags naming them must validate.
    pub fn run_flags(property_file: String, schema_dir: String) -> impl Strategy<Value = Vec<String>> {
        let topic_rules = select(vec![
            ("(?<routedByValue>.*)", "${routedByValue}.events"),
            ("(?<routedByValue>.*)", "outbox.event.${routedByValue}"),
            (r"(?<agg>[a-z]+)\.(?<act>[a-z]+)\.(v\d+)", "${agg}-$3"),
            ("-?(.*)", "-$1"),
        ]);
        let placement = (ident(), select(vec!["header", "envelope", "partition"]), proptest::option::of(ident()))
            .prop_map(|(c, k, a)| match (k, a) {
                ("partition", _) | (_, None) => format!("{c}:{k}"),
                (_, Some(a)) => format!("{c}:{k}:{a}"),
            });
        let property =
            (select(vec!["linger.ms", "acks", "client.id", "compression.type", "message.timeout.ms"]), "[ -~]{0,10}")
                .prop_map(|(k, v)| format!("{k}={v}"));
        let group_a = (
            postgres_url(),
            proptest::option::of(ident()),
            proptest::option::of(text(40).prop_filter("publication: 1-63 bytes", |p| p.len() <= 63)),
            proptest::collection::vec(("[a-z_]{1,8}", "[a-zA-Z_ ]{1,8}"), 0..3),
            proptest::option::of(select(vec!["filtered", "disabled"])),
            proptest::option::of(select(vec!["kafka", "stdout", "null", "rabbitmq"])),
            proptest::option::of("[a-z0-9.:,]{1,30}"),
            proptest::collection::vec(property, 0..4),
            any::<bool>(),
            proptest::option::of((1i32..64, 1i32..5)),
        );
        let group_b = (
            proptest::option::of(topic_rules),
            proptest::option::of(any::<bool>()),
            proptest::option::of((ident(), ident(), ident(), ident())),
            proptest::option::of(prop_oneof![Just(String::new()), ident()]),
            proptest::option::of(proptest::collection::vec(placement, 1..4).prop_map(|v| v.join(","))),
            proptest::option::of(select(vec!["error", "ignore"])),
            proptest::option::of(select(vec!["warn", "error", "fatal"])),
            proptest::option::of(any::<bool>()),
            proptest::option::of(prop_oneof![Just(String::new()), ident()]),
            (any::<bool>(), proptest::collection::vec("[a-z][a-z0-9._-]{0,12}", 0..3)),
            (
                proptest::option::of(select(vec!["adaptive", "adaptive_time_microseconds", "connect", "isostring"])),
                proptest::option::of(select(vec!["precise", "double", "string"])),
                proptest::option::of(select(vec!["bytes", "base64", "base64-url-safe", "hex"])),
                proptest::option::of(select(vec!["numeric", "string"])),
            ),
        );
        let group_c = (
            proptest::option::of(1usize..1_000_000),
            proptest::collection::btree_map(
                select(vec![
                    "status-interval",
                    "shutdown-timeout",
                    "wal-receiver-timeout",
                    "heartbeat-interval",
                    "lag-poll-interval",
                    "reconnect-max-backoff",
                    "standby-retry-interval",
                ]),
                duration(),
                0..4,
            ),
            proptest::option::of(select(vec!["text", "json"])),
            proptest::option::of(select(vec!["off", "127.0.0.1:9464", "0.0.0.0:1", "[::1]:9000"])),
            proptest::option::of(select(vec!["fail", "dlq", "skip"])),
            proptest::option::of("[a-zA-Z0-9._-]{1,40}"),
            proptest::option::of(text(60)),
            proptest::option::of(select(vec!["allow", "reject"])),
            proptest::collection::vec(
                (
                    select(vec!["/card/number", "/items/*/card", "headers/email", "/a~1b", "/-x"]),
                    select(vec!["drop", "redact", "last4"]),
                ),
                0..3,
            ),
            proptest::option::of(select(vec![r"order\..*", "x|y"])),
            (proptest::option::of(any::<bool>()), proptest::option::of(any::<bool>())),
        );
        let group_d = (
            (
                proptest::option::of(select(vec![
                    "amqp://127.0.0.1:5672/%2f",
                    "amqps://app@mq.example:5671/prod?heartbeat=5",
                    "amqp://[::1]/vh%2Fx",
                ])),
                proptest::option::of(prop_oneof![
                    Just(String::new()),
                    "[a-zA-Z0-9._:-]{1,40}",
                    text(20).prop_filter("exchange: no control characters", |e| !e.contains(char::is_control)),
                ]),
            ),
            (
                proptest::option::of(1usize..100_000),
                proptest::option::of((10u64..5000).prop_map(|n| format!("{n}ms"))),
                proptest::option::of(1u32..100),
                proptest::option::of(select(vec!["1ms", "250ms", "3s", "10m"])),
                proptest::option::of(any::<bool>()),
                proptest::option::of(prop_oneof![Just(String::new()), ident()]),
                proptest::option::of(prop_oneof![Just("0".to_owned()), duration()]),
                proptest::option::of((ident(), ident(), ident(), ident(), text(20))),
            ),
            (
                proptest::option::of(select(vec![
                    "http://127.0.0.1:8080/in/${topic}",
                    "https://hooks.example.com/outbox?t=${topic}&x=1",
                    "http://[::1]:9/fixed",
                ])),
                any::<bool>(),
                proptest::option::of(
                    text(30).prop_filter("ce-source: no control characters", |s| !s.chars().any(char::is_control)),
                ),
                proptest::option::of(1usize..10_000),
                proptest::option::of(1usize..1024),
                proptest::option::of(duration()),
            ),
        );
        (group_a, group_b, group_c, group_d).prop_map(move |(a, b, c, d)| {
            let mut v: Vec<String> = Vec::new();
            let mut put = |k: &str, val: Option<String>| {
                if let Some(val) = val {
                    v.push(format!("--{k}={val}"));
                }
            };
            let (url, slot, publication, tables, autocreate, sink, brokers, props, file, topics) = a;
            let (rabbit, poll, (http_url, http_sink, source, http_batch, concurrency, timeout)) = d;
            let sink = if http_sink && http_url.is_some() { Some("http") } else { sink };
            put("postgres-url", Some(url));
            put("slot", slot);
            put("publication", publication);
            for (s, t) in tables {
                put("table", Some(format!("{s}.{t}")));
            }
            put("publication-autocreate", autocreate.map(String::from));
            put("sink", sink.map(String::from));
            put("kafka-brokers", brokers);
            for p in props {
                put("kafka-property", Some(p));
            }
            if file {
                put("kafka-property-file", Some(property_file.clone()));
            }
            if let Some((p, r)) = topics {
                put("topic-partitions", Some(p.to_string()));
                put("topic-replication-factor", Some(r.to_string()));
            }
            let (rule, tomb, fields, ts, placements, missing, invalid, expand, headers, (no_table, prefixes), mapping) =
                b;
            put("time-precision-mode", mapping.0.map(String::from));
            put("decimal-handling-mode", mapping.1.map(String::from));
            put("binary-handling-mode", mapping.2.map(String::from));
            put("interval-handling-mode", mapping.3.map(String::from));
            // `--table ''` (messages only) needs a prefix; with one, it is a valid set.
            if no_table && !prefixes.is_empty() {
                put("table", Some(String::new()));
            }
            for p in prefixes {
                put("messages-prefix", Some(p));
            }
            if let Some((re, rep)) = rule {
                put("route-topic-regex", Some(re.into()));
                put("route-topic-replacement", Some(rep.into()));
            }
            put("route-tombstone-on-empty-payload", tomb.map(|x| x.to_string()));
            if let Some((id, key, ty, payload)) = fields {
                put("table-field-event-id", Some(id));
                put("table-field-event-key", Some(key));
                put("table-field-event-type", Some(ty.clone()));
                put("route-by-field", Some(ty));
                put("table-field-event-payload", Some(payload));
            }
            put("table-field-event-timestamp", ts);
            put("table-fields-additional-placement", placements);
            put("table-field-additional-missing", missing.map(String::from));
            put("table-op-invalid-behavior", invalid.map(String::from));
            put("table-expand-json-payload", expand.map(|x| x.to_string()));
            put("table-field-event-headers", headers);
            let (in_flight, durations, log, metrics, bad, dlq, query, schema_missing, masks, mask_type, ha) = c;
            put("slot-failover", ha.0.map(|x| x.to_string()));
            put("slot-recreate-after-loss", ha.1.map(|x| x.to_string()));
            if !masks.is_empty() {
                put("mask-event-type", mask_type.map(String::from));
            }
            for (p, a) in masks {
                put("mask", Some(format!("{p}={a}")));
            }
            put("max-in-flight", in_flight.map(|x| x.to_string()));
            for (k, d) in durations {
                put(k, Some(d));
            }
            put("log-format", log.map(String::from));
            put("metrics-addr", metrics.map(String::from));
            put("on-bad-event", bad.map(String::from));
            put("dlq-topic", dlq);
            put("heartbeat-action-query", query);
            if let Some(m) = schema_missing {
                put("schema-dir", Some(schema_dir.clone()));
                put("schema-missing", Some(m.into()));
            }
            let (rabbitmq_url, rabbitmq_exchange) = rabbit;
            put("rabbitmq-url", rabbitmq_url.map(String::from));
            put("rabbitmq-exchange", rabbitmq_exchange);
            let (batch, interval, attempts, backoff, delete, channel, retention, columns) = poll;
            put("poll-batch", batch.map(|x| x.to_string()));
            put("poll-interval", interval);
            put("poll-max-attempts", attempts.map(|x| x.to_string()));
            put("poll-retry-backoff", backoff.map(String::from));
            put("poll-delete", delete.map(|x| x.to_string()));
            put("poll-channel", channel);
            put("retention", retention);
            if let Some((seq, published, tries, error, next)) = columns {
                put("poll-field-seq", Some(seq));
                put("poll-field-published-at", Some(published));
                put("poll-field-attempts", Some(tries));
                put("poll-field-error", Some(error));
                put("poll-field-next-attempt-at", Some(next));
            }
            put("http-url", http_url.map(String::from));
            put("http-source", source);
            put("http-batch", http_batch.map(|x| x.to_string()));
            put("http-concurrency", concurrency.map(|x| x.to_string()));
            put("http-timeout", timeout);
            v
        })
    }
}

/// For any valid flag set, the flags `outboxd config` prints rebuild the same configuration:
/// `to_args` is the hand-kept inverse of parsing, and this is what keeps it from drifting.
#[test]
fn outboxd_config_round_trips_for_any_valid_flags() {
    use proptest::test_runner::{Config as PtConfig, TestCaseError, TestRunner};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kafka.properties");
    std::fs::write(&file, "linger.ms = 7\nclient.id: from-file\nacks=all\n").unwrap();
    let schemas = dir.path().join("schemas");
    std::fs::create_dir(&schemas).unwrap();
    std::fs::write(schemas.join("order.paid.v1.json"), r#"{"type": "object"}"#).unwrap();
    let mut runner = TestRunner::new(PtConfig { cases: 400, failure_persistence: None, ..PtConfig::default() });
    let (valid, invalid) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    runner
        .run(&gen::run_flags(file.display().to_string(), schemas.display().to_string()), |argv| {
            // Status intervals of 0, an unreadable combination: the generator aims at valid flag
            // sets, and the few it misses say nothing about the round trip.
            let c = match config_of(&argv) {
                Ok(c) => c,
                Err(e)
                    if e.contains("must be greater than 0")
                        || e.contains("--kafka-brokers is empty")
                        || e.contains("must exceed twice --status-interval") =>
                {
                    invalid.set(invalid.get() + 1);
                    return Ok(());
                }
                Err(e) => return Err(TestCaseError::fail(format!("{argv:?} should be valid: {e}"))),
            };
            valid.set(valid.get() + 1);
            assert_round_trip(&c)
        })
        .unwrap();
    let (valid, invalid) = (valid.get(), invalid.get());
    assert!(valid > 300, "only {valid} valid flag sets ({invalid} invalid)");
}

/// The defaults alone, and a flag set with every awkward spelling at once.
#[test]
fn round_trip_examples() {
    let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let cases = [
        argv(&["--postgres-url", "postgres://u@127.0.0.1/db"]),
        argv(&[
            "--postgres-url",
            "host=/run/pg port=5433 user=u dbname=d application_name=relay connect_timeout=7 sslmode=disable",
            "--publication=-it's \"quoted\" é",
            "--table",
            "app.Out Box",
            "--table",
            "public.outbox",
            "--route-topic-regex=-?(.*)",
            "--route-topic-replacement=-$1",
            "--table-field-event-timestamp",
            "",
            "--table-field-event-headers",
            "",
            "--table-fields-additional-placement",
            "a:header, b:envelope:x ,c:partition",
            "--kafka-property",
            "client.id=a=b",
            "--kafka-property",
            "client.id=c",
            "--log-format",
            "json",
            "--metrics-addr",
            "off",
            "--heartbeat-action-query",
            "INSERT INTO hb VALUES ('x')\n-- done",
            "--sink",
            "stdout",
            "--kafka-brokers",
            "",
        ]),
    ];
    for a in cases {
        let c = config_of(&a).unwrap();
        assert_round_trip(&c).unwrap_or_else(|e| panic!("{a:?}: {e}"));
        let printed = c.to_text();
        for part in ["application_name=relay", "connect_timeout=7", "--log-format json", "--metrics-addr off"] {
            assert!(a.len() == 2 || printed.contains(part), "{part} missing from:\n{printed}");
        }
    }
}

/// Secrets are masked in `outboxd config`; everything else still round-trips.
#[test]
fn secrets_are_masked_and_the_rest_round_trips() {
    let a: Vec<String> = [
        "--postgres-url",
        "postgres://u:s3cret-pw@127.0.0.1/db?sslmode=disable",
        "--kafka-property",
        "sasl.password=k4fka-pw",
        "--kafka-property",
        "linger.ms=3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = config_of(&a).unwrap();
    let printed = c.to_text();
    assert!(!printed.contains("s3cret-pw") && !printed.contains("k4fka-pw"), "{printed}");
    assert!(printed.contains("u:****@") && printed.contains("sasl.password=****"), "{printed}");
    let mut again = config_of(&c.to_argv()).unwrap();
    assert_eq!(again.postgres.password.as_deref(), Some("****"));
    again.postgres.password = c.postgres.password.clone();
    again.kafka.properties[0].1 = "k4fka-pw".into();
    assert_eq!(again, c);
}

/// The Redis password is masked in `outboxd config`; the rest of the Redis flags round-trip.
#[test]
fn redis_password_is_masked_and_maxlen_round_trips() {
    let a: Vec<String> = [
        "--postgres-url",
        "postgres://u@127.0.0.1/db",
        "--sink",
        "redis",
        "--redis-url",
        "rediss://app:r3dis-pw@cache:6380/2",
        "--redis-maxlen",
        "5000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = config_of(&a).unwrap();
    let printed = c.to_text();
    assert!(!printed.contains("r3dis-pw"), "{printed}");
    assert!(printed.contains("rediss://app:****@cache:6380/2") && printed.contains("5000"), "{printed}");
    let mut again = config_of(&c.to_argv()).unwrap();
    again.redis.url = c.redis.url.clone();
    assert_eq!(again, c);
    let zero = config_of(&[&a[..7], &["0".to_string()][..]].concat()).unwrap_err().to_string();
    assert!(zero.contains("--redis-maxlen 0 would trim"), "{zero}");
}

/// `--dlq-sink` round-trips; the same sink as `--sink` is no second sink; one whose dead letters
/// cannot be read back is refused, and its URL is checked like `--sink`'s.
#[test]
fn dlq_sink_round_trips_and_must_be_readable() {
    let base = ["--postgres-url", "postgres://u@127.0.0.1/db", "--sink", "http", "--http-url", "https://h/in/${topic}"];
    let with = |extra: &[&str]| config_of(&base.iter().chain(extra).map(|s| s.to_string()).collect::<Vec<_>>());
    let c = with(&["--dlq-sink", "redis"]).unwrap();
    assert_eq!(c.dlq_sink, Some(SinkKind::Redis));
    assert!(c.to_text().contains("--dlq-sink redis"), "{}", c.to_text());
    assert_eq!(config_of(&c.to_argv()).unwrap().dlq_sink, Some(SinkKind::Redis));
    assert_eq!(with(&["--dlq-sink", "http"]).unwrap().dlq_sink, None, "the same sink is no second one");
    let e = with(&["--dlq-sink", "stdout"]).unwrap_err().to_string();
    assert!(e.contains("--dlq-sink stdout") && e.contains("kafka, nats, redis, rabbitmq, sqs, sns or kinesis"), "{e}");
    let e = with(&["--dlq-sink", "redis", "--redis-url", "http://u:hunter2@h"]).unwrap_err().to_string();
    assert!(e.contains("--redis-url") && !e.contains("hunter2"), "{e}");
}

/// The RabbitMQ password is masked in `outboxd config`; the exchange round-trips; bad values are
/// one-line errors naming the flag.
#[test]
fn rabbitmq_password_is_masked_and_exchange_round_trips() {
    let a: Vec<String> = [
        "--postgres-url",
        "postgres://u@127.0.0.1/db",
        "--sink",
        "rabbitmq",
        "--rabbitmq-url",
        "amqps://app:r4bbit-pw@mq:5671/prod",
        "--rabbitmq-exchange",
        "outbox.events",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = config_of(&a).unwrap();
    let printed = c.to_text();
    assert!(!printed.contains("r4bbit-pw") && !format!("{c:?}").contains("r4bbit-pw"), "{printed}");
    assert!(printed.contains("amqps://app:****@mq:5671/prod") && printed.contains("outbox.events"), "{printed}");
    let mut again = config_of(&c.to_argv()).unwrap();
    again.rabbitmq.url = c.rabbitmq.url.clone();
    assert_eq!(again, c);
    let bad_url = config_of(&[&a[..5], &["redis://u:r4bbit-pw@h".to_string()][..]].concat()).unwrap_err().to_string();
    assert!(bad_url.contains("--rabbitmq-url") && !bad_url.contains("r4bbit-pw"), "{bad_url}");
}

/// The webhook's credentials (URL userinfo, signing secret) never show in `outboxd config`; the
/// URL prints masked, the secret as its file's path, and the rest round-trips.
#[test]
fn http_credentials_are_masked_and_the_rest_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("hook.secret");
    std::fs::write(&secret, "whsec-0123456789abcdef\n").unwrap();
    let a: Vec<String> = [
        "--postgres-url",
        "postgres://u@127.0.0.1/db",
        "--sink",
        "http",
        "--http-url",
        "https://hook:h77p-pw@hooks.example.com/in/${topic}",
        "--http-signing-secret-file",
        secret.to_str().unwrap(),
        "--http-batch",
        "50",
        "--slot",
        "orders",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = config_of(&a).unwrap();
    let printed = c.to_text();
    assert!(!printed.contains("h77p-pw") && !printed.contains("whsec"), "{printed}");
    assert!(printed.contains("https://hook:****@hooks.example.com/in/${topic}"), "{printed}");
    assert!(
        printed.contains(secret.to_str().unwrap()) && printed.contains("--http-source outboxd/orders"),
        "{printed}"
    );
    assert!(!format!("{c:?}").contains("h77p-pw") && !format!("{c:?}").contains("whsec"));
    let mut again = config_of(&c.to_argv()).unwrap();
    assert_eq!(again.http.basic_auth, Some(("hook".into(), Some("****".into()))));
    again.http.url = c.http.url.clone();
    again.http.basic_auth = c.http.basic_auth.clone();
    assert_eq!(again, c);
    let e = config_of(&a[..4]).unwrap_err();
    assert!(e.contains("--http-url is required with --sink http"), "{e}");
}

/// Properties from a Debezium file apply before `--kafka-property-file`, but printed flags apply
/// after it; `outboxd config` must not let a Debezium value it printed override the file.
#[test]
fn debezium_properties_overridden_by_the_property_file_stay_overridden() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kafka.properties");
    std::fs::write(&file, "client.id=from-file\n").unwrap();
    let dbz = dir.path().join("connector.json");
    std::fs::write(
        &dbz,
        r#"{"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "database.hostname": "127.0.0.1", "database.user": "u", "database.dbname": "d",
            "plugin.name": "pgoutput",
            "producer.override.client.id": "from-debezium", "producer.override.linger.ms": "9"}"#,
    )
    .unwrap();
    let argv = ["outboxd", "run", "--debezium-config", dbz.to_str().unwrap(), "--kafka-property-file"];
    let mut argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    argv.push(file.display().to_string());
    let Command::Run(a) = Cli::try_parse_from(&argv).unwrap().command else { unreachable!() };
    let c = Config::from_args_with_file(&a, &|id| id == "kafka_property_file").unwrap();
    let effective = |c: &Config| {
        let mut m = std::collections::BTreeMap::new();
        for (k, v) in &c.kafka.properties {
            m.insert(k.clone(), v.clone());
        }
        m
    };
    assert_eq!(effective(&c).get("client.id").map(String::as_str), Some("from-file"));
    let again = config_of(&c.to_argv()).unwrap();
    assert_eq!(effective(&again), effective(&c), "{:?}", c.to_text());
    assert!(!c.to_text().contains("from-debezium"));
}

/// Every flag of `outboxd config` (those of `run` and `poll`) is printed by it (those printed only
/// when set are listed), so a new flag cannot be forgotten in `show.rs`. Give the generator above
/// a strategy for it too.
#[test]
fn outboxd_config_prints_every_run_flag() {
    use clap::CommandFactory;
    const ONLY_WHEN_SET: &[&str] = &[
        "debezium-config", // merged into the other flags
        "debezium-offsets",
        "postgres-password-file",
        "kafka-property",
        "kafka-property-file",
        "table-fields-additional-placement",
        "table-field-event-headers",
        "tracing-span-context-field",
        "otlp-endpoint",
        "status-page-token-file",
        "status-page-allowed-hosts",
        "heartbeat-action-query",
        "schema-dir",
        "mask",
        "mask-key-file",
        "encrypt",
        "encrypt-key-file",
        "mask-event-type",
        "nats-creds",
        "nats-create-stream",
        "redis-maxlen",
        "dlq-sink",
        "messages-prefix",
        "http-url",
        "http-signing-secret-file",
        // shown instead of the URL flag, when given
        "nats-url-file",
        "redis-url-file",
        "rabbitmq-url-file",
        "http-url-file",
        // with a registry converter only
        "subject-name-strategy",
        "schema-auto-register",
        "schema-registry-url",
        "schema-registry-user",
        "schema-registry-password-file",
        "schema-registry-ca-file",
        // AWS sinks: shown when set (the region, endpoint and profile default to the SDK's chain)
        "aws-region",
        "aws-endpoint-url",
        "aws-profile",
        "sqs-queue-url",
        "sqs-dlq-queue-url",
        "sns-topic-arn",
        "sns-dlq-queue-url",
        "kinesis-stream",
        "kinesis-dlq-stream",
        // with --delivery exactly-once only
        "transaction-interval",
        "position-topic",
    ];
    let cli = Cli::command();
    let run = cli.find_subcommand("config").expect("config subcommand");
    let c = config_of(&["--postgres-url".into(), "postgres://u@127.0.0.1/db".into()]).unwrap();
    let args = c.to_args();
    let printed: Vec<&str> = args.iter().map(|(k, _)| *k).collect();
    for arg in run.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" || ONLY_WHEN_SET.contains(&long) {
            continue;
        }
        assert!(printed.contains(&long), "--{long} is missing from Config::to_args (config/show.rs)");
    }
}

/// Mask and encrypt flags round-trip; key files print as paths, never as their bytes.
#[test]
fn mask_flags_round_trip_and_print_key_files_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let hash = dir.path().join("hash.key");
    std::fs::write(&hash, "hmac-key-material-0123456789\n").unwrap();
    let ring = dir.path().join("ring.json");
    std::fs::write(&ring, r#"{"keys":[{"kid":"k1","key":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI="}]}"#).unwrap();
    let a: Vec<String> = [
        "--postgres-url",
        "postgres://u@127.0.0.1/db",
        "--mask",
        "/card/number=last4",
        "--mask",
        "headers/email=hash",
        "--mask-key-file",
        hash.to_str().unwrap(),
        "--encrypt",
        "/customer/*/ssn",
        "--encrypt-key-file",
        ring.to_str().unwrap(),
        "--mask-event-type",
        r"order\..*",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = config_of(&a).unwrap();
    assert_round_trip(&c).unwrap();
    let printed = c.to_text();
    for part in ["--mask /card/number=last4", "--mask headers/email=hash", "--encrypt '/customer/*/ssn'"] {
        assert!(printed.contains(part), "{part} missing from:\n{printed}");
    }
    assert!(printed.contains(hash.to_str().unwrap()) && printed.contains(ring.to_str().unwrap()), "{printed}");
    assert!(!printed.contains("hmac-key") && !printed.contains("c2VjcmV0"), "{printed}");
    assert!(!format!("{c:?}").contains("c2VjcmV0"), "Debug shows no key");
    // A bad rule is a one-line config error naming the flag.
    let mut bad = a[..2].to_vec();
    bad.extend(["--mask".to_owned(), "/x=hash".to_owned()]);
    let e = config_of(&bad).unwrap_err();
    assert!(e.contains("--mask-key-file") && !e.contains('\n'), "{e}");
}

#[test]
fn sizes() {
    let z = |s| parse_size("--x", s);
    assert_eq!(z("64MiB").unwrap(), 64 << 20);
    assert_eq!(z("512 KiB").unwrap(), 512 << 10);
    assert_eq!(z("1GB").unwrap(), 1_000_000_000);
    assert_eq!(z("1000").unwrap(), 1000);
    for bad in ["", "MiB", "-1", "1.5MiB", "12parsecs", "99999999999999999999GiB"] {
        let e = z(bad).unwrap_err().to_string();
        assert!(e.contains("--x") && e.contains("64MiB"), "{bad}: {e}");
    }
}

#[test]
fn health_stall_timeout_must_outlast_the_status_timer() {
    let parse = |extra: &[&str]| {
        let mut argv = vec!["outboxd", "run", "--postgres-url", "postgres://u@h/db"];
        argv.extend_from_slice(extra);
        let Command::Run(a) = Cli::try_parse_from(argv).unwrap().command else { panic!("run") };
        Config::from_args(&a)
    };
    assert_eq!(parse(&[]).unwrap().health_stall_timeout, Duration::from_secs(120));
    assert!(parse(&["--health-stall-timeout", "0"]).unwrap().health_stall_timeout.is_zero());
    assert!(parse(&["--health-stall-timeout", "3s", "--status-interval", "1s"]).is_ok());
    let e = parse(&["--health-stall-timeout", "15s"]).unwrap_err().to_string();
    assert!(e.contains("--health-stall-timeout") && e.contains("--status-interval"), "{e}");
}

/// `--schema-dir` is compiled while validating: an unreadable directory or a broken schema stops
/// `run` and `outboxd config` with one line naming it; a good one round-trips.
#[test]
fn schema_dir_is_validated_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let argv = |extra: &[&str]| {
        let mut v = vec!["--postgres-url".to_owned(), "postgres://u@127.0.0.1/db".to_owned()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let path = dir.path().display().to_string();
    std::fs::write(dir.path().join("order.paid.v1.json"), r#"{"required": ["id"]}"#).unwrap();
    let c = config_of(&argv(&["--schema-dir", &path, "--schema-missing", "reject"])).unwrap();
    let contracts = c.route.contracts.as_ref().unwrap();
    assert_eq!((contracts.len(), contracts.missing()), (1, crate::router::contract::SchemaMissing::Reject));
    assert_round_trip(&c).unwrap();
    let printed = c.to_text();
    assert!(printed.contains(&format!("--schema-dir {path}")) && printed.contains("--schema-missing reject"));
    // Without the flag: nothing compiled, and `allow` printed.
    let c = config_of(&argv(&[])).unwrap();
    assert!(c.route.contracts.is_none() && c.to_text().contains("--schema-missing allow"));
    let e = config_of(&argv(&["--schema-missing", "reject"])).unwrap_err();
    assert!(e.contains("--schema-missing reject needs --schema-dir"), "{e}");
    let e = config_of(&argv(&["--schema-dir", "/nonexistent/schemas"])).unwrap_err();
    assert!(e.starts_with("--schema-dir /nonexistent/schemas: cannot read it"), "{e}");
    std::fs::write(dir.path().join("order.created.v1.json"), r#"{"type": "objekt"}"#).unwrap();
    let e = config_of(&argv(&["--schema-dir", &path])).unwrap_err();
    assert!(e.contains("order.created.v1.json: not a valid draft 2020-12 schema at /type"), "{e}");
}

#[test]
fn durations_past_a_year_are_refused_not_overflowed() {
    assert!(parse_duration("--x", "8784h").is_ok());
    for s in ["8785h", "99999999999999h", "18446744073709551615s", "18446744073709551615ms"] {
        let e = parse_duration("--shutdown-timeout", s).unwrap_err().to_string();
        assert!(e.contains("--shutdown-timeout"), "{s}: {e}");
    }
}

/// Debezium's `slot.failover` turns on `--slot-failover`; the flag, given explicitly, wins.
#[test]
fn debezium_slot_failover_sets_the_flag_unless_given() {
    let dir = tempfile::tempdir().unwrap();
    let dbz = dir.path().join("connector.json");
    std::fs::write(
        &dbz,
        r#"{"database.hostname": "127.0.0.1", "database.user": "u", "database.dbname": "d",
            "plugin.name": "pgoutput", "slot.failover": "true"}"#,
    )
    .unwrap();
    let parse = |extra: &[&str]| {
        let mut argv: Vec<String> =
            ["outboxd", "run", "--debezium-config", dbz.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
        argv.extend(extra.iter().map(|s| s.to_string()));
        let Command::Run(a) = Cli::try_parse_from(&argv).unwrap().command else { unreachable!() };
        let explicit = !extra.is_empty();
        Config::from_args_with_file(&a, &|id| explicit && id == "slot_failover").unwrap()
    };
    assert!(parse(&[]).slot_failover);
    assert!(!parse(&["--slot-failover=false"]).slot_failover);
    let c = parse(&[]);
    assert!(config_of(&c.to_argv()).unwrap().slot_failover, "{:?}", c.to_text());
}

#[test]
fn a_json_envelope_is_taken_alone_and_refused_with_expansion_or_masking() {
    let dir = tempfile::tempdir().unwrap();
    let hash = dir.path().join("hash.key");
    std::fs::write(&hash, "hmac-key-material-0123456789\n").unwrap();
    let with = |extra: &[&str]| {
        let mut a: Vec<String> = ["--postgres-url", "postgres://u@127.0.0.1/db", "--value-converter", "json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--table-fields-additional-placement".to_owned(), "event_type:envelope:type".to_owned()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        config_of(&a)
    };
    assert!(with(&[]).is_ok(), "{:?}", with(&[]).err());
    let e = with(&["--table-expand-json-payload"]).unwrap_err();
    assert!(e.contains("--table-expand-json-payload") && !e.contains('\n'), "{e}");
    let e = with(&["--mask", "/card=hash", "--mask-key-file", hash.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("--mask/--encrypt") && !e.contains('\n'), "{e}");
}

/// A variable that can carry a credential (a URL with `user:password@`, a password, a secret) never
/// shows its value in `--help`, in any subcommand: `hide_env_values` on each, checked from clap's
/// own definitions so a new flag or a flag repeated in another subcommand cannot forget it (the
/// Redis URL of `run` once did).
#[test]
fn help_never_shows_the_value_of_a_credential_variable() {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, path: &str, bad: &mut Vec<String>, seen: &mut usize) {
        for a in cmd.get_arguments() {
            let Some(env) = a.get_env().and_then(|e| e.to_str()) else { continue };
            let secret = ["URL", "PASSWORD", "SECRET", "TOKEN"].iter().any(|w| env.contains(w));
            if secret && !env.ends_with("_FILE") {
                *seen += 1;
                if !a.is_hide_env_values_set() {
                    bad.push(format!("{path} --{} ({env})", a.get_id()));
                }
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), bad, seen);
        }
    }
    let (mut bad, mut seen) = (Vec::new(), 0);
    walk(&Cli::command(), "outboxd", &mut bad, &mut seen);
    assert!(seen >= 10, "the walk found only {seen} credential variables");
    assert!(bad.is_empty(), "--help would show these variables' values: {bad:?}");
}

/// `--delivery exactly-once` needs Kafka transactions: any other sink, or dead letters through
/// another sink (they must share the events' transaction), is refused at start with the fix named.
#[test]
fn exactly_once_needs_kafka_and_one_sink() {
    let cfg = |extra: &[&str]| {
        let mut argv = vec!["outboxd", "run", "--postgres-url", "postgres://u@127.0.0.1/db"];
        argv.extend(extra);
        let Command::Run(a) = Cli::try_parse_from(argv).unwrap().command else { panic!("run") };
        Config::from_args(&a)
    };
    assert_eq!(cfg(&[]).unwrap().delivery, DeliveryMode::AtLeastOnce);
    assert_eq!(cfg(&["--delivery", "exactly-once"]).unwrap().delivery, DeliveryMode::ExactlyOnce);
    let e = cfg(&["--delivery", "exactly-once", "--sink", "nats"]).unwrap_err().to_string();
    assert!(e.contains("--sink kafka") && e.contains("nats"), "{e}");
    let e = cfg(&["--delivery", "exactly-once", "--dlq-sink", "redis"]).unwrap_err().to_string();
    assert!(e.contains("drop --dlq-sink"), "{e}");
    assert!(cfg(&["--delivery", "exactly-once"]).unwrap().to_text().contains("--delivery exactly-once"));
}

/// `--value-converter avro` and `--schema-registry-*`: each wrong combination is a one-line error
/// naming the flag and the fix; a good one prints the password's file, never the password, and
/// reads back to the same configuration.
#[test]
fn schema_registry_flags_are_checked_and_print_without_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("registry.pw");
    std::fs::write(&pw, "hunter2-registry\n").unwrap();
    let with = |extra: &[&str]| {
        let mut a: Vec<String> = vec!["--postgres-url".into(), "postgres://u@127.0.0.1/db".into()];
        a.extend(extra.iter().map(|s| s.to_string()));
        config_of(&a)
    };
    for (extra, says) in [
        (&["--value-converter", "avro"][..], "need --schema-registry-url"),
        (
            &["--schema-registry-url", "http://r:8081"][..],
            "has no effect without --value-converter (or --key-converter) avro, json-schema or protobuf",
        ),
        (&["--value-converter", "json-schema"][..], "need --schema-registry-url"),
        (&["--value-format", "avro", "--schema-registry-url", "http://u:p@r:8081"][..], "credentials in the URL"),
        (&["--value-format", "avro", "--schema-registry-url", "ftp://r"][..], "http:// or https://"),
        (&["--key-converter", "avro"][..], "need --schema-registry-url"),
        (&["--key-format", "protobuf", "--schema-registry-url", "http://r:8081"][..], "--key-converter protobuf"),
        (&["--schema-auto-register"][..], "--schema-auto-register has no effect"),
        (&["--subject-name-strategy", "record"][..], "--subject-name-strategy record has no effect"),
        (
            &["--key-format", "avro", "--schema-registry-url", "http://r:8081", "--subject-name-strategy", "record"][..],
            "keys use <topic>-key",
        ),
        (
            &[
                "--value-format",
                "avro",
                "--schema-registry-url",
                "http://r:8081",
                "--schema-registry-password-file",
                pw.to_str().unwrap(),
            ][..],
            "needs --schema-registry-user",
        ),
    ] {
        let e = with(extra).unwrap_err();
        assert!(e.contains(says) && !e.contains('\n'), "{extra:?}: {e}");
        assert!(!e.contains(":p@"), "{e}");
    }
    let good = [
        "--value-format",
        "avro",
        "--schema-registry-url",
        "https://registry:8081/apis/ccompat/v7",
        "--schema-registry-user",
        "outboxd",
        "--schema-registry-password-file",
        pw.to_str().unwrap(),
    ];
    let c = with(&good).unwrap();
    let text = c.to_text();
    assert!(text.contains("schema-registry-password-file") && !text.contains("hunter2"), "{text}");
    assert!(!format!("{c:?}").contains("hunter2"));
    assert_eq!(c.registry.as_ref().and_then(|r| r.password.as_ref()).map(|p| p.expose()), Some("hunter2-registry"));
    // Keys through the registry, file schemas registered under record names.
    let c = with(&[
        "--key-format",
        "avro",
        "--value-format",
        "protobuf",
        "--schema-registry-url",
        "http://r:8081",
        "--subject-name-strategy",
        "topic-record",
        "--schema-auto-register",
        "--schema-dir",
        dir.path().to_str().unwrap(),
    ])
    .unwrap();
    let r = c.registry.as_ref().unwrap();
    assert_eq!((r.key, r.value), (Some(crate::format::Format::Avro), Some(crate::format::Format::Protobuf)));
    assert_eq!((r.strategy, r.auto_register), (crate::format::SubjectStrategy::TopicRecord, true));
    assert_eq!(r.schema_dir.as_deref(), Some(dir.path()));
    let text = c.to_text();
    assert!(
        text.contains("--subject-name-strategy topic-record") && text.contains("--schema-auto-register true"),
        "{text}"
    );
}

/// `run --debezium-config FILE` with a JSON object of `body`'s keys: the configuration or its error.
fn debezium_config(body: &str) -> Result<Config, String> {
    let dir = tempfile::tempdir().unwrap();
    let dbz = dir.path().join("connector.json");
    std::fs::write(&dbz, format!("{{{body}}}")).unwrap();
    let argv: Vec<String> =
        ["outboxd", "run", "--debezium-config", dbz.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
    let Command::Run(a) = Cli::try_parse_from(&argv).unwrap().command else { unreachable!() };
    Config::from_args_with_file(&a, &|_| false).map_err(|e| e.to_string())
}

/// Debezium's AvroConverter (Confluent's, or Apicurio's with its native API URL) maps to
/// `--value-converter avro` with the registry's Confluent-compatible root.
#[test]
fn debezium_avro_converters_map_to_the_registry_flags() {
    let parse = |extra: &str| {
        debezium_config(&format!(
            r#""database.hostname": "127.0.0.1", "database.user": "u", "database.dbname": "d",
               "plugin.name": "pgoutput", "key.converter": "org.apache.kafka.connect.storage.StringConverter", {extra}"#
        ))
    };
    let c = parse(r#""value.converter": "io.confluent.connect.avro.AvroConverter", "value.converter.schema.registry.url": "http://sr:8081""#)
        .unwrap();
    assert_eq!(c.route.value_converter, crate::router::Converter::Avro);
    assert_eq!(c.registry.as_ref().unwrap().url.as_str(), "http://sr:8081/");
    let c = parse(
        r#""value.converter": "io.apicurio.registry.utils.converter.AvroConverter", "value.converter.apicurio.registry.url": "http://ap:8080/apis/registry/v2""#,
    )
    .unwrap();
    assert_eq!(c.registry.as_ref().unwrap().url.as_str(), "http://ap:8080/apis/ccompat/v7");
    let c = parse(r#""value.converter": "io.confluent.connect.protobuf.ProtobufConverter", "value.converter.schema.registry.url": "http://sr:8081""#)
        .unwrap();
    assert_eq!(c.route.value_converter, crate::router::Converter::Protobuf);
    assert_eq!(c.registry.as_ref().unwrap().value, Some(crate::format::Format::Protobuf));
    let c = parse(r#""value.converter": "io.confluent.connect.json.JsonSchemaConverter", "value.converter.schema.registry.url": "http://sr:8081""#)
        .unwrap();
    assert_eq!(c.route.value_converter, crate::router::Converter::JsonSchema);
    let e = parse(r#""value.converter": "io.confluent.connect.avro.AvroConverter""#).unwrap_err();
    assert!(e.contains("value.converter.schema.registry.url"), "{e}");
    // Keys, registration and the subject strategy.
    let c = parse(
        r#""value.converter": "io.confluent.connect.avro.AvroConverter", "value.converter.schema.registry.url": "http://sr:8081",
           "value.converter.auto.register.schemas": "true",
           "value.converter.value.subject.name.strategy": "io.confluent.kafka.serializers.subject.RecordNameStrategy""#,
    )
    .unwrap();
    let r = c.registry.as_ref().unwrap();
    assert_eq!((r.strategy, r.auto_register, r.key), (crate::format::SubjectStrategy::Record, true, None));
    let e = parse(
        r#""value.converter": "io.confluent.connect.avro.AvroConverter", "value.converter.schema.registry.url": "http://sr:8081",
           "value.converter.value.subject.name.strategy": "com.example.Mine""#,
    )
    .unwrap_err();
    assert!(e.contains("TopicNameStrategy"), "{e}");
}

/// Debezium's registry key converters map to `--key-converter avro|json-schema` on the same registry.
#[test]
fn debezium_registry_key_converters_map_to_the_key_flags() {
    let parse = |body: &str| {
        debezium_config(&format!(
            r#""database.hostname": "127.0.0.1", "database.user": "u", "database.dbname": "d", "plugin.name": "pgoutput", {body}"#
        ))
    };
    let c = parse(
        r#""key.converter": "io.confluent.connect.json.JsonSchemaConverter", "key.converter.schema.registry.url": "http://sr:8081",
           "value.converter": "io.confluent.connect.avro.AvroConverter", "value.converter.schema.registry.url": "http://sr:8081""#,
    )
    .unwrap();
    assert_eq!(c.route.key_converter, crate::router::Converter::JsonSchema);
    let r = c.registry.as_ref().unwrap();
    assert_eq!((r.key, r.value), (Some(crate::format::Format::JsonSchema), Some(crate::format::Format::Avro)));
    let e = parse(
        r#""key.converter": "io.confluent.connect.avro.AvroConverter", "key.converter.schema.registry.url": "http://a:8081",
           "value.converter": "io.confluent.connect.avro.AvroConverter", "value.converter.schema.registry.url": "http://b:8081""#,
    )
    .unwrap_err();
    assert!(e.contains("different registries"), "{e}");
    let e = parse(
        r#""key.converter": "io.confluent.connect.protobuf.ProtobufConverter", "key.converter.schema.registry.url": "http://a:8081",
           "value.converter": "org.apache.kafka.connect.storage.StringConverter""#,
    )
    .unwrap_err();
    assert!(e.contains("Avro or JSON Schema strings"), "{e}");
}

/// `--status-page-allowed-hosts`: names, `.domain` and `*` are kept and printed back; anything
/// else (a port, a scheme, a space) is a one-line error naming the flag.
#[test]
fn status_page_allowed_hosts_are_checked_and_round_trip() {
    let with = |hosts: &str| {
        config_of(&[
            "--postgres-url".into(),
            "postgres://u@127.0.0.1/db".into(),
            "--status-page-allowed-hosts".into(),
            hosts.into(),
        ])
    };
    let c = with("status.example.com,.ops.example,host-1").unwrap();
    assert_eq!(c.status_page_allowed_hosts, ["status.example.com", ".ops.example", "host-1"]);
    assert!(c.to_text().contains("--status-page-allowed-hosts status.example.com,.ops.example,host-1"));
    assert_eq!(config_of(&c.to_argv()).unwrap(), c);
    assert_eq!(with("*").unwrap().status_page_allowed_hosts, ["*"]);
    for bad in ["http://h", "h:9464", "..x", "a b", "ok,"] {
        let e = with(bad).unwrap_err();
        assert!(e.contains("--status-page-allowed-hosts") && e.contains("without port or scheme"), "{bad}: {e}");
        assert!(!e.trim_end().contains('\n'), "{e}");
    }
}
