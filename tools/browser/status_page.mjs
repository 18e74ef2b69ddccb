// Opens outboxd's status page in Debian's headless Chromium (driven by playwright-core) for
// tests/status_page.rs, and prints one JSON line of what the page showed.
//
//   node tools/browser/status_page.mjs --url URL --screenshot FILE [--expect-dlq ID]
//        [--wait-lag-rise] [--timeout SECONDS] [--no-js]
//
// It waits for the page's script to render /status.json (body[data-rendered] >= 1), then, with
// --expect-dlq, for a dead-letter row of that event id; with --wait-lag-rise, for the lag chart's
// newest value to rise above the value it first showed, without reloading the page (the chart
// refreshing by itself). Every request the page makes is recorded; one that leaves loopback fails
// the run. Exit 0 only when every wait succeeded; the JSON says what was seen either way.
import { chromium } from "playwright-core";

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i < 0 ? dflt : args[i + 1];
};
const flag = (name) => args.includes(name);
const url = opt("--url");
const shot = opt("--screenshot");
const expectDlq = opt("--expect-dlq");
const timeoutMs = Number(opt("--timeout", "60")) * 1000;
const noJs = flag("--no-js");
const out = { ok: false, requests: [], external: [], console_errors: [], waits: {} };

const loopback = (u) => {
  try {
    const h = new URL(u).hostname;
    return h === "127.0.0.1" || h === "localhost" || h === "[::1]";
  } catch {
    return u.startsWith("data:") || u.startsWith("about:");
  }
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
  ],
});
try {
  const context = await browser.newContext({ javaScriptEnabled: !noJs, viewport: { width: 1280, height: 1400 } });
  const page = await context.newPage();
  page.on("request", (r) => {
    out.requests.push(r.url());
    if (!loopback(r.url())) out.external.push(r.url());
  });
  page.on("console", (m) => { if (m.type() === "error") out.console_errors.push(m.text()); });
  page.on("pageerror", (e) => out.console_errors.push(String(e)));
  const resp = await page.goto(url, { waitUntil: "load", timeout: timeoutMs });
  out.status = resp ? resp.status() : null;
  const read = () => page.evaluate(() => {
    const svg = document.getElementById("chart-lag-bytes");
    return {
      rendered: Number(document.body.dataset.rendered || "0"),
      role: document.getElementById("role")?.textContent,
      lag_bytes_text: document.getElementById("lag-bytes")?.textContent,
      dlq_total: document.getElementById("dlq-total")?.textContent,
      dlq_ids: [...document.querySelectorAll("#dlq-newest tr")].map((r) => r.dataset.eventId),
      preview_topics: [...document.querySelectorAll("#preview tbody tr")].map((r) => r.children[1]?.textContent),
      chart_points: Number(svg?.dataset.points || "0"),
      chart_last: svg?.dataset.last === "" || svg?.dataset.last === undefined ? null : Number(svg.dataset.last),
      chart_polyline: !!svg?.querySelector("polyline"),
      connections: [...document.querySelectorAll("#connections li")].map((l) => l.textContent),
    };
  });
  const waitFor = async (name, pred) => {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const s = await read();
      if (pred(s)) { out.waits[name] = true; return s; }
      if (Date.now() > end) { out.waits[name] = false; return s; }
      await page.waitForTimeout(250);
    }
  };
  let seen = await read();
  if (!noJs) seen = await waitFor("rendered", (s) => s.rendered >= 1);
  if (expectDlq) seen = await waitFor("dlq", (s) => s.dlq_ids.includes(expectDlq));
  if (flag("--wait-lag-rise")) {
    const first = await waitFor("lag_chart_has_points", (s) => s.chart_points >= 1 && s.chart_last !== null);
    out.lag_first = first.chart_last;
    out.lag_first_points = first.chart_points;
    seen = await waitFor("lag_rise", (s) => s.chart_last !== null && s.chart_last > first.chart_last && s.chart_polyline);
  }
  out.seen = seen;
  if (shot) await page.screenshot({ path: shot, fullPage: true });
  out.ok = out.external.length === 0 && Object.values(out.waits).every((v) => v) && (out.status === 200);
} catch (e) {
  out.error = String(e && e.stack || e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
process.exit(out.ok ? 0 : 1);
