// outboxd inbox status page: redraws the figures from /status.json every 5 s.
// Values are set with textContent only: topics, event ids and messages can hold any text.
"use strict";
(function () {
  const url = document.body.dataset.json;
  const $ = (id) => document.getElementById(id);
  const text = (id, v) => { const e = $(id); if (e) e.textContent = v; };
  const dash = (v, f) => (v === null || v === undefined ? "–" : f(v));
  const rows = (id, list, cells, attrs) => {
    const body = $(id); if (!body) return;
    body.replaceChildren(...list.map((x) => {
      const tr = document.createElement("tr");
      for (const [k, v] of Object.entries(attrs ? attrs(x) : {})) tr.setAttribute(k, v);
      for (const c of cells(x)) { const td = document.createElement("td"); td.textContent = String(c); tr.append(td); }
      return tr;
    }));
  };
  function render(s) {
    const w = $("writer"); w.textContent = s.writer.state; w.className = "badge " + (s.writer.state === "running" ? "ok" : "bad");
    const r = $("ready"); r.textContent = s.ready ? "ready" : "not ready"; r.className = "badge " + (s.ready ? "ok" : "bad");
    text("uptime", s.uptime_seconds + " s (since " + s.started_at + ")");
    text("rows-total", String(s.rows_total));
    text("duplicates-total", String(s.duplicates_total));
    text("unprocessed", dash(s.unprocessed_rows, String));
    text("oldest", dash(s.oldest_unprocessed_seconds, (v) => v.toFixed(1) + " s"));
    text("lag-records", String(s.partitions.reduce((a, p) => a + (p.lag_records || 0), 0)));
    text("writer-state", s.writer.state + " since " + s.writer.since + (s.writer.reason ? ": " + s.writer.reason : ""));
    rows("partitions", s.partitions, (p) => [p.topic, p.partition, dash(p.stored_offset, String),
      dash(p.high_watermark, String), dash(p.lag_records, String), dash(p.lag_seconds, (v) => v.toFixed(1))],
      (p) => ({ "data-partition": p.topic + "/" + p.partition }));
    const d = s.dead_letters;
    text("dlq-total", String(d.total));
    rows("dlq-reasons", d.by_reason, (x) => [x.reason, x.events]);
    rows("dlq-newest", d.newest, (e) => [e.event_id || "", e.topic || "", e.reason, e.at, e.message],
      (e) => ({ "data-event-id": e.event_id || "" }));
    text("last-error", s.last_error ? s.last_error.level + " " + s.last_error.message + " " + s.last_error.at : "none");
    text("updated", new Date().toISOString());
    document.body.dataset.rendered = String(Number(document.body.dataset.rendered || "0") + 1);
  }
  async function refresh() {
    try {
      const r = await fetch(url, { cache: "no-store" });
      if (r.ok) render(await r.json());
      else text("updated", "refresh failed: HTTP " + r.status);
    } catch (e) {
      text("updated", "refresh failed: " + e);
    }
  }
  refresh();
  setInterval(refresh, 5000);
})();
