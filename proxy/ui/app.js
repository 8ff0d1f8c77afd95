// The dashboard shell: the key form, the nav, and a hash router that renders one view at a time.
import { api, forgetKey, getKey, setKey } from "./api.js";
import { h, notice } from "./dom.js";
import { controlView } from "./control.js";
import { datasetView, datasetsView, lineageView } from "./datasets.js";
import { healthView } from "./health.js";
import { learningView, runView } from "./learning.js";
import { callView } from "./tokens.js";
import { sessionView } from "./session.js";
import { sessionsView, trafficView } from "./traffic.js";

const VIEWS = {
  traffic: trafficView,
  sessions: sessionsView,
  session: sessionView,
  call: callView,
  learning: learningView,
  run: runView,
  lineage: lineageView,
  datasets: datasetsView,
  dataset: datasetView,
  health: healthView,
  control: controlView,
};

export const who = { project: null, role: null };

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?");
  const parts = path.split("/").map(decodeURIComponent);
  return { name: parts[0] || "traffic", args: parts.slice(1), params: new URLSearchParams(query || "") };
}

let generation = 0;

async function render() {
  const root = document.getElementById("view");
  const { name, args, params } = parseHash();
  const view = VIEWS[name];
  const mine = ++generation;
  document.documentElement.dataset.ready = "";
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("on", a.getAttribute("href") === "#/" + name);
  if (!view) {
    root.replaceChildren(notice(`no view ${name}`, "error"));
    return;
  }
  const out = h("div", { class: "view", dataset: { view: name } });
  try {
    await view(out, args, params, who);
  } catch (e) {
    out.append(notice(e.message || String(e), "error"));
  }
  if (mine !== generation) return; // a newer navigation won
  root.replaceChildren(out);
  // What the browser tests and bench/ui_paint.py wait for: this view's data is on screen.
  window.onthejobReady = { view: name, t: performance.now() };
  document.documentElement.dataset.ready = name;
}

async function signIn() {
  const form = document.getElementById("keyform");
  if (!getKey()) {
    form.hidden = false;
    document.getElementById("view").replaceChildren();
    document.documentElement.dataset.ready = "key";
    return false;
  }
  try {
    Object.assign(who, await api("/v1/ui/me"));
  } catch (e) {
    forgetKey();
    form.hidden = false;
    document.getElementById("view").replaceChildren(notice(e.message, "error"));
    document.documentElement.dataset.ready = "key";
    return false;
  }
  form.hidden = true;
  document.getElementById("who").textContent = `${who.project} · ${who.role}`;
  document.getElementById("signout").hidden = false;
  return true;
}

async function start() {
  document.getElementById("keyform").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setKey(document.getElementById("key").value.trim());
    document.getElementById("key").value = "";
    if (await signIn()) await render();
  });
  document.getElementById("signout").addEventListener("click", () => {
    forgetKey();
    location.hash = "#/traffic";
    location.reload();
  });
  window.addEventListener("hashchange", () => {
    if (getKey()) render();
  });
  if (await signIn()) await render();
}

start();
