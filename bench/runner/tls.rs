//! The tls scenario: the drain over TCP, plaintext beside TLS in the same repetitions.
//!
//! PostgreSQL with sslmode=disable, then verify-full (the run's throwaway CA); Kafka straight to
//! tansu, or over TLS through stunnel in front of a second tansu (tansu serves no TLS itself), or
//! (TLS_HOP=1) through a plain socat hop in front of a third, to tell the proxy's cost from TLS's.
//! Before anything is timed, `check` proves the TLS rows are what they claim: outboxd's walsender
//! shows TLS in pg_stat_ssl and stunnel logged a completed handshake.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::bench::Bench;
use crate::broker;
use crate::drain::{run_backlog, Backlog};
use crate::procs;
use crate::readers::{self, over, Kind, Reader, Transport};
use crate::report::at_least;
use crate::tables::{self, DRAIN_HEADER, TWIN_HEADER};

/// Runs outboxd as the kafka_tls reader until it streams; returns what TLS is in use.
fn check(b: &Bench) -> Result<String> {
    let log = b.work.join("tls_check.log");
    b.pg.create_slots(&["tls_check".to_owned()])?;
    let mut cmd = Command::new(&b.tools.outboxd);
    cmd.args(["run", "--postgres-url", &b.pg.conninfo(Transport::Tls), "--slot", "tls_check", "--sink", "kafka"]);
    cmd.args(readers::kafka_flags(b, Transport::Tls));
    let f = std::fs::File::create(&log)?;
    let mut child = cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f).spawn()?;
    procs::track(child.id());
    let t0 = Instant::now();
    let mut pg_tls = Vec::new();
    while t0.elapsed() < Duration::from_secs(30) {
        pg_tls = b.pg.row(
            "SELECT s.ssl, s.version, s.cipher FROM pg_replication_slots r JOIN pg_stat_ssl s \
             ON s.pid = r.active_pid WHERE r.slot_name = 'tls_check'",
        )?;
        if !pg_tls.is_empty() || child.try_wait()?.is_some() {
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
    let stunnel_log = std::fs::read_to_string(b.work.join("stunnel.log")).unwrap_or_default();
    let re = regex::Regex::new(r"TLSv1[.0-9]* ciphersuite: [A-Z0-9_-]*")?;
    let Some(kafka_tls) = re.find(&stunnel_log).map(|m| m.as_str().replace(" ciphersuite:", "")) else {
        bail!("tls check: stunnel logged no TLS handshake from outboxd; its log:\n{}", stunnel_log);
    };
    let libpq_tls = procs::output(Command::new("psql").args([
        "-X",
        "-qAt",
        "-d",
        &b.pg.conninfo(Transport::Tls),
        "-c",
        "SELECT version || ' ' || cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    ]))?;
    Ok(format!(
        "outboxd → PostgreSQL: {} {}; pg_recvlogical (libpq) → PostgreSQL: {}; outboxd (librdkafka) → stunnel: {kafka_tls}",
        pg_tls.get(1).map_or("", String::as_str),
        pg_tls.get(2).map_or("", String::as_str),
        libpq_tls.trim()
    ))
}

/// The readers, and the (reader, plaintext twin) pairs, the knobs ask for.
fn plan(b: &Bench) -> (Vec<Reader>, Vec<(Reader, Reader)>) {
    let k = &b.knobs;
    let r = over;
    let (recv_tcp, null_tcp, kafka_tcp) =
        (r(Kind::Recv, Transport::Tcp), r(Kind::Null, Transport::Tcp), r(Kind::Kafka, Transport::Tcp));
    let (recv_tls, null_tls, kafka_tls) =
        (r(Kind::Recv, Transport::Tls), r(Kind::Null, Transport::Tls), r(Kind::Kafka, Transport::Tls));
    let (kafka_hop, kafka_ktls) = (r(Kind::Kafka, Transport::Hop), r(Kind::Kafka, Transport::Ktls));
    let mut rds = vec![recv_tcp];
    let mut pairs = vec![(recv_tls, recv_tcp)];
    if k.tls_null {
        rds.push(null_tcp);
    }
    rds.push(kafka_tcp);
    if k.tls_hop {
        rds.push(kafka_hop);
    }
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
    if k.tls_hop {
        pairs.push((kafka_hop, kafka_tcp));
    }
    if k.tls_hop && k.tls_split {
        pairs.push((kafka_ktls, kafka_hop));
    }
    if k.tls_split {
        pairs.extend([(kafka_ktls, kafka_tcp), (kafka_tls, kafka_ktls)]);
    }
    (rds, pairs)
}

pub fn tls(b: &mut Bench) -> Result<()> {
    b.new_broker()?;
    b.far.tls = Some(broker::stunnel_tansu(&b.work, &b.pg.certs)?);
    if b.knobs.tls_hop {
        b.far.hop = Some(broker::socat_tansu(&b.work)?);
    }
    let note = check(b)?;
    println!("   TLS in use: {note}");
    let (rds, pairs) = plan(b);
    let k = b.knobs.clone();
    let ran = run_backlog(b, &Backlog { key: "tls", rows: k.n_tls, per_txn: 1, reps: k.tls_reps, readers: &rds });
    for p in [b.far.tls.take(), b.far.hop.take()].into_iter().flatten() {
        p.stop();
    }
    ran?;
    let stunnel = if broker::which("stunnel") { "stunnel" } else { "stunnel4" };
    // stunnel prints its version on stderr.
    let version = Command::new(stunnel)
        .arg("-version")
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
            text.lines().find_map(|l| l.strip_prefix("stunnel ")?.split_whitespace().next().map(str::to_owned))
        })
        .ok()
        .flatten()
        .unwrap_or_default();
    let hop = if k.tls_hop {
        " The \"socat TCP hop\" row is plaintext through such a hop (socat, 16 KiB buffers, TCP_NODELAY) in front of a third tansu: it tells the hop's cost from TLS's."
    } else {
        ""
    };
    let split = if k.tls_split {
        " The \"PostgreSQL over TCP plaintext, Kafka TLS\" row has TLS on the Kafka side only, to tell the two sides' TLS costs apart."
    } else {
        ""
    };
    let (md, _) = tables::drain_rows(&b.raw, "tls", k.n_tls, &format!("{} × 1-row txns", k.n_tls), &rds, k.http_batch);
    let (twins_md, twins) = tables::twin_rows(&b.raw, "tls", &pairs, k.http_batch);
    b.report.section(&format!(
        "### TLS beside plaintext: {n} single-row transactions over TCP (median of {reps}, (min–max))\n\n\
         Every reader here connects over TCP to 127.0.0.1 (the drain table above uses the Unix socket, which carries no TLS). Plaintext: `sslmode=disable`, Kafka straight to tansu. TLS: `sslmode=verify-full sslrootcert=ca.pem` (a CA and a server certificate for 127.0.0.1/localhost made with openssl at bench time; the cluster runs with `ssl=on`), and Kafka with `--kafka-property security.protocol=ssl --kafka-property ssl.ca.location=ca.pem` to stunnel {version}, which terminates TLS in front of a second tansu (tansu 0.6 serves no TLS itself; it advertises stunnel's port). TLS in use, checked before timing: {note}. So the Kafka TLS rows pay for a proxy hop as well as for TLS: two more socket copies and a context switch per request on the same 2 cores.{hop}{split} The tansu CPU column includes the proxy's CPU on the rows that go through one. Ratios to pg_recvlogical are against pg_recvlogical over the same transport (TCP plaintext, or TLS with the same verify-full settings) in the same repetition.\n\n\
         {DRAIN_HEADER}\n{md}\n\
         TLS (or hop) rate as a share of the plaintext twin's, per repetition (plaintext seconds / TLS seconds):\n\n\
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
