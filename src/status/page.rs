//! The page's HTML: the basic figures filled in on the server (so the page reads without
//! JavaScript), and `status.js` (served beside it) that redraws everything from `/status.json`
//! every few seconds and draws the charts.
//!
//! Invariants: every value from a row, a log line or the configuration is HTML-escaped here and
//! set with `textContent` in the script (an event id or a topic can hold any text); the page loads
//! nothing from another origin (no CDN, no fonts), and its Content-Security-Policy
//! ([`HEADERS`]) forbids it.

use super::{DeadLetters, Status};

/// The stylesheet and script, served at `/status.css` and `/status.js`.
pub const CSS: &str = include_str!("page.css");
pub const JS: &str = include_str!("page.js");
/// The page's extra response header: nothing but this origin, no inline script, no third-party
/// request, no framing.
pub const HEADERS: &str = "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n";

/// `s` safe inside HTML text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Bytes as B, KiB, MiB or GiB with one decimal.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "–".to_owned(), f)
}

fn secs(s: f64) -> String {
    format!("{s:.1} s")
}

/// The whole page. `token_query` is `token=…` when the page was asked for with one, so the
/// script's requests carry it too.
pub fn render(s: &Status, token_query: Option<&str>) -> String {
    let f = &s.facts;
    let mut h = String::with_capacity(16 * 1024);
    let q = token_query.map(|t| format!("?{}", esc(t))).unwrap_or_default();
    h.push_str(&format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>outboxd · {slot}</title><link rel=\"stylesheet\" href=\"/status.css\"></head>\n\
         <body data-json=\"/status.json{q}\" data-rendered=\"0\">\n<header><h1>outboxd</h1>\
         <span id=\"role\" class=\"badge {role}\">{role}</span>\
         <span id=\"ready\" class=\"badge {ready_class}\">{ready}</span>\
         <dl class=\"facts\"><dt>slot</dt><dd id=\"slot\">{slot}</dd><dt>publication</dt><dd id=\"publication\">{publication}</dd>\
         <dt>server</dt><dd id=\"server\">{server}</dd><dt>tables</dt><dd id=\"tables\">{tables}</dd><dt>sink</dt><dd id=\"sink\">{sink}</dd>\
         <dt>up</dt><dd id=\"uptime\">{uptime}</dd><dt>build</dt><dd id=\"version\">{version}</dd></dl></header>\n<main>\n",
        slot = esc(&f.slot),
        role = esc(s.role),
        ready_class = if s.ready { "ok" } else { "bad" },
        ready = if s.ready { "ready" } else { "not ready" },
        publication = esc(&f.publication),
        server = esc(&f.server),
        tables = esc(&f.tables.join(", ")),
        sink = esc(&f.sink),
        uptime = esc(&format!("{} s (since {})", s.uptime_seconds, s.started_at)),
        version = esc(s.version),
    ));
    // The basic figures.
    let figure = |id: &str, label: &str, value: String| {
        format!(
            "<div class=\"card\"><div class=\"label\">{label}</div><div class=\"value\" id=\"{id}\">{}</div></div>",
            esc(&value)
        )
    };
    h.push_str("<section class=\"cards\">");
    h.push_str(&figure("lag-bytes", "replication lag", opt(s.lag.bytes, bytes)));
    h.push_str(&figure("lag-seconds", "lag (seconds)", opt(s.lag.seconds, secs)));
    h.push_str(&figure("rate", "events/s", format!("{:.1}", s.events_per_second)));
    h.push_str(&figure("events-total", "events acked", s.events_total.to_string()));
    h.push_str(&figure(
        "in-flight-records",
        "in flight (records)",
        format!("{} / {}", opt(s.in_flight.records, |v| v.to_string()), s.in_flight.records_max),
    ));
    h.push_str(&figure(
        "in-flight-bytes",
        "in flight (bytes)",
        format!("{} / {}", opt(s.in_flight.bytes, bytes), bytes(s.in_flight.bytes_max)),
    ));
    h.push_str(&figure("oldest-unacked", "oldest unacked", opt(s.in_flight.oldest_unacked_age_seconds, secs)));
    h.push_str("</section>\n");
    // Connections and the last error.
    h.push_str("<section><h2>Connections</h2><ul id=\"connections\">");
    for c in &s.connections {
        h.push_str(&format!(
            "<li class=\"{}\">{}: {}</li>",
            if c.connected { "ok" } else { "bad" },
            esc(&c.component),
            if c.connected { "connected" } else { "disconnected" }
        ));
    }
    h.push_str("</ul><h2>Last error</h2><p id=\"last-error\">");
    match &s.last_error {
        Some(e) => h.push_str(&format!(
            "<span class=\"bad\">{}</span> {} <time>{}</time>",
            esc(&e.level),
            esc(&e.message),
            esc(&e.at)
        )),
        None => h.push_str("none"),
    }
    h.push_str("</p></section>\n");
    // Charts: drawn by the script.
    h.push_str(
        "<section class=\"charts\"><h2>Last 15 minutes</h2><noscript><p>The charts need JavaScript; the figures above and /status.json do not.</p></noscript>\
         <figure><figcaption>replication lag (bytes)</figcaption><svg id=\"chart-lag-bytes\" viewBox=\"0 0 600 120\" data-points=\"0\"></svg></figure>\
         <figure><figcaption>lag (seconds)</figcaption><svg id=\"chart-lag-seconds\" viewBox=\"0 0 600 120\" data-points=\"0\"></svg></figure>\
         <figure><figcaption>events per second</figcaption><svg id=\"chart-rate\" viewBox=\"0 0 600 120\" data-points=\"0\"></svg></figure></section>\n",
    );
    dead_letter_section(&mut h, &s.dead_letters);
    topics_and_preview(&mut h, s);
    if let Some(p) = &s.poll {
        h.push_str(&format!(
            "<section id=\"poll\"><h2>Polling</h2><div class=\"cards\">{}{}{}</div></section>\n",
            figure("poll-unpublished", "unpublished rows", opt(p.unpublished_rows, |v| v.to_string())),
            figure("poll-oldest", "oldest unpublished", opt(p.oldest_unpublished_age_seconds, secs)),
            figure("poll-error-ratio", "publish error ratio", format!("{:.4}", p.publish_error_ratio)),
        ));
    }
    h.push_str(&format!(
        "</main><footer>The same data: <a href=\"/status.json{q}\">/status.json</a> · <a href=\"/metrics\">/metrics</a> · updated <span id=\"updated\">now</span></footer>\n\
         <script src=\"/status.js\"></script></body></html>\n"
    ));
    h
}

/// The dead-letter queue: its reasons, its newest entries, and the commands that list and replay it.
pub(super) fn dead_letter_section(h: &mut String, d: &DeadLetters) {
    h.push_str(&format!(
        "<section><h2>Dead-letter queue <span id=\"dlq-total\">{}</span></h2><p>destination <code id=\"dlq-destination\">{}</code>, --on-bad-event <code>{}</code></p>\
         <table><thead><tr><th>reason</th><th>events</th></tr></thead><tbody id=\"dlq-reasons\">",
        d.total,
        esc(&d.destination),
        esc(&d.on_bad_event)
    ));
    for r in &d.by_reason {
        h.push_str(&format!("<tr><td>{}</td><td>{}</td></tr>", esc(&r.reason), r.events));
    }
    h.push_str("</tbody></table><h3>Newest</h3><table><thead><tr><th>event id</th><th>topic</th><th>reason</th><th>time</th><th>message</th></tr></thead><tbody id=\"dlq-newest\">");
    for e in &d.newest {
        let id = e.event_id.as_deref().unwrap_or("");
        h.push_str(&format!(
            "<tr data-event-id=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(id),
            esc(id),
            esc(e.topic.as_deref().unwrap_or("")),
            esc(&e.reason),
            esc(&e.at),
            esc(&e.message)
        ));
    }
    h.push_str(&format!(
        "</tbody></table><p>List it: <code id=\"dlq-list\">{}</code><br>Replay it: <code id=\"dlq-replay\">{}</code> (with this process's connection flags; this page never writes)</p></section>\n",
        esc(&d.list_command),
        esc(&d.replay_command)
    ));
}

/// The topics written to, and what the newest rows would be routed to.
fn topics_and_preview(h: &mut String, s: &Status) {
    h.push_str(&format!(
        "<section><h2>Topics <span id=\"topic-count\">{}</span></h2><table><thead><tr><th>topic</th><th>events</th></tr></thead><tbody id=\"topics\">",
        s.topics.count
    ));
    for t in &s.topics.top {
        h.push_str(&format!("<tr><td>{}</td><td>{}</td></tr>", esc(&t.topic), t.events));
    }
    h.push_str("</tbody></table></section>\n<section><h2>Routing preview</h2><div id=\"preview\">");
    match &s.routing_preview {
        None => h.push_str("<p>reading the newest rows…</p>"),
        Some(p) => {
            for t in &p.tables {
                h.push_str(&format!("<h3>{}</h3>", esc(&t.table)));
                if let Some(e) = &t.error {
                    h.push_str(&format!("<p class=\"bad\">{}</p>", esc(e)));
                }
                h.push_str("<table><thead><tr><th>routed value</th><th>topic</th><th>rows</th><th>problem</th></tr></thead><tbody>");
                for r in &t.routes {
                    h.push_str(&format!(
                        "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"bad\">{}</td></tr>",
                        esc(r.value.as_deref().unwrap_or("(null)")),
                        esc(r.topic.as_deref().unwrap_or("")),
                        r.rows,
                        esc(r.problem.as_deref().unwrap_or(""))
                    ));
                }
                h.push_str("</tbody></table>");
            }
        }
    }
    h.push_str("</div></section>\n");
}
