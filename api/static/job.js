"use strict";
// One job's page: what it is and how it ended (facts, error), why it scored what it did
// (evaluation), how it ran (attempts and timings), and what the model did (the trajectory,
// or the partial one a stopped job kept).

const STAGES = ["init", "rollout", "eval"];

function renderError(error) {
  return el("section", { class: "panel error", id: "error" },
    el("h3", {}, "Error in the " + (error.stage || "?") + " stage: " + (error.type || "error")),
    el("pre", { id: "error-message" }, error.message || "(no message)"),
    error.traceback ? folded("traceback", el("pre", { id: "error-traceback" }, error.traceback)) : null);
}

function passed(outcome) {
  if (typeof outcome === "boolean") return outcome;
  return ["passed", "pass", "PASSED", "XFAIL", "ok", "success"].includes(String(outcome));
}

// Tests as evaluators report them: a list of {name, passed, status, detail}, or groups of
// {test: outcome} (SWE-bench's FAIL_TO_PASS and PASS_TO_PASS).
function testRows(evaluation) {
  const rows = [];
  if (Array.isArray(evaluation.tests)) {
    for (const test of evaluation.tests) {
      const outcome = test.status || (test.passed ? "passed" : "failed");
      rows.push({ group: "", name: test.name || "", outcome: outcome, ok: test.passed !== undefined ? test.passed : passed(outcome), detail: test.detail || "" });
    }
  }
  for (const [group, value] of Object.entries(evaluation)) {
    if (group === "tests" || !value || typeof value !== "object" || Array.isArray(value)) continue;
    const entries = Object.entries(value);
    if (!entries.length || !entries.every(([, outcome]) => typeof outcome === "string" || typeof outcome === "boolean")) continue;
    if (!/test|pass|fail/i.test(group)) continue;
    for (const [name, outcome] of entries) rows.push({ group: group, name: name, outcome: String(outcome), ok: passed(outcome), detail: "" });
  }
  return rows;
}

function renderTests(rows) {
  const grouped = rows.some((row) => row.group);
  const ok = rows.filter((row) => row.ok).length;
  return [el("h4", {}, "tests: " + ok + " of " + rows.length + " passed"),
    el("table", { id: "evaluation-tests" },
      el("tr", {}, grouped ? el("th", {}, "group") : null, el("th", {}, "test"), el("th", {}, "outcome"), el("th", {}, "detail")),
      rows.map((row) => el("tr", {}, grouped ? el("td", {}, row.group) : null, el("td", {}, el("code", {}, row.name)),
        el("td", { class: row.ok ? "outcome-pass" : "outcome-fail" }, row.outcome), el("td", {}, row.detail ? el("pre", {}, row.detail) : ""))))];
}

function renderEvaluation(evaluation) {
  const { reward, reason, ...details } = evaluation;
  const rows = testRows(evaluation);
  const shown = new Set(["tests", ...rows.map((row) => row.group).filter(Boolean)]);
  const scalars = Object.entries(details).filter(([key, value]) => !shown.has(key) && (value === null || typeof value !== "object"));
  const nested = Object.entries(details).filter(([key, value]) => !shown.has(key) && value !== null && typeof value === "object");
  return el("section", { class: "panel evaluation", id: "evaluation" },
    el("h3", {}, "Evaluation"),
    el("div", {}, el("span", { class: "score", id: "evaluation-score" }, "score " + (reward === undefined || reward === null ? "-" : reward)),
      el("span", { id: "evaluation-reason" }, reason || "(the evaluator gave no reason)")),
    scalars.length ? el("dl", { class: "details" }, scalars.map(([key, value]) => [el("dt", {}, key), el("dd", {}, String(value))])) : null,
    rows.length ? renderTests(rows) : null,
    nested.map(([key, value]) => folded(key, json(value))));
}

function stageRow(job, stage) {
  const t = (job.timings || {})[stage] || {};
  const waited = t.started && t.queued ? t.started - t.queued : null;
  const ran = t.ended && t.started ? t.ended - t.started : null;
  return el("tr", { "data-stage": stage }, el("td", {}, stage),
    el("td", { class: "number" }, (job.attempts || {})[stage] || 0), el("td", { class: "number" }, (job.lost || {})[stage] || ""),
    el("td", {}, (job.workers || {})[stage] || ""), el("td", {}, when(t.queued)), el("td", {}, when(t.started)),
    el("td", {}, when(t.ended)), el("td", { class: "number" }, seconds(waited)), el("td", { class: "number" }, seconds(ran)),
    el("td", {}, t.requeued ? "requeued " + when(t.requeued) : ""));
}

function renderAttempts(job, trajectory) {
  const stages = STAGES.filter((stage) => (job.attempts || {})[stage] || (job.timings || {})[stage]);
  const total = job.finished_at ? job.finished_at - job.created_at : null;
  const loop = trajectory.timings && typeof trajectory.timings === "object" ? trajectory.timings : {};
  return el("section", { class: "panel", id: "attempts" },
    el("h3", {}, "Attempts and timings"),
    stages.length ? el("table", { id: "stage-table" },
      el("tr", {}, ["stage", "attempts", "lost", "worker", "queued", "started", "ended", "waited", "ran", ""].map((h) => el("th", {}, h))),
      stages.map((stage) => stageRow(job, stage))) : el("p", {}, "No stage has started yet."),
    el("dl", { class: "details", id: "timings" },
      el("dt", {}, "created"), el("dd", {}, when(job.created_at)),
      el("dt", {}, "finished"), el("dd", {}, job.finished_at ? when(job.finished_at) + " (" + seconds(total) + " after submission)" : "-"),
      Object.keys(loop).length ? [el("dt", {}, "agent loop"),
        el("dd", {}, ["llm_s", "tools_s", "template_s", "total_s"].filter((k) => loop[k] !== undefined)
          .map((k) => k.replace(/_s$/, "") + " " + seconds(Number(loop[k]))).join(" · "))] : null));
}

function renderTrajectory(job, trajectory, isPartial) {
  const parts = [];
  const stage = job.error && job.error.stage;
  const cut = isPartial && stage !== "eval";  // stopped after eval began: the rollout's record is whole
  if (isPartial) {
    const stop = trajectory.stop_reason ? "Stop reason: " + trajectory.stop_reason + (trajectory.stop_detail ? " (" + trajectory.stop_detail + ")" : "") + "." : "";
    const note = stage === "eval"
      ? "The rollout finished; then the job " + job.status + " in the eval stage, so it has no evaluation. " + stop
      : "The job stopped (" + job.status + ")" + (stage ? " in the " + stage + " stage" : "") + " before it finished; "
        + "this is the record up to where it stopped. " + stop;
    parts.push(el("section", { class: "panel partial-note", id: "partial-note" },
      el("h3", {}, cut ? "Partial trajectory" : "Trajectory without an evaluation"), el("p", {}, note)));
  }
  if (turnsOf(trajectory).length) {
    parts.push(el("h3", {}, (cut ? "Partial trajectory: " : "Trajectory: ") + modelTurns(trajectory) + " model turns"));
    parts.push(renderTurns(trajectory));
  } else if (Object.keys(trajectory).length) {
    parts.push(el("p", { id: "no-trajectory" }, "The rollout's output has no turns (this kind records none)."), folded("rollout output", json(trajectory)));
  } else {
    const live = !["done", "failed", "cancelled", "timed_out"].includes(job.status);
    parts.push(el("p", { id: "no-trajectory" }, live ? "No trajectory yet: the job is " + job.status + "."
      : job.status === "done" ? "No trajectory: this kind records none." : "No trajectory: the job " + job.status + " before its rollout recorded one."));
  }
  return el("div", { id: "trajectory" }, parts);
}

async function jobPage(id) {
  const job = await api("/v1/jobs/" + encodeURIComponent(id));
  const result = job.result || {};
  const isPartial = !result.trajectory && Boolean(job.partial && job.partial.trajectory);
  const trajectory = result.trajectory || (job.partial && job.partial.trajectory) || {};
  const counts = tokenCounts(trajectory);
  const finished = job.finished_at ? job.finished_at - job.created_at : null;
  return [el("article", { id: "job" },
    el("h2", { id: "job-title" }, "job " + job.id),
    el("div", { class: "facts", id: "facts" },
      fact("status", el("span", { class: "status-" + job.status, id: "job-status" },
        job.status + (job.status_detail ? " (" + job.status_detail + ")" : ""))),
      fact("kind", job.kind), fact("reward", result.reward === undefined || result.reward === null ? "-" : String(result.reward), "job-reward"),
      fact(isPartial && (job.error || {}).stage !== "eval" ? "model turns (so far)" : "model turns", modelTurns(trajectory), "turn-count"),
      fact("tool calls", toolCallCount(trajectory), "tool-call-count"),
      fact("tokens", counts.total, "total-tokens"), fact("prompt tokens", counts.prompt, "prompt-tokens"),
      fact("generated tokens", counts.generated, "generated-tokens"), fact("tool / template tokens", counts.observation, "observation-tokens"),
      fact("stop", trajectory.stop_reason), fact("took", seconds(finished))),
    job.error ? renderError(job.error) : null,
    result.evaluation && Object.keys(result.evaluation).length ? renderEvaluation(result.evaluation) : null,
    renderAttempts(job, trajectory),
    renderTrajectory(job, trajectory, isPartial),
    el("section", { class: "panel", id: "request" }, folded("request", json(job.request))))];
}
