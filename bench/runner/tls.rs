//! The tls scenario: the drain over TCP, plaintext beside TLS in the same repetitions.
//!
//! PostgreSQL with sslmode=disable, then verify-full (the run's throwaway CA); Kafka on the
//! plaintext or on the TLS listener of the same Apache Kafka broker (`scripts/kafka start
//! --listener plaintext --listener ssl`; Kafka's own TLS, no proxy), so the far-side CPU column is
//! the one broker's either way. Before anything is timed, `check` proves the TLS rows are what they
//! claim: outboxd's walsender shows TLS in pg_stat_ssl, outboxd's librdkafka logged a verified TLS
//! handshake with the broker's TLS listener, and `openssl s_client` shows what that listener
//! negotiates.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::bench::Bench;
use crate::broker::Listeners;
use crate::drain::{run_backlog, Backlog};
use crate::procs;
use crate::readers::{self, over, Kind, Reader, Transport};
use crate::report::at_least;
use crate::tables::{self, DRAIN_HEADER, TWIN_HEADER};

/// Runs outboxd as the kafka_tls reader (librdkafka's security debug log on) until its
/// replication connection streams and its producer has completed a TLS handshake with the broker;
/// returns what TLS is in use on both sides.
fn check(b: &Bench) -> Result<String> {
    let log = b.work.join("tls_check.log");
    b.pg.create_slots(&["tls_check".to_owned()])?;
    let mut cmd = Command::new(&b.tools.outboxd);
    cmd.args(["run", "--postgres-url", &b.pg.conninfo(Transport::Tls), "--slot", "tls_check", "--sink", "kafka"]);
    cmd.args(readers::kafka_flags(b, Transport::Tls));
    cmd.args(["--kafka-property", "debug=security"]).env("RUST_LOG", "info,librdkafka=debug");
    let f = std::fs::File::create(&log)?;
    let mut child = cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f).spawn()?;
    procs::track(child.id());
    let t0 = Instant::now();
    let (mut pg_tls, mut kafka_tls) = (Vec::new(), None);
    while t0.elapsed() < Duration::from_secs(30) {
        if pg_tls.is_empty() {
            pg_tls = b.pg.row(
                "SELECT s.ssl, s.version, s.cipher FROM pg_replication_slots r JOIN pg_stat_ssl s \
                 ON s.pid = r.active_pid WHERE r.slot_name = 'tls_check'",
            )?;
        }
        kafka_tls = handshake(&std::fs::read_to_string(&log).unwrap_or_default());
        if (!pg_tls.is_empty() && kafka_tls.is_some()) || child.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    procs::terminate(child.id());
    let _ = child.wait();
    procs::untrack(child.id());
    b.pg.value("SELECT pg_drop_replication_slot('tls_check')")?;
    if pg_tls.first().map(String::as_str) != Some("t") {
        bail!(
            "tls check: outboxd's replication connection is not TLS (pg_stat_ssl: '{}'); its log:\n{}",
            pg_tls.join("|"),
            procs::tail(&log, 20)
        );
    }
    let Some(openssl) = kafka_tls else {
        bail!(
            "tls check: outboxd's librdkafka logged no verified TLS handshake with the broker; its log:\n{}",
            procs::tail(&log, 30)
        );
    };
    let kafka = b.far.kafka.as_ref().context("no broker")?;
    let listener = listener_tls(kafka.tls_port.context("the broker has no TLS listener")?, &kafka.ca())?;
    let libpq_tls = procs::output(Command::new("psql").args([
        "-X",
        "-qAt",
        "-d",
        &b.pg.conninfo(Transport::Tls),
        "-c",
        "SELECT version || ' ' || cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    ]))?;
    Ok(format!(
        "outboxd → PostgreSQL: {} {}; pg_recvlogical (libpq) → PostgreSQL: {}; outboxd (librdkafka, {openssl}) → \
         Kafka's TLS listener: handshake completed and the broker's certificate verified against its CA (librdkafka's \
         security debug log), the listener negotiating {listener} (openssl s_client)",
        pg_tls.get(1).map_or("", String::as_str),
        pg_tls.get(2).map_or("", String::as_str),
        libpq_tls.trim()
    ))
}

/// Whether librdkafka's security debug log shows a completed TLS handshake with a verified broker
/// certificate: then the OpenSSL librdkafka uses ("OpenSSL 3.0.x"), or "OpenSSL" when not logged.
fn handshake(log: &str) -> Option<String> {
    log.lines().find(|l| l.contains("Broker SSL certificate verified"))?;
    let version = regex::Regex::new(r"Using OpenSSL version (OpenSSL [0-9][0-9a-z.]*)").ok()?;
    Some(version.captures(log).map_or_else(|| "OpenSSL".to_owned(), |c| c[1].to_owned()))
}

/// What the TLS listener on `port` negotiates with `openssl s_client`, verifying against `ca`:
/// "TLSv1.3 TLS_AES_256_GCM_SHA384".
fn listener_tls(port: u16, ca: &std::path::Path) -> Result<String> {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-CAfile"])
        .arg(ca)
        .args(["-verify_return_error", "-brief"])
        .stdin(Stdio::null())
        .output()?;
    // -brief reports on stderr.
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()));
    match (out.status.success(), field("Protocol version:"), field("Ciphersuite:"), field("Verification:")) {
        (true, Some(version), Some(cipher), Some(v)) if v == "OK" => Ok(format!("{version} {cipher}")),
        _ => bail!("tls check: openssl s_client found no verified TLS on 127.0.0.1:{port}:\n{}", text.trim()),
    }
}

/// The readers, and the (reader, plaintext twin) pairs, the knobs ask for.
fn plan(b: &Bench) -> (Vec<Reader>, Vec<(Reader, Reader)>) {
    let k = &b.knobs;
    let r = over;
    let (recv_tcp, null_tcp, kafka_tcp) =
        (r(Kind::Recv, Transport::Tcp), r(Kind::Null, Transport::Tcp), r(Kind::Kafka, Transport::Tcp));
    let (recv_tls, null_tls, kafka_tls) =
        (r(Kind::Recv, Transport::Tls), r(Kind::Null, Transport::Tls), r(Kind::Kafka, Transport::Tls));
    let kafka_ktls = r(Kind::Kafka, Transport::Ktls);
    let mut rds = vec![recv_tcp];
    let mut pairs = vec![(recv_tls, recv_tcp)];
    if k.tls_null {
        rds.push(null_tcp);
    }
    rds.push(kafka_tcp);
    if k.tls_split {
        rds.push(kafka_ktls);
    }
    rds.push(recv_tls);
    if k.tls_null {
        rds.push(null_tls);
        pairs.push((null_tls, null_tcp));
    }
    rds.push(kafka_tls);
    pairs.push((kafka_tls, kafka_tcp));
    if k.tls_split {
        pairs.extend([(kafka_ktls, kafka_tcp), (kafka_tls, kafka_ktls)]);
    }
    (rds, pairs)
}

pub fn tls(b: &mut Bench) -> Result<()> {
    b.new_broker(Listeners::PlaintextAndTls)?;
    let note = check(b)?;
    println!("   TLS in use: {note}");
    let (rds, pairs) = plan(b);
    let k = b.knobs.clone();
    run_backlog(b, &Backlog { key: "tls", rows: k.n_tls, per_txn: 1, reps: k.tls_reps, readers: &rds })?;
    let split = if k.tls_split {
        " The \"PostgreSQL over TCP plaintext, Kafka TLS listener\" row has TLS on the Kafka side only, to tell the two sides' TLS costs apart."
    } else {
        ""
    };
    let (md, _) = tables::drain_rows(&b.raw, "tls", k.n_tls, &format!("{} × 1-row txns", k.n_tls), &rds, k.http_batch);
    let (twins_md, twins) = tables::twin_rows(&b.raw, "tls", &pairs, k.http_batch);
    b.report.section(&format!(
        "### TLS beside plaintext: {n} single-row transactions over TCP (median of {reps}, (min–max))\n\n\
         Every reader here connects over TCP to 127.0.0.1 (the drain table above uses the Unix socket, which carries no TLS). Plaintext: `sslmode=disable`, and Kafka on the broker's plaintext listener. TLS: `sslmode=verify-full sslrootcert=ca.pem` (a CA and a server certificate for 127.0.0.1/localhost made with openssl at bench time; the cluster runs with `ssl=on`), and Kafka with `--kafka-property security.protocol=ssl --kafka-property ssl.ca.location=ca.pem` on the TLS listener of the same Apache Kafka broker (Kafka's own TLS, JDK TLS stack, a PEM key store made by `scripts/kafka`; no proxy), so both Kafka transports go to one broker, whose CPU is the broker CPU column. TLS in use, checked before timing: {note}.{split} Ratios to pg_recvlogical are against pg_recvlogical over the same transport (TCP plaintext, or TLS with the same verify-full settings) in the same repetition.\n\n\
         {DRAIN_HEADER}\n{md}\n\
         TLS rate as a share of the plaintext twin's, per repetition (plaintext seconds / TLS seconds):\n\n\
         {TWIN_HEADER}\n{twins_md}\n",
        n = k.n_tls,
        reps = k.tls_reps,
    ));
    let twin = |kind, t| twins.iter().find(|w| w.reader == over(kind, t)).map(|w| w.spread);
    let kt = twin(Kind::Kafka, Transport::Tls);
    let rt = twin(Kind::Recv, Transport::Tls);
    let measured = match kt {
        Some(s) => format!(
            "{:.2}× ({:.2}–{:.2}); pg_recvlogical over TLS: {} its plaintext",
            s.median,
            s.min,
            s.max,
            rt.map_or("n/a".to_owned(), |r| format!("{:.2}×", r.median))
        ),
        None => "n/a".to_owned(),
    };
    b.report.target(
        "TLS drain ≥ 0.90× plaintext (outboxd --sink kafka; PostgreSQL and Kafka over TLS vs plaintext, TCP)",
        measured,
        at_least(kt.map(|s| s.median), 0.90),
    );
    Ok(())
}
