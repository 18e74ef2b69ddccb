//! Each relaying command takes the flag groups it uses, and only those: `poll` has no slot, WAL
//! or exactly-once flags, `run` no `--poll-*`, `backfill` neither nor the daemon's; `config`
//! takes all of them, so it can print both commands. A flag a command does not take is refused
//! by the parser (exit 2), and a Debezium file cannot slip exactly-once into `poll` either.
//! The real binary, no services: everything here fails before a connection is made.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(30);

/// `outboxd SUB --help`, with no `OUTBOXD_*` variable set.
fn help(sub: &str) -> String {
    let mut cmd = std::process::Command::new(outboxd_bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OUTBOXD_") {
            cmd.env_remove(&k);
        }
    }
    let out = cmd.args([sub, "--help"]).output().expect("run outboxd --help");
    assert!(out.status.success(), "outboxd {sub} --help failed");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// The long flags a help text lists (`--name` at the start of an option line).
fn flags(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .map(|l| format!("--{}", l.split([' ', '=', '[', '<']).next().unwrap_or_default()))
        .collect()
}

const WAL: &[&str] = &[
    "--slot",
    "--publication",
    "--publication-autocreate",
    "--messages-prefix",
    "--wal-receiver-timeout",
    "--table-op-invalid-behavior",
    "--heartbeat-interval",
    "--heartbeat-action-query",
    "--standby-retry-interval",
    "--slot-failover",
    "--slot-recreate-after-loss",
    "--debezium-offsets",
];
const DELIVERY: &[&str] = &["--delivery", "--transaction-interval", "--position-topic"];
const POLL: &[&str] = &["--poll-batch", "--poll-interval", "--poll-channel", "--poll-delete", "--retention"];
const DAEMON: &[&str] = &["--metrics-addr", "--log-format", "--shutdown-timeout", "--otlp-endpoint"];
const SHARED: &[&str] =
    &["--postgres-url", "--table", "--route-by-field", "--sink", "--kafka-brokers", "--max-in-flight"];

fn assert_takes(sub: &str, has: &[&[&str]], lacks: &[&[&str]]) {
    let got = flags(&help(sub));
    for f in has.iter().flat_map(|g| g.iter()) {
        assert!(got.iter().any(|g| g == f), "outboxd {sub} --help lacks {f}: {got:?}");
    }
    for f in lacks.iter().flat_map(|g| g.iter()) {
        assert!(!got.iter().any(|g| g == f), "outboxd {sub} --help shows {f}, which it does not use");
    }
}

#[test]
fn each_command_shows_the_groups_it_uses_and_no_other() {
    assert_takes("run", &[SHARED, WAL, DELIVERY, DAEMON], &[POLL]);
    assert_takes("check", &[SHARED, WAL, DELIVERY], &[POLL]);
    assert_takes("config", &[SHARED, WAL, DELIVERY, DAEMON, POLL], &[]);
    assert_takes("poll", &[SHARED, POLL, DAEMON], &[WAL, DELIVERY]);
    assert_takes(
        "backfill",
        &[SHARED, &["--since", "--batch-size", "--poll-field-seq"]],
        &[WAL, DELIVERY, DAEMON, POLL],
    );
}

#[test]
fn a_flag_of_another_command_is_refused_with_exit_2() {
    let url = "postgres://u@127.0.0.1:1/db";
    for (cmd, flag, value) in [
        ("poll", "--delivery", "exactly-once"),
        ("poll", "--slot", "s"),
        ("run", "--poll-batch", "10"),
        ("backfill", "--delivery", "exactly-once"),
        ("backfill", "--metrics-addr", "127.0.0.1:0"),
    ] {
        let (code, out) = run_to_exit(&args(&[cmd, "--postgres-url", url, flag, value]), T);
        assert_eq!(code, Some(2), "outboxd {cmd} {flag}: {out}");
        assert!(out.contains(flag), "outboxd {cmd} {flag}: the error does not name the flag: {out}");
    }
}

/// `exactly.once.support=required` in a Debezium file is exactly-once: `run` takes it, `poll`
/// refuses it while loading the flags, naming the key and the command that gives it.
#[test]
fn a_debezium_file_cannot_make_poll_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("connector.json");
    std::fs::write(
        &file,
        r#"{"name": "outbox", "config": {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "database.hostname": "127.0.0.1", "database.port": "1", "database.user": "u",
            "database.dbname": "db", "table.include.list": "public.outbox",
            "exactly.once.support": "required"}}"#,
    )
    .unwrap();
    let file = file.display().to_string();
    let (code, out) = run_to_exit(&args(&["poll", "--debezium-config", &file, "--metrics-addr", "off"]), T);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("exactly.once.support=required") && out.contains("outboxd run"), "{out}");
    let (code, out) = run_to_exit(&args(&["config", "--debezium-config", &file]), T);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("--delivery exactly-once"), "{out}");
}

/// `poll` and `backfill` take no `--delivery`, so `OUTBOXD_DELIVERY=exactly-once` (an environment
/// shared with `run`) is refused with its name, never dropped without a word; at-least-once passes.
#[test]
fn exactly_once_from_the_environment_is_refused_by_poll_and_backfill() {
    // `--table ''` makes validation fail after the flags are read, so a command that let the
    // variable through exits on that (without naming it) instead of trying to connect.
    for (sub, extra) in [("poll", ["--metrics-addr", "off"]), ("backfill", ["--since", "2026-01-01T00:00:00Z"])] {
        let out = std::process::Command::new(outboxd_bin())
            .args([sub, "--postgres-url", "postgres://u@127.0.0.1:1/db", "--table", ""])
            .args(extra)
            .env("OUTBOXD_DELIVERY", "exactly-once")
            .output()
            .expect("run outboxd");
        let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{sub}: {text}");
        assert!(text.contains("OUTBOXD_DELIVERY=exactly-once") && text.contains("outboxd run"), "{sub}: {text}");
    }
    // At least once is what poll does anyway: not refused, so validation goes on to the next
    // mistake (an empty --table), before any connection.
    let out = std::process::Command::new(outboxd_bin())
        .args(["poll", "--postgres-url", "postgres://u@127.0.0.1:1/db", "--metrics-addr", "off", "--table", ""])
        .env("OUTBOXD_DELIVERY", "at-least-once")
        .output()
        .expect("run outboxd");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(!text.contains("OUTBOXD_DELIVERY") && text.contains("--table is empty"), "{text}");
}

/// `poll` and `backfill` read tables: a Debezium file's message prefixes cannot stand in for
/// `--table`, and the refusal comes while loading the flags (exit 2), before any connection.
#[test]
fn poll_and_backfill_need_a_table_even_with_message_prefixes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("connector.properties");
    std::fs::write(
        &file,
        "debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
         debezium.source.database.hostname=127.0.0.1\ndebezium.source.database.port=1\n\
         debezium.source.database.user=u\ndebezium.source.database.dbname=db\n\
         debezium.source.message.prefix.include.list=outbox\n",
    )
    .unwrap();
    let file = file.display().to_string();
    for cmd in [&["poll", "--metrics-addr", "off"][..], &["backfill", "--since", "1h", "--sink", "null"][..]] {
        let mut a = args(cmd);
        a.extend(args(&["--debezium-config", &file, "--table", ""]));
        let (code, out) = run_to_exit(&a, T);
        assert_eq!(code, Some(2), "{cmd:?}: {out}");
        assert!(out.contains("--table is empty") && out.contains("read tables"), "{cmd:?}: {out}");
    }
}

const TABLE_START: &str =
    "<!-- generated from the flag groups by tests/flag_groups.rs; OUTBOXD_BLESS=1 cargo test --test flag_groups rewrites it -->";
const TABLE_END: &str = "<!-- end of the generated table -->";

/// Which command takes which group of flags, as the clap definitions say: a Markdown table.
fn group_table() -> String {
    use clap::{Args, CommandFactory};
    use outboxd::config::*;
    fn longs<T: Args>() -> Vec<String> {
        let cmd = T::augment_args(clap::Command::new("group"));
        cmd.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect()
    }
    let groups: [(&str, Vec<String>); 9] = [
        ("connection, Debezium file, outbox table", longs::<SourceArgs>()),
        ("routing, converters, contracts, masking", longs::<RouteArgs>()),
        ("sinks and dead letters", longs::<SinkArgs>()),
        ("budgets", longs::<BudgetArgs>()),
        ("slot and WAL", longs::<WalArgs>()),
        ("delivery", longs::<outboxd::sink::kafka::config::DeliveryArgs>()),
        ("a running process", longs::<ProcessArgs>()),
        ("poll loop", longs::<PollLoopArgs>().into_iter().filter(|f| f != "--poll-field-seq").collect()),
        ("insertion order", longs::<SeqColumnArgs>()),
    ];
    let cli = Cli::command();
    let commands = ["run", "check", "config", "poll", "backfill"];
    let mut out = format!("| group | {} | flags |\n|---|{}---|\n", commands.join(" | "), "---|".repeat(commands.len()));
    for (name, flags) in groups {
        let cells: Vec<&str> = commands
            .iter()
            .map(|c| {
                let sub = cli.find_subcommand(c).expect("subcommand");
                let takes = |f: &String| sub.get_arguments().any(|a| a.get_long() == Some(&f[2..]));
                match flags.iter().filter(|f| takes(f)).count() {
                    n if n == flags.len() => "yes",
                    0 => "",
                    _ => "some",
                }
            })
            .collect();
        let list: Vec<String> = flags.iter().map(|f| format!("`{f}`")).collect();
        out.push_str(&format!("| {name} | {} | {} |\n", cells.join(" | "), list.join(", ")));
    }
    out
}

/// The table in docs/src/flags.md is generated: it fails when the committed one differs from
/// what the code says (a flag moved to another group, a command taking another group).
#[test]
fn the_group_table_of_the_flags_chapter_is_what_the_code_says() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/flags.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (Some(a), Some(b)) = (text.find(TABLE_START), text.find(TABLE_END)) else {
        panic!("docs/src/flags.md has no generated group table; put the two marker lines in it and run OUTBOXD_BLESS=1 cargo test --test flag_groups");
    };
    let have = &text[a + TABLE_START.len() + 1..b];
    let want = group_table();
    if std::env::var_os("OUTBOXD_BLESS").is_some() && have != want {
        std::fs::write(&path, format!("{}{want}{}", &text[..a + TABLE_START.len() + 1], &text[b..])).unwrap();
        return;
    }
    assert!(
        have == want,
        "docs/src/flags.md's group table differs from the flag groups in the code; run OUTBOXD_BLESS=1 cargo test --test flag_groups and commit it"
    );
}
