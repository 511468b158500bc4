"use strict";
// The run page: `#run` (the service's last hour), `#run&batch=<id>`, `#run&run=<id>` (the jobs'
// metadata.run_id), with `since`/`until` (epoch seconds) and `refresh` (seconds, default 5). Draws
// GET /v1/run-stats with uPlot (vendored: static/vendor/) and reads it again every `refresh` seconds
// while the window is open-ended, so a running batch moves on the page.

const runCharts = {}; // chart name -> uPlot instance (tests read their data)
const palette = ["#3461d9", "#2f9e44", "#d98a1c", "#b42318", "#7048e8", "#0c8599", "#5b6475"];
let runTimer = null;

function runParams() {
  const params = new URLSearchParams(location.hash.slice(1).replace(/^run&?/, ""));
  const refresh = Number(params.get("refresh"));
  return { batch: params.get("batch"), run: params.get("run"), since: params.get("since"), until: params.get("until"),
    refresh: refresh > 0 ? refresh : 5 };
}

function statsPath(p, format) {
  const query = new URLSearchParams();
  for (const [name, value] of [["batch_id", p.batch], ["run_id", p.run], ["since", p.since], ["until", p.until], ["format", format]]) {
    if (value) query.set(name, value);
  }
  return "/v1/run-stats?" + query;
}

const fixed = (digits) => (value) => (value === null || value === undefined ? "-" : value.toFixed(digits));
const share = (value) => (value === null || value === undefined ? "-" : (value * 100).toFixed(1) + "%");
const timeOf = (epoch) => new Date(epoch * 1000).toISOString().slice(11, 19);

function runTitle(data) {
  const scope = data.scope;
  if (scope.kind !== "all") return scope.kind + " " + scope.id;
  return "all jobs, " + when(scope.since) + " to " + when(scope.until) + " UTC";
}

function runForm(p) {
  const batch = el("input", { id: "run-batch", size: 34, placeholder: "batch id", value: p.batch || "" });
  const run = el("input", { id: "run-run", size: 20, placeholder: "run id", value: p.run || "" });
  const show = el("button", { id: "run-show" }, "show");
  show.addEventListener("click", () => {
    location.hash = batch.value ? "run&batch=" + encodeURIComponent(batch.value)
      : run.value ? "run&run=" + encodeURIComponent(run.value) : "run";
  });
  return el("div", { class: "run-form" }, el("label", {}, "batch ", batch), el("label", {}, "run ", run), show,
    el("a", { href: "#run" }, "all jobs, last hour"));
}

function recentLinks(recent) {
  if (!recent.length) return null;
  return el("div", { id: "run-recent", class: "run-recent" }, "recent: ",
    recent.map((scope) => el("a", { href: "#run&" + scope.kind + "=" + encodeURIComponent(scope.id) }, scope.kind + " " + scope.id)));
}

function runFacts(totals) {
  const pool = totals.sandbox_pool + totals.sandbox_started;
  return el("div", { class: "facts", id: "run-facts" },
    fact("jobs ended", totals.jobs, "run-jobs"), fact("done", totals.done, "run-done"),
    fact("failed", totals.failed, "run-failed"), fact("timed out", totals.timed_out, "run-timed-out"),
    fact("cancelled", totals.cancelled, "run-cancelled"), fact("reward mean", fixed(3)(totals.reward_mean), "run-reward"),
    fact("generated tokens", totals.generated_tokens, "run-generated"),
    fact("tokens/s", fixed(1)(totals.tokens_per_s), "run-tokens-per-s"),
    fact("LLM share of rollout", share(totals.llm_share), "run-llm-share"),
    fact("sandbox pool hits", pool ? totals.sandbox_pool + " of " + pool + " (" + share(totals.pool_hit_rate) + ")" : "-", "run-pool-hits"));
}

// Every minute from the first busy one to the last: counts 0 and means absent where no job ended.
function minuteSeries(minutes) {
  if (!minutes.length) return [];
  const byMinute = new Map(minutes.map((row) => [row.t, row]));
  const rows = [];
  for (let t = minutes[0].t; t <= minutes[minutes.length - 1].t; t += 60) {
    rows.push(byMinute.get(t) || { t: t, done: 0, failed: 0, timed_out: 0, cancelled: 0, generated_tokens: 0,
      tokens_per_s: 0, reward_mean: null, llm_share: null });
  }
  return rows;
}

// The x range, set rather than left to uPlot: one lone minute (or version) is not drawn across years,
// and bars keep half a step on each side.
function xRange(xs, pad, always) {
  const min = Math.min(...xs), max = Math.max(...xs);
  return min === max || always ? [min - pad, max + pad] : [min, max];
}
const fromZero = (u, min, max) => [Math.min(0, min), max > 0 ? max * 1.1 : 1];

// options: time (x is epoch seconds, default) or steps (x is an integer: a version, versions behind);
// counts (y starts at 0); bars.
function chartPanel(name, title, series, columns, options) {
  const o = { time: true, counts: false, bars: false, ...(options || {}) };
  const target = el("div", { class: "chart", id: "chart-" + name });
  const panel = el("section", { class: "panel chart-panel" }, el("h3", {}, title), target);
  if (!columns[0].length) {
    target.append(el("p", { class: "empty" }, "nothing yet"));
    return panel;
  }
  const width = Math.max(360, Math.floor((view.clientWidth - 12) / 2) - 40);
  const opts = {
    width: width, height: 210, legend: { live: false },
    scales: { x: { time: o.time, auto: false, range: xRange(columns[0], o.time ? 60 : o.bars ? 0.5 : 1, o.bars) },
      y: o.counts ? { range: fromZero } : {} },
    series: [{}, ...series.map((label, i) => ({ label: label, stroke: palette[i % palette.length], width: 2,
      points: { show: true, size: 5 }, spanGaps: false,
      ...(o.bars ? { paths: uPlot.paths.bars({ size: [0.6] }), fill: palette[i % palette.length] + "88", points: { show: false } } : {}) }))],
    axes: [o.time ? {} : { incrs: [1, 2, 5, 10, 20, 50, 100], values: (u, ticks) => ticks.map(String) }, { size: 56 }],
  };
  runCharts[name] = new uPlot(opts, columns, target);
  return panel;
}

function runChartPanels(data) {
  for (const name of Object.keys(runCharts)) { runCharts[name].destroy(); delete runCharts[name]; }
  const minutes = minuteSeries(data.minutes);
  const t = minutes.map((row) => row.t);
  const versions = data.versions.filter((row) => row.seq !== null);
  const kinds = [...new Set(versions.flatMap((row) => Object.keys(row.by_kind)))].sort();
  const behind = data.staleness.map((row) => row.behind);
  return el("div", { class: "charts" },
    chartPanel("reward-by-version", "Reward per weight version (the one each sample started on)", ["all", ...kinds],
      [versions.map((row) => row.seq), versions.map((row) => row.reward_mean),
        ...kinds.map((kind) => versions.map((row) => (kind in row.by_kind ? row.by_kind[kind] : null)))], { time: false }),
    chartPanel("reward-by-minute", "Reward mean per minute", ["reward"], [t, minutes.map((row) => row.reward_mean)]),
    chartPanel("jobs-per-minute", "Jobs ended per minute", ["done", "failed", "timed out", "cancelled"],
      [t, ...["done", "failed", "timed_out", "cancelled"].map((status) => minutes.map((row) => row[status]))], { counts: true }),
    chartPanel("tokens-per-second", "Generated tokens per second", ["tokens/s"], [t, minutes.map((row) => row.tokens_per_s)], { counts: true }),
    chartPanel("llm-share", "LLM's share of the rollout stage", ["LLM share"], [t, minutes.map((row) => row.llm_share)]),
    chartPanel("staleness", "Staleness: versions behind the model's current one", ["samples"],
      [behind, data.staleness.map((row) => row.jobs)], { time: false, bars: true, counts: true }));
}

function table(id, headers, rows) {
  return el("table", { id: id }, el("tr", {}, headers.map((h, i) => el("th", { class: i ? "number" : null }, h))),
    rows.map((row) => el("tr", { "data-key": row[0] }, row.map((cell, i) => el("td", { class: i ? "number" : null }, cell)))));
}

function runTables(data) {
  const number = (value) => (value === null || value === undefined ? "-" : value);
  return el("div", { class: "run-tables" },
    el("section", { class: "panel" }, el("h3", {}, "Stage times"),
      table("run-stages", ["stage", "count", "mean", "p50", "p90"],
        data.stages.map((row) => [row.stage, row.count, seconds(row.mean_s) || "-", seconds(row.p50_s) || "-", seconds(row.p90_s) || "-"]))),
    el("section", { class: "panel" }, el("h3", {}, "Task kinds"),
      table("run-kinds", ["kind", "jobs", "done", "failed", "timed out", "cancelled", "reward mean"],
        data.kinds.map((row) => [row.kind, row.jobs, row.done, row.failed, row.timed_out, row.cancelled, fixed(3)(row.reward_mean)]))),
    el("section", { class: "panel" }, el("h3", {}, "Weight versions"),
      table("run-versions", ["version", "number", "rewards", "reward mean"],
        data.versions.map((row) => [row.version || "(none recorded)", number(row.seq), row.rewards, fixed(3)(row.reward_mean)]))),
    el("section", { class: "panel" }, el("h3", {}, "Why jobs did not end done"),
      data.failures.length ? table("run-failures", ["reason", "jobs"], data.failures.map((row) => [row.reason, row.jobs]))
        : el("p", { id: "run-failures" }, "none")));
}

async function runPage() {
  const p = runParams();
  const data = await api(statsPath(p));
  const csv = el("button", { id: "run-csv" }, "CSV");
  csv.addEventListener("click", () => downloadCsv(p));
  const live = p.until ? "a closed window" : "live: read at " + timeOf(data.scope.until) + " UTC, every " + p.refresh + " s";
  window.runStats = data;
  clearTimeout(runTimer);
  if (!p.until) {
    const hash = location.hash;
    runTimer = setTimeout(() => { if (location.hash === hash) route(); }, p.refresh * 1000);
  }
  return [el("h2", { id: "run-title" }, "Run page: " + runTitle(data)), runForm(p), recentLinks(data.recent),
    el("div", { class: "run-status" }, el("span", { id: "run-live" }, live), " ", csv),
    runFacts(data.totals), runChartPanels(data), runTables(data)];
}

async function downloadCsv(p) {
  try {
    const response = await apiFetch(statsPath(p, "csv"), "text/csv");
    const link = el("a", { href: URL.createObjectURL(await response.blob()), download: "run-stats.csv" });
    link.click();
    URL.revokeObjectURL(link.href);
  } catch (error) { message.textContent = error.message; }
}
