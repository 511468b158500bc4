"use strict";
// The page's frame: DOM helpers, the jobs API (with the bearer token), the job list and the
// routes: `#job=<id>` (job.js), `#run...` (the run page, run.js), else the list. Reads the service's own JSON; nothing is ever rendered as HTML, only as text.
const view = document.getElementById("view");
const message = document.getElementById("message");
const tokenKey = "rollouts-token";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value; else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

async function apiFetch(path, accept) {
  const token = sessionStorage.getItem(tokenKey);
  const response = await fetch(path, { headers: { Accept: accept, ...(token ? { Authorization: "Bearer " + token } : {}) } });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (e) {}
    if (response.status === 401) detail += " (enter a token above)";
    throw new Error(response.status + ": " + detail);
  }
  return response;
}

async function api(path) { return (await apiFetch(path, "application/json")).json(); }

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19) : "";
}

function seconds(value) {
  if (value === null || value === undefined) return "";
  return value < 10 ? value.toFixed(2) + " s" : value < 600 ? value.toFixed(1) + " s" : (value / 60).toFixed(1) + " min";
}

function fact(label, value, id) {
  return el("div", {}, el("b", {}, label), el("span", { id: id }, value === null || value === undefined || value === "" ? "-" : value));
}

function json(value) { return el("pre", {}, JSON.stringify(value, null, 2)); }

function folded(summary, ...content) { return el("details", {}, el("summary", {}, summary), ...content); }

async function listPage() {
  const status = document.getElementById("status").value;
  const data = await api("/v1/jobs?limit=200" + (status ? "&status=" + encodeURIComponent(status) : ""));
  const rows = data.jobs.map((job) => {
    const row = el("tr", { class: "job", "data-id": job.id },
      el("td", {}, el("code", {}, job.id)), el("td", {}, job.kind),
      el("td", { class: "status-" + job.status }, job.status + (job.status_detail ? " (" + job.status_detail + ")" : "")),
      el("td", { class: "number" }, job.reward === null ? "" : job.reward), el("td", {}, job.group_id || ""),
      el("td", {}, when(job.created_at)));
    row.addEventListener("click", () => { location.hash = "job=" + job.id; });
    return row;
  });
  return [el("h2", {}, data.jobs.length + " jobs"),
    el("table", { id: "jobs" }, el("tr", {}, ...["id", "kind", "status", "reward", "group", "created"].map((h) => el("th", {}, h))), ...rows)];
}

// Only the latest navigation renders: a slow answer for a job left behind never replaces the page.
let navigation = 0;

async function route() {
  const mine = ++navigation;
  message.textContent = "";
  const match = location.hash.match(/job=([0-9A-Za-z_-]+)/);
  const run = /^#run(&|$)/.test(location.hash);
  try {
    const page = await (run ? runPage() : match ? jobPage(match[1]) : listPage());
    if (mine === navigation) view.replaceChildren(...page);
  } catch (error) {
    if (mine === navigation) { message.textContent = error.message; view.replaceChildren(); }
  }
}

const fromFragment = location.hash.match(/token=([^&]+)/);
if (fromFragment) { sessionStorage.setItem(tokenKey, decodeURIComponent(fromFragment[1])); location.hash = location.hash.replace(/&?token=[^&]+/, ""); }
document.getElementById("save-token").addEventListener("click", () => { sessionStorage.setItem(tokenKey, document.getElementById("token").value); route(); });
document.getElementById("status").addEventListener("change", () => { location.hash = ""; route(); });
window.addEventListener("hashchange", route);
route();
