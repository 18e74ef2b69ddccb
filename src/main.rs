//! The `outboxd` binary: parse flags, set up logging and signals, pick the sink, run, and turn the
//! outcome into an exit code (0 clean shutdown, 1 runtime failure, 2 bad configuration, 130/143 a
//! second SIGINT/SIGTERM that cut the shutdown drain short). SIGHUP reloads `--schema-dir`.

use std::process::ExitCode;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use outboxd::app::Handles;
use outboxd::config::{Cli, Command, Config, ConfigArgs, LogFormat};
use outboxd::error::{Definite, Error};
use outboxd::health::Health;
use outboxd::metrics::Metrics;
use outboxd::router::contract::Contracts;
use outboxd::sink::AnySink;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // Which flags the user gave (command line or environment): those win over --debezium-config.
    // A flag the command does not take was not given (asking clap about it would be a bug).
    let sub = matches.subcommand().map(|(_, m)| m.clone());
    let explicit = move |id: &str| {
        sub.as_ref().is_some_and(|m| {
            m.ids().any(|i| i.as_str() == id)
                && matches!(m.value_source(id), Some(ValueSource::CommandLine) | Some(ValueSource::EnvVariable))
        })
    };
    let (checked, mode) = match cli.command {
        Command::Run(args) => (Config::from_args_with_file(&args, &explicit), Mode::Run),
        Command::Poll(args) => (Config::from_args_with_file(&args, &explicit), Mode::Poll),
        Command::Config(args) => return print_config(&args, &explicit),
        Command::Status(args) => return exit_with(block_on(outboxd::tools::status::run(&args))),
        Command::Check(args) => return check(&args, &explicit),
        Command::Dlq(cmd) => return exit_with(block_on(outboxd::tools::dlq::tool::run(cmd))),
        Command::Schema(cmd) => return exit_with(block_on(outboxd::tools::schema_check::run(cmd))),
        Command::Shadow(cmd) => return exit_with(block_on(outboxd::tools::shadow::tool::run(cmd))),
        Command::Decrypt(args) => return exit_with(outboxd::router::mask::decrypt::run(&args)),
        Command::Backfill(args) => return backfill(&args, &explicit),
        Command::Inbox(args) => return inbox(&args),
    };
    let cfg = match checked {
        Ok(c) => c,
        Err(e) => {
            eprintln!("outboxd: error: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(cfg.log_format);
    log_notes(&cfg);
    match run(cfg, mode) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("outboxd: error: {e:#}");
            ExitCode::from(if is_config_error(&e) { 2 } else { 1 })
        }
    }
}

/// A configuration error found after the flags parsed (building the sink, binding the endpoint)
/// exits 2 like a flag error, whether it travels as an [`Error`] or as a bare [`Definite`].
fn is_config_error(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<Error>(), Some(Error::Definite(Definite::Config(_))))
        || matches!(e.downcast_ref::<Definite>(), Some(Definite::Config(_)))
}

fn log_notes(cfg: &Config) {
    if let Some(c) = &cfg.route.contracts {
        tracing::info!(schemas = c.len(), dir = %c.dir().display(), missing = ?c.missing(), "event contracts loaded (--schema-dir; SIGHUP reloads)");
        if c.is_empty() {
            tracing::warn!(dir = %c.dir().display(), "--schema-dir has no <event_type>.json schema: no payload is checked{}", if c.missing() == outboxd::router::contract::SchemaMissing::Reject { ", and --schema-missing reject makes every event bad" } else { "" });
        }
    }
    if let Some(w) = cfg.registry.as_ref().and_then(outboxd::format::registry::cleartext_credentials) {
        tracing::warn!("{w}");
    }
    for (warning, note) in &cfg.notes {
        if *warning {
            tracing::warn!("--debezium-config: {note}");
        } else {
            tracing::info!("--debezium-config: {note}");
        }
    }
}

fn print_config(args: &ConfigArgs, explicit: &dyn Fn(&str) -> bool) -> ExitCode {
    match Config::from_args_with_file(args, explicit) {
        Ok(cfg) => {
            for (warning, note) in &cfg.notes {
                eprintln!("outboxd: {}: {note}", if *warning { "warning" } else { "note" });
            }
            if let Some(w) = cfg.registry.as_ref().and_then(outboxd::format::registry::cleartext_credentials) {
                eprintln!("outboxd: warning: {w}");
            }
            if cfg.require_empty_tables {
                eprintln!("outboxd: note: the Debezium file's snapshot.mode also requires empty outbox tables at start; the flags below do not");
            }
            println!("{}", cfg.to_text());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("outboxd: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `outboxd check`: a flag error exits 2 as for `run`; otherwise the report's verdict (0 or 1).
fn check(args: &outboxd::config::CheckArgs, explicit: &dyn Fn(&str) -> bool) -> ExitCode {
    match Config::from_args_with_file(args, explicit) {
        Ok(cfg) => exit_with(block_on(outboxd::tools::check::run(&cfg, args.json))),
        Err(e) => {
            eprintln!("outboxd: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `outboxd backfill`: the range and `run`'s flags validated first (exit 2), then the run.
fn backfill(args: &outboxd::config::BackfillArgs, explicit: &dyn Fn(&str) -> bool) -> ExitCode {
    let now = jiff::Timestamp::now();
    let checked = Config::from_args_with_file(args, explicit)
        .and_then(|cfg| outboxd::source::backfill::Range::from_args(args, now).map(|r| (cfg, r)));
    match checked {
        Ok((cfg, range)) => exit_with(block_on(outboxd::source::backfill::run(cfg, range))),
        Err(e) => {
            eprintln!("outboxd: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `outboxd inbox`: flags validated first (exit 2), then the consumer until SIGINT/SIGTERM.
fn inbox(args: &outboxd::config::InboxArgs) -> ExitCode {
    let cfg = match outboxd::config::InboxConfig::from_args(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("outboxd: error: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(cfg.log_format);
    if let Some(w) = cfg.registry.as_ref().and_then(outboxd::format::registry::cleartext_credentials) {
        tracing::warn!("{w}");
    }
    let run = async move {
        let shutdown = CancellationToken::new();
        spawn_signal_handler(shutdown.clone())
            .map_err(|e| Error::Definite(Definite::Setup(format!("installing signal handlers: {e:#}"))))?;
        outboxd::tools::inbox::run(cfg, shutdown).await
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
    exit_with(
        rt.map_err(|e| Error::Definite(Definite::Config(format!("starting the tokio runtime: {e}"))))
            .and_then(|rt| rt.block_on(run)),
    )
}

/// Run a short-lived async command on a current-thread runtime.
fn block_on<F: std::future::Future<Output = Result<u8, Error>>>(f: F) -> Result<u8, Error> {
    init_logging(LogFormat::Text);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Definite(Definite::Config(format!("starting the tokio runtime: {e}"))))?;
    rt.block_on(f)
}

fn exit_with(r: Result<u8, Error>) -> ExitCode {
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("outboxd: error: {e}");
            ExitCode::from(if matches!(e, Error::Definite(Definite::Config(_))) { 2 } else { 1 })
        }
    }
}

fn init_logging(format: LogFormat) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // lapin logs a returned (unroutable) message whole, payload and headers included; outboxd
    // reports it as a bad event without the payload instead.
    if let Ok(quiet) = "lapin::returned_messages=error".parse() {
        filter = filter.add_directive(quiet);
    }
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    // The status page's "last error": the latest WARN or ERROR line.
    let problems = outboxd::status::board::ProblemLayer;
    match format {
        LogFormat::Text => builder.finish().with(problems).init(),
        LogFormat::Json => builder.json().finish().with(problems).init(),
    }
}

/// Which loop drives the sink: the replication slot, or the polled table.
#[derive(Clone, Copy)]
enum Mode {
    Run,
    Poll,
}

fn run(cfg: Config, mode: Mode) -> anyhow::Result<()> {
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the tokio runtime")?;
    rt.block_on(async move {
        let health = Health::new(cfg.health_stall_timeout);
        if let Some(addr) = cfg.metrics_addr {
            let command = match mode {
                Mode::Run => "run",
                Mode::Poll => "poll",
            };
            let page = outboxd::status::PageSetup { cfg: cfg.clone(), command };
            let bound = outboxd::serve::serve(addr, health.clone(), Some(page)).await?;
            tracing::info!(%bound, "serving /metrics, /healthz, /readyz and the status page (/ and /status.json)");
        }
        // After the recorder is installed: handles made before it would record nowhere.
        let metrics = Metrics::new();
        let shutdown = CancellationToken::new();
        spawn_signal_handler(shutdown.clone())?;
        spawn_reload_handler(cfg.route.contracts.clone())?;
        let handles = Handles { health: health.clone(), metrics: metrics.clone(), shutdown };
        if let Some(endpoint) = &cfg.otlp_endpoint {
            let task = outboxd::otlp::start(endpoint, "outboxd");
            tracing::info!(endpoint = %outboxd::secret::mask_url(endpoint), "exporting a span per traced event over OTLP/HTTP");
            // Never silent: the export loop only ends if it panics.
            tokio::spawn(async move {
                let ended = task.await;
                tracing::error!(how = ?ended.err(), "the OTLP export task ended; spans are no longer exported (events are not affected)");
            });
        }
        let mut cfg = cfg;
        if let Mode::Run = mode {
            outboxd::app::identify_for_transactions(&mut cfg).await?;
        }
        let mut sink = AnySink::build(&cfg, health).await?;
        match mode {
            Mode::Run => outboxd::app::run(&cfg, &mut sink, handles).await?,
            Mode::Poll => outboxd::source::poll::run(&cfg, &mut sink, handles).await?,
        }
        Ok(())
    })
}

/// The first SIGTERM or SIGINT starts the drain; a second one exits at once (the operator means
/// it, e.g. a drain stuck on a broker that never answers). Unacked records are sent again on the
/// next start, as after a crash.
fn spawn_signal_handler(shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received; draining (send it again to exit at once)"),
            _ = int.recv() => tracing::info!("SIGINT received; draining (send it again to exit at once)"),
        }
        shutdown.cancel();
        let code = tokio::select! {
            _ = term.recv() => 143,
            _ = int.recv() => 130,
        };
        tracing::error!(
            "second signal during shutdown: exiting now without draining; unacked events will be sent again on restart"
        );
        std::process::exit(code);
    });
    Ok(())
}

/// SIGHUP reloads the `--schema-dir` contracts: the new set applies to the next event routed; one
/// that fails to compile leaves the set in force and logs why. Without `--schema-dir` it is
/// ignored, never fatal (the default action would end the process without a drain).
fn spawn_reload_handler(contracts: Option<Contracts>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let Some(c) = contracts.clone() else {
                tracing::info!("SIGHUP received; nothing to reload (no --schema-dir)");
                continue;
            };
            // Reading and compiling files blocks; the replication loop shares this thread.
            match tokio::task::spawn_blocking(move || c.reload().map(|n| (n, c))).await {
                Ok(Ok((n, c))) => {
                    tracing::info!(schemas = n, dir = %c.dir().display(), "SIGHUP: event contracts reloaded")
                }
                Ok(Err(e)) => tracing::error!("SIGHUP: event contracts not reloaded: {e}"),
                Err(e) => tracing::error!("SIGHUP: event contracts not reloaded: the reload task failed: {e}"),
            }
        }
    });
    Ok(())
}
