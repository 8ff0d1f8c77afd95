// Traffic: headline counts, calls filtered server-side and paged by cursor; the sessions list.
import { api } from "./api.js";
import { card, fmt, h, link, notice, stat, table, version, when } from "./dom.js";

const FILTERS = ["alias", "version", "tag", "dialect", "termination", "flag", "grade", "mined"];
const FLAGS = ["", "error", "cut_short", "stream", "linked", "ambiguous_link"];
const GRADES = ["", "graded", "ungraded"];
const DIALECTS = ["", "chat", "completions", "responses", "anthropic"];

function select(name, options, value) {
  return h("select", { name }, options.map((o) => h("option", { value: o, selected: o === value }, o || "any")));
}

function filterForm(params, overview) {
  const v = (k) => params.get(k) || "";
  const terms = ["", ...Object.keys(overview.by_termination).sort()];
  const form = h("form", { class: "filters", id: "filters" },
    h("label", null, "alias ", select("alias", [...new Set(["", ...overview.aliases, v("alias")])], v("alias"))),
    h("label", null, "version ", h("input", { name: "version", value: v("version"), placeholder: "3 or base", size: 6 })),
    h("label", null, "tag ", h("input", { name: "tag", value: v("tag"), size: 8 })),
    h("label", null, "dialect ", select("dialect", DIALECTS, v("dialect"))),
    h("label", null, "termination ", select("termination", terms, v("termination"))),
    h("label", null, "flag ", select("flag", FLAGS, v("flag"))),
    h("label", null, "grade ", select("grade", GRADES, v("grade"))),
    h("label", { title: "failure modes `onthejob mine` flagged" }, "mined ", select("mined", ["", ...overview.mined_modes], v("mined"))),
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const k of FILTERS) if (form.elements[k].value) q.set(k, form.elements[k].value);
    location.hash = "#/traffic" + (q.toString() ? "?" + q : "");
  });
  return form;
}

function pager(base, params, page) {
  const older = new URLSearchParams(params);
  older.set("before", page.next_cursor || "");
  const newest = new URLSearchParams(params);
  newest.delete("before");
  return h("div", { class: "pager" },
    params.get("before") ? h("a", { href: `#/${base}?${newest}`, id: "newest" }, "« newest") : null,
    page.has_more ? h("a", { href: `#/${base}?${older}`, id: "older" }, "older »") : null);
}

export async function trafficView(root, _args, params) {
  const query = Object.fromEntries(FILTERS.map((k) => [k, params.get(k)]));
  const [overview, page] = await Promise.all([
    api("/v1/ui/overview"),
    api("/v1/ui/calls", { query: { ...query, before: params.get("before"), limit: 50 } }),
  ]);
  root.append(h("div", { class: "stats" },
    stat("calls", overview.calls, "calls"), stat("sessions", overview.sessions, "sessions"),
    stat("feedback items", overview.feedback, "feedback"),
    Object.entries(overview.by_termination).map(([t, n]) => stat(t, n, "term-" + t))));
  const rows = page.data.map((c) => [
    when(c.created_at), link(c.id, "call", c.id), link(c.session_id, "session", c.session_id),
    version(c.alias, c.adapter_version), c.dialect, c.termination,
    `${fmt(c.prompt_tokens)} / ${fmt(c.completion_tokens)}`, c.latency_ms === null ? "–" : `${c.latency_ms.toFixed(0)} ms`,
    c.tags.join(" "), String(c.feedback), fmt(c.grade),
  ]);
  root.append(card(null, filterForm(params, overview),
    h("p", { class: "muted" }, h("span", { dataset: { k: "matching" } }, String(page.total) + (page.total_capped ? "+" : "")), " calls match"),
    rows.length ? table(["time", "call", "session", "served by", "dialect", "termination", "tokens in / out",
      "latency", "tags", "feedback", "grade"], rows, { id: "calls" }) : notice("no calls match"),
    pager("traffic", params, page)));
}

export async function sessionsView(root, _args, params) {
  const page = await api("/v1/ui/sessions", { query: { alias: params.get("alias"), tag: params.get("tag"), before: params.get("before") } });
  const rows = page.data.map((s) => [
    when(s.updated_at), link(s.id, "session", s.id), s.task_id || "–", s.source, String(s.calls),
    s.alias ? version(s.alias, s.adapter_version) : "–", s.tags.join(" "), String(s.feedback),
  ]);
  root.append(card(null, h("p", { class: "muted" }, h("span", { dataset: { k: "sessions" } }, String(page.total)), " sessions"),
    rows.length ? table(["last active", "session", "task", "found by", "calls", "served by", "tags", "feedback"], rows, { id: "sessions" })
      : notice("no sessions yet"),
    pager("sessions", params, page)));
}
