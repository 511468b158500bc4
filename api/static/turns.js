"use strict";
// A trajectory as a person reads it: the prompt, then each model turn (its text, its tool calls
// and what they returned) and the observation tokens between turns, each with its token count.

// A kind's rollout output is its own to shape: only a Trajectory record's fields are read as such.
function listOf(value) { return Array.isArray(value) ? value : []; }

function turnsOf(trajectory) { return listOf(trajectory.turns).filter((turn) => turn && typeof turn === "object"); }

function tokenCounts(trajectory) {
  const ids = listOf(trajectory.token_ids);
  const generated = listOf(trajectory.loss_mask).reduce((a, b) => a + Number(b), 0);
  const prompt = Number.isInteger(trajectory.prompt_length) ? trajectory.prompt_length : 0;
  return { total: ids.length, prompt: prompt, generated: generated, observation: ids.length - generated - prompt };
}

// Model turns only: the prompt and the observations between turns are not turns of the agent.
function modelTurns(trajectory) {
  return turnsOf(trajectory).filter((turn) => turn.role === "assistant").length;
}

function toolCallCount(trajectory) {
  return turnsOf(trajectory).reduce((n, turn) => n + listOf(turn.tool_calls).length, 0);
}

function meanLogprob(trajectory, turn) {
  const values = listOf(trajectory.logprobs).slice(turn.start, turn.end).filter((v) => typeof v === "number");
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
}

function renderCall(call) {
  const flags = [];
  if (call.duration_s) flags.push(seconds(call.duration_s));
  if (call.exit_code !== null && call.exit_code !== undefined) flags.push("exit " + call.exit_code);
  if (call.timed_out) flags.push("timed out");
  if (call.truncated) flags.push("output truncated");
  if (call.is_error) flags.push("error");
  const args = call.arguments ? JSON.stringify(call.arguments, null, 1) : call.raw;
  return el("div", { class: "call" + (call.is_error || call.error ? " error" : ""), "data-tool": call.name || "" },
    el("b", {}, "tool call: " + (call.name || "(malformed)")), flags.length ? "  " + flags.join(" · ") : "",
    el("div", { class: "label" }, "arguments"), el("pre", {}, args || ""),
    call.error
      ? [el("div", { class: "label" }, "not run"), el("pre", {}, call.error)]
      : [el("div", { class: "label" }, "result"), el("pre", { class: "tool-output" }, call.output || "(empty)")]);
}

function turnHeading(label, tokens, extra) {
  return el("h4", {}, el("span", { class: "turn-label" }, label), " ", el("span", { class: "tokens" }, tokens + " tokens"),
    extra.length ? el("span", { class: "turn-meta" }, " · " + extra.join(" · ")) : null);
}

function renderTurn(trajectory, turn, index, number) {
  const tokens = turn.end - turn.start;
  if (turn.role === "prompt") {
    return el("section", { class: "turn prompt", "data-turn": index },
      turnHeading("prompt", tokens, []), el("details", { open: (turn.text || "").length < 1500 }, el("summary", {}, "text"), el("pre", {}, turn.text || "")));
  }
  if (turn.role === "assistant") {
    const extra = [];
    const logprob = meanLogprob(trajectory, turn);
    if (logprob !== null) extra.push("mean logprob " + logprob.toFixed(3));
    if (turn.backend_id) extra.push("backend " + turn.backend_id);
    if (turn.policy_version) extra.push("policy " + turn.policy_version);
    if (turn.finish_reason) extra.push("finish " + turn.finish_reason);
    if (turn.latency_s) extra.push(seconds(turn.latency_s));
    return el("section", { class: "turn assistant", "data-turn": index },
      turnHeading("turn " + number + " · model", tokens, extra), el("pre", { class: "model-text" }, turn.text || ""),
      listOf(turn.tool_calls).map(renderCall));
  }
  const extra = turn.duration_s ? [seconds(turn.duration_s) + " in tools"] : [];
  const notes = listOf(turn.messages).filter((m) => m.role !== "tool").map((m) => el("pre", {}, m.role + ": " + (m.content || "")));
  return el("section", { class: "turn observation", "data-turn": index },
    turnHeading("observation", tokens, extra), notes,
    folded("the tokens as the model saw them", el("pre", {}, turn.text || "")));
}

function renderTurns(trajectory) {
  let number = 0;
  return turnsOf(trajectory).map((turn, index) => renderTurn(trajectory, turn, index, turn.role === "assistant" ? ++number : number));
}
