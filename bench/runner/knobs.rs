//! The benchmark's settings: the environment knobs `bench/run` documents in its header, read once
//! into one struct before anything runs, and the scenarios named on the command line.
//!
//! Defaults are the ones the shell suite had, so a run with no environment set measures what the
//! history in `bench/RESULTS.md` measured. A knob that does not parse is an error, not a default.

use anyhow::{bail, Context, Result};

/// Every scenario, in the order `bench/run` with no arguments runs them.
pub const ALL_SCENARIOS: [Scenario; 6] =
    [Scenario::Drain, Scenario::Tls, Scenario::Bigtx, Scenario::Latency, Scenario::Backlog, Scenario::Profile];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Drain,
    Tls,
    Bigtx,
    Latency,
    Backlog,
    Profile,
    /// Not in `all`: the race with Debezium (`bench/run debezium`).
    Debezium,
    /// Not in `all`: exactly-once beside at-least-once (`bench/run eos`).
    Eos,
    /// Not in `all`: Avro through a schema registry beside JSON (`bench/run avro`).
    Avro,
    /// Not in `all`: `outboxd inbox` against a hand-written consumer loop (`bench/run inbox`).
    Inbox,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Drain => "drain",
            Scenario::Tls => "tls",
            Scenario::Bigtx => "bigtx",
            Scenario::Latency => "latency",
            Scenario::Backlog => "backlog",
            Scenario::Profile => "profile",
            Scenario::Debezium => "debezium",
            Scenario::Eos => "eos",
            Scenario::Avro => "avro",
            Scenario::Inbox => "inbox",
        }
    }
}

/// The scenarios named by the arguments (`all`, or none, for every one), in the given order.
pub fn scenarios(args: &[String]) -> Result<Vec<Scenario>> {
    if args.is_empty() {
        return Ok(ALL_SCENARIOS.to_vec());
    }
    let mut out = Vec::new();
    for a in args {
        if a == "all" {
            out.extend(ALL_SCENARIOS);
            continue;
        }
        match ALL_SCENARIOS
            .iter()
            .chain([&Scenario::Debezium, &Scenario::Eos, &Scenario::Avro, &Scenario::Inbox])
            .find(|s| s.name() == a)
        {
            Some(s) => out.push(*s),
            None => {
                bail!("unknown scenario '{a}' (drain tls bigtx latency backlog profile debezium eos avro inbox all)")
            }
        }
    }
    Ok(out)
}

/// The environment knobs (see the header of `bench/run`).
#[derive(Clone, Debug)]
pub struct Knobs {
    /// Single-row transactions in the drain backlog.
    pub n: u64,
    /// Repetitions of every drain-like scenario.
    pub reps: usize,
    pub n_big: u64,
    pub big_txn_rows: u64,
    pub n_huge: u64,
    pub reps_huge: usize,
    /// Rows of the one big transaction in the debezium scenario.
    pub dbz_huge: u64,
    /// The debezium scenario's drain part (the three backlog shapes).
    pub dbz_drain: bool,
    /// The debezium scenario's latency part (RATES, LAT_SECS, REPS).
    pub dbz_latency: bool,
    /// Insert rates (events/s) of the latency scenario.
    pub rates: Vec<u64>,
    pub lat_secs: u64,
    pub warm_secs: u64,
    /// Rows each Kafka reader drains once before a backlog's measured runs (the broker is a JVM:
    /// its produce and transaction paths must be compiled before they are timed).
    pub warm_rows: u64,
    pub lat_null: bool,
    pub cal_secs: u64,
    pub fetch_wait_ms: u64,
    pub n_backlog: u64,
    pub backlog_txn_rows: u64,
    pub n_profile: u64,
    pub n_tls: u64,
    pub tls_reps: usize,
    pub tls_null: bool,
    pub tls_split: bool,
    pub profile_tls: bool,
    pub profile_files: bool,
    pub write_results: bool,
    pub keep_work: bool,
    pub drain_broker: bool,
    pub drain_rabbitmq: bool,
    pub rabbit_url: String,
    pub http_drain: bool,
    pub http_batch: u64,
    pub http_concurrency: u64,
    /// Extra outboxd flags for drain, bigtx and backlog, split on whitespace as the shell did.
    pub outboxd_extra: String,
    /// `eos`: the exactly-once drains' `--transaction-interval`.
    pub eos_interval: String,
    /// `eos`: the `--transaction-interval`s of the exactly-once latency rows at 5k/s.
    pub eos_intervals: Vec<String>,
    /// `inbox`: records in the backlog both consumers drain.
    pub inbox_n: u64,
    /// `inbox`: records per PostgreSQL transaction, for both.
    pub inbox_batch: u64,
    /// `inbox`: events/s of the latency part.
    pub inbox_rate: u64,
    /// `inbox`: SIGKILLs of the hand loop while it drains.
    pub inbox_kills: u64,
    /// `inbox`: also drain with Debezium's JDBC sink connector (INBOX_JDBC=1, the default).
    pub inbox_jdbc: bool,
}

fn raw(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn num<T: std::str::FromStr>(name: &str, default: T) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    match raw(name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|e| anyhow::anyhow!("{name}={v}: {e}")),
    }
}

fn flag(name: &str, default: bool) -> Result<bool> {
    match raw(name).as_deref() {
        None => Ok(default),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(v) => bail!("{name}={v}: expected 0 or 1"),
    }
}

impl Knobs {
    pub fn from_env() -> Result<Self> {
        let n = num("N", 200_000)?;
        let write_results = flag("WRITE_RESULTS", true)?;
        let rates = raw("RATES")
            .unwrap_or_else(|| "1000 5000".into())
            .split_whitespace()
            .map(|r| r.parse().with_context(|| format!("RATES: {r}")))
            .collect::<Result<Vec<u64>>>()?;
        Ok(Knobs {
            n,
            reps: num("REPS", 5)?,
            n_big: num("N_BIG", n)?,
            big_txn_rows: num("BIG_TXN_ROWS", 1000)?,
            n_huge: num("N_HUGE", 1_000_000)?,
            reps_huge: num("REPS_HUGE", 1)?,
            dbz_huge: num("DBZ_HUGE", n)?,
            dbz_drain: flag("DBZ_DRAIN", true)?,
            dbz_latency: flag("DBZ_LATENCY", true)?,
            rates,
            lat_secs: num("LAT_SECS", 30)?,
            warm_secs: num("WARM_SECS", 3)?,
            warm_rows: num("WARM_ROWS", 20_000)?,
            lat_null: flag("LAT_NULL", true)?,
            cal_secs: num("CAL_SECS", 10)?,
            fetch_wait_ms: num("FETCH_WAIT_MS", 10)?,
            n_backlog: num("N_BACKLOG", 1_000_000)?,
            backlog_txn_rows: num("BACKLOG_TXN_ROWS", 10)?,
            n_profile: num("N_PROFILE", 200_000)?,
            n_tls: num("N_TLS", n)?,
            tls_reps: num("TLS_REPS", 5)?,
            tls_null: flag("TLS_NULL", true)?,
            tls_split: flag("TLS_SPLIT", true)?,
            profile_tls: flag("PROFILE_TLS", true)?,
            profile_files: flag("PROFILE_FILES", write_results)?,
            write_results,
            keep_work: flag("KEEP_WORK", false)?,
            drain_broker: flag("DRAIN_BROKER", true)?,
            drain_rabbitmq: flag("DRAIN_RABBITMQ", true)?,
            rabbit_url: raw("RABBIT_URL").unwrap_or_else(|| "amqp://127.0.0.1:5672/%2f".into()),
            http_drain: flag("HTTP_DRAIN", true)?,
            http_batch: num("HTTP_BATCH", 100)?,
            http_concurrency: num("HTTP_CONCURRENCY", 8)?,
            outboxd_extra: raw("OUTBOXD_EXTRA").unwrap_or_default(),
            eos_interval: raw("EOS_INTERVAL").unwrap_or_else(|| "25ms".into()),
            eos_intervals: raw("EOS_INTERVALS")
                .unwrap_or_else(|| "10ms 25ms 100ms".into())
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            inbox_n: num("INBOX_N", n)?,
            inbox_batch: num("INBOX_BATCH", 500)?,
            inbox_rate: num("INBOX_RATE", 5000)?,
            inbox_kills: num("INBOX_KILLS", 5)?,
            inbox_jdbc: flag("INBOX_JDBC", true)?,
        })
    }

    pub fn outboxd_extra_args(&self) -> Vec<String> {
        self.outboxd_extra.split_whitespace().map(str::to_owned).collect()
    }

    /// The settings line of the report, as the shell printed it.
    pub fn settings_line(&self) -> String {
        let b = |v: bool| u8::from(v);
        let rates: Vec<String> = self.rates.iter().map(u64::to_string).collect();
        let extra = if self.outboxd_extra.is_empty() {
            String::new()
        } else {
            format!(" OUTBOXD_EXTRA=\"{}\"", self.outboxd_extra)
        };
        format!(
            "Settings:{extra} N={} REPS={} N_BIG={} BIG_TXN_ROWS={} N_HUGE={} REPS_HUGE={} DBZ_HUGE={} RATES=\"{}\" \
             LAT_SECS={} N_BACKLOG={} BACKLOG_TXN_ROWS={} N_PROFILE={} N_TLS={} TLS_REPS={} TLS_NULL={} TLS_SPLIT={} \
             WARM_ROWS={} DRAIN_BROKER={} DRAIN_RABBITMQ={} HTTP_DRAIN={}.",
            self.n,
            self.reps,
            self.n_big,
            self.big_txn_rows,
            self.n_huge,
            self.reps_huge,
            self.dbz_huge,
            rates.join(" "),
            self.lat_secs,
            self.n_backlog,
            self.backlog_txn_rows,
            self.n_profile,
            self.n_tls,
            self.tls_reps,
            b(self.tls_null),
            b(self.tls_split),
            self.warm_rows,
            b(self.drain_broker),
            b(self.drain_rabbitmq),
            b(self.http_drain),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn scenarios_keep_the_given_order_and_all_expands() {
        assert_eq!(scenarios(&args(&[])).unwrap(), ALL_SCENARIOS.to_vec());
        assert_eq!(scenarios(&args(&["latency", "drain"])).unwrap(), vec![Scenario::Latency, Scenario::Drain]);
        let all = scenarios(&args(&["all"])).unwrap();
        assert_eq!(all.len(), 6);
        assert!(scenarios(&args(&["drian"])).is_err());
    }

    /// The report's settings line names every knob that changes what the drain tables hold: how
    /// many runs the one-transaction shape's medians are of, and which readers took part.
    #[test]
    fn settings_line_names_the_repetitions_and_readers_of_every_shape() {
        let mut k = Knobs::from_env().unwrap();
        (k.reps, k.reps_huge, k.drain_broker, k.drain_rabbitmq, k.http_drain) = (5, 4, true, false, false);
        let line = k.settings_line();
        for want in [" REPS=5 ", " REPS_HUGE=4 ", " DRAIN_BROKER=1 ", " DRAIN_RABBITMQ=0 ", " HTTP_DRAIN=0."] {
            assert!(line.contains(want), "{want:?} not in {line}");
        }
    }
}
