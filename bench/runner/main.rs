//! bench_run: outboxd's benchmark driver, run by `bench/run` (which builds it, documents the
//! scenarios and knobs in its header, and execs this with the scenario names).
//!
//! One throwaway PostgreSQL cluster per run, a fresh local Apache Kafka broker (`scripts/kafka`)
//! per scenario; every outboxd figure is compared with pg_recvlogical measured in the same
//! repetition, on the same backlog, from its own slot created before that backlog. The report
//! goes to stdout and, with WRITE_RESULTS=1, on top of `bench/RESULTS.md`.
//!
//! This file is wiring only: settings, the cluster, the scenarios in order, the report, and
//! turning errors into an exit code. Whatever the outcome, `procs::cleanup` stops what was started.

mod bench;
mod broker;
mod cluster;
mod debezium;
mod drain;
mod inbox;
mod knobs;
mod latency;
mod measure;
mod procs;
mod profile;
mod prom;
mod race_latency;
mod readers;
mod registry;
mod report;
mod stats;
mod tables;
mod tls;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::bench::{Bench, Far, Tools};
use crate::cluster::Cluster;
use crate::knobs::{Knobs, Scenario};
use crate::report::{Report, RunInfo};
use crate::stats::human_secs;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // A bug in the driver must not leave a cluster or a broker running either.
    let report_panic = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report_panic(info);
        procs::cleanup();
    }));
    let outcome = procs::cleanup_on_signal().and_then(|()| run(&args));
    procs::cleanup();
    if let Err(e) = outcome {
        eprintln!("bench/run: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: &[String]) -> Result<()> {
    let scenarios = knobs::scenarios(args)?;
    let knobs = Knobs::from_env()?;
    let tools = Tools::beside_driver()?;
    let pg_bin: PathBuf = procs::output(&mut procs::lib_sh("pg_bindir", &[]))?.trim().into();
    let work = std::env::temp_dir().join(format!("outboxd-bench.{}", std::process::id()));
    std::fs::create_dir(&work).with_context(|| format!("creating {}", work.display()))?;
    procs::track_work(work.clone(), knobs.keep_work);
    let pg = Cluster::start(&work, &pg_bin)?;
    let mut b =
        Bench { knobs, tools, work, pg, far: Far::default(), brokers: 0, raw: Vec::new(), report: Report::default() };

    let start = Instant::now();
    for s in scenarios {
        println!("== {}", s.name());
        let (t0, la0) = (Instant::now(), measure::loadavg());
        let ran = match s {
            Scenario::Drain => drain::drain(&mut b),
            Scenario::Tls => tls::tls(&mut b),
            Scenario::Bigtx => drain::bigtx(&mut b),
            Scenario::Latency => latency::latency(&mut b),
            Scenario::Backlog => drain::backlog(&mut b),
            Scenario::Profile => profile::profile(&mut b),
            Scenario::Debezium => debezium::debezium(&mut b),
            Scenario::Eos => drain::eos(&mut b),
            Scenario::Avro => drain::avro(&mut b),
            Scenario::Inbox => inbox::inbox(&mut b),
        };
        ran.with_context(|| format!("scenario {}", s.name()))?;
        let (el, la1) = (human_secs(t0.elapsed().as_secs_f64().round() as u64), measure::loadavg());
        println!("   ({} took {el}; 1-min load average {la0} → {la1})", s.name());
        b.report.times.push((s.name().to_owned(), el, format!("{la0} → {la1}")));
    }

    let info = RunInfo {
        args: args.join(" "),
        pg_version: b.pg.version.clone(),
        settings: b.knobs.settings_line(),
        total_secs: start.elapsed().as_secs_f64().round() as u64,
        profile: b.tools.profile(),
    };
    let doc = report::document(&b.report, &info);
    print!("\n{doc}");
    if b.knobs.write_results {
        let path = "bench/RESULTS.md";
        let old = std::fs::read_to_string(path).unwrap_or_default();
        std::fs::write(format!("{path}.new"), report::results_file(&old, &doc))?;
        std::fs::rename(format!("{path}.new"), path)?;
        println!("written to {path}");
    }
    Ok(())
}
