// outboxd status page: redraws every figure from /status.json every 5 s and draws the charts.
// Values are set with textContent only: event ids, topics and messages can hold any text.
"use strict";
(function () {
  const url = document.body.dataset.json;
  const $ = (id) => document.getElementById(id);
  const text = (id, v) => { const e = $(id); if (e) e.textContent = v; };
  const dash = (v, f) => (v === null || v === undefined ? "–" : f(v));
  const bytes = (n) => {
    const u = ["B", "KiB", "MiB", "GiB"]; let v = n, i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return i === 0 ? n + " B" : v.toFixed(1) + " " + u[i];
  };
  const secs = (s) => s.toFixed(1) + " s";
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const k of kids) e.append(k === null || k === undefined ? "" : String(k));
    return e;
  };
  const rows = (id, list, cells, attrs) => {
    const body = $(id); if (!body) return;
    body.replaceChildren(...list.map((x) => {
      const tr = el("tr", attrs ? attrs(x) : {});
      for (const c of cells(x)) tr.append(el("td", {}, c));
      return tr;
    }));
  };
  const NS = "http://www.w3.org/2000/svg";
  function chart(id, points, pick, fmt) {
    const svg = $(id); if (!svg) return;
    const vals = points.map((p) => [p.t, pick(p)]).filter((p) => p[1] !== null && p[1] !== undefined);
    svg.dataset.points = String(vals.length);
    svg.dataset.last = vals.length ? String(vals[vals.length - 1][1]) : "";
    svg.replaceChildren();
    const W = 600, H = 120, pad = 18;
    const base = document.createElementNS(NS, "line");
    base.setAttribute("x1", "0"); base.setAttribute("x2", String(W));
    base.setAttribute("y1", String(H - pad)); base.setAttribute("y2", String(H - pad));
    svg.append(base);
    if (!vals.length) return;
    const t0 = vals[0][0], t1 = Math.max(vals[vals.length - 1][0], t0 + 1);
    const max = Math.max(...vals.map((v) => v[1]), 1e-9);
    const pts = vals.map(([t, v]) => {
      const x = vals.length === 1 ? W : ((t - t0) / (t1 - t0)) * W;
      const y = H - pad - (v / max) * (H - 2 * pad);
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.append(line);
    const label = document.createElementNS(NS, "text");
    label.setAttribute("x", "4"); label.setAttribute("y", "12");
    label.textContent = "max " + fmt(max) + " · now " + fmt(vals[vals.length - 1][1]);
    svg.append(label);
  }
  function render(s) {
    const role = $("role"); role.textContent = s.role; role.className = "badge " + s.role;
    const ready = $("ready"); ready.textContent = s.ready ? "ready" : "not ready"; ready.className = "badge " + (s.ready ? "ok" : "bad");
    text("uptime", s.uptime_seconds + " s (since " + s.started_at + ")");
    text("lag-bytes", dash(s.lag.bytes, bytes));
    text("lag-seconds", dash(s.lag.seconds, secs));
    text("rate", s.events_per_second.toFixed(1));
    text("events-total", String(s.events_total));
    text("in-flight-records", dash(s.in_flight.records, String) + " / " + s.in_flight.records_max);
    text("in-flight-bytes", dash(s.in_flight.bytes, bytes) + " / " + bytes(s.in_flight.bytes_max));
    text("oldest-unacked", dash(s.in_flight.oldest_unacked_age_seconds, secs));
    $("connections").replaceChildren(...s.connections.map((c) =>
      el("li", { class: c.connected ? "ok" : "bad" }, c.component + ": " + (c.connected ? "connected" : "disconnected"))));
    const le = $("last-error");
    if (s.last_error) le.replaceChildren(el("span", { class: "bad" }, s.last_error.level), " " + s.last_error.message + " ", el("time", {}, s.last_error.at));
    else le.textContent = "none";
    chart("chart-lag-bytes", s.history.points, (p) => p.lag_bytes, bytes);
    chart("chart-lag-seconds", s.history.points, (p) => p.lag_seconds, secs);
    chart("chart-rate", s.history.points, (p) => p.events_per_second, (v) => v.toFixed(1));
    const d = s.dead_letters;
    text("dlq-total", String(d.total));
    rows("dlq-reasons", d.by_reason, (r) => [r.reason, r.events]);
    rows("dlq-newest", d.newest, (e) => [e.event_id || "", e.topic || "", e.reason, e.at, e.message],
      (e) => ({ "data-event-id": e.event_id || "" }));
    text("topic-count", String(s.topics.count));
    rows("topics", s.topics.top, (t) => [t.topic, t.events]);
    const pv = $("preview");
    if (s.routing_preview) {
      pv.replaceChildren();
      for (const t of s.routing_preview.tables) {
        pv.append(el("h3", {}, t.table));
        if (t.error) pv.append(el("p", { class: "bad" }, t.error));
        const table = el("table");
        const head = el("tr"); for (const h of ["routed value", "topic", "rows", "problem"]) head.append(el("th", {}, h));
        table.append(el("thead"), el("tbody")); table.tHead.append(head);
        for (const r of t.routes) {
          const tr = el("tr", { "data-topic": r.topic || "" });
          for (const c of [r.value === null ? "(null)" : r.value, r.topic || "", r.rows, r.problem || ""]) tr.append(el("td", {}, c));
          table.tBodies[0].append(tr);
        }
        pv.append(table);
      }
      pv.dataset.checkedAt = s.routing_preview.checked_at;
    }
    if (s.poll) {
      text("poll-unpublished", dash(s.poll.unpublished_rows, String));
      text("poll-oldest", dash(s.poll.oldest_unpublished_age_seconds, secs));
      text("poll-error-ratio", s.poll.publish_error_ratio.toFixed(4));
    }
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
