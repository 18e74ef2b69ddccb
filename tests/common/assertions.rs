//! Assertions and probes shared by the tests: records per id, `/metrics` and HTTP reads.

use super::*;
/// How many records carry each `id` header.
pub fn count_by_id(records: &[Consumed]) -> std::collections::HashMap<String, usize> {
    let mut count = std::collections::HashMap::new();
    for r in records {
        *count.entry(r.header_str("id").expect("id header")).or_default() += 1;
    }
    count
}

// ---------------------------------------------------------------------------
// the daemon's HTTP endpoint
// ---------------------------------------------------------------------------

/// `GET path` on 127.0.0.1:port; returns (status code, body), or None when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Read as _;
    let mut s = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// The value of the first sample of `series` (a metric name, optionally with a `{label="v"}`
/// fragment that must appear in the sample's labels) in a Prometheus text body.
pub fn metric(body: &str, series: &str) -> Option<f64> {
    let (name, labels) = match series.split_once('{') {
        Some((n, l)) => (n, Some(l.trim_end_matches('}'))),
        None => (series, None),
    };
    body.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (key, value) = l.rsplit_once(' ')?;
        let (kname, klabels) = match key.split_once('{') {
            Some((n, rest)) => (n, rest),
            None => (key, ""),
        };
        if kname != name || labels.is_some_and(|want| !klabels.contains(want)) {
            return None;
        }
        value.parse().ok()
    })
}

/// The W3C trace context [`with_trace_context`] puts on every outbox row, as it must arrive.
pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
pub const TRACESTATE: &str = "rojo=00f067aa0ba902b7";

/// Give `outbox` a `tracingspancontext` column (Debezium's name) whose default is the text
/// Debezium's instrumentation writes there (`java.util.Properties`, `=` escaped): every row
/// inserted after this carries [`TRACEPARENT`] and [`TRACESTATE`].
pub fn with_trace_context(pg: &super::PgCluster) {
    pg.psql(&format!(
        "ALTER TABLE outbox ADD COLUMN tracingspancontext text \
         DEFAULT E'#Thu Dec 03 10:00:00 UTC 2026\\ntraceparent={TRACEPARENT}\\ntracestate=rojo\\\\=00f067aa0ba902b7\\n'"
    ));
}
