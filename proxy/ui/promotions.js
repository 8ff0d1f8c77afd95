// Promotion on the Learning view (GET /v1/ui/promotions): each alias's policy, its decisions (also marked on the
// reward chart's time axis), and per version its latest verdict, evals (mean ± standard error) and attestation.
import { card, fmt, h, link, notice, table, version, when } from "./dom.js";

// The verdicts marked on the chart; "candidate", "superseded" and "manual" (a deployment, marked already) are listed only.
const MARKED = ["promoted", "held", "rolled_back", "canary"];
const FINAL = ["promoted", "held", "rolled_back", "superseded", "manual"];

const vname = (v) => (v === null ? "base" : "v" + v);

export function decisionMarkers(promos) {
  return promos.flatMap((p) => p.decisions.filter((d) => MARKED.includes(d.decision)).map((d) => ({
    x: d.t, kind: "promo-" + d.decision, short: `${d.decision} ${vname(d.version)}`,
    label: `${when(d.created_at)} ${d.decision} ${version(p.alias, d.version)}: ${d.reason || ""}`,
  })));
}

export function promotionsCard(promos) {
  const out = card("Promotions, holds and evals");
  if (!promos.length) out.append(notice("no alias yet"));
  for (const p of promos) out.append(aliasPart(p));
  return out;
}

function policyLine(policy) {
  const settings = Object.entries(policy).filter(([k]) => !["alias", "mode", "candidate_version", "candidate_since", "eval"].includes(k));
  return [`policy ${policy.mode}`, ...settings.map(([k, v]) => `${k} ${fmt(v)}`),
    policy.candidate_version === null ? "no candidate" : `candidate v${policy.candidate_version} since ${when(policy.candidate_since)}`].join(" · ");
}

function aliasPart(p) {
  const part = h("div", { class: "alias-promotions", dataset: { alias: p.alias } },
    h("h3", null, p.alias), h("p", { class: "muted policy" }, policyLine(p.policy)));
  if (!p.decisions.length && !p.evals.length && !p.attestations.length) {
    part.append(notice("no candidate, eval or attestation yet"));
    return part;
  }
  part.append(h("h4", null, "Versions"), versionsTable(p));
  if (p.decisions.length) {
    part.append(h("h4", null, "Decisions"), table(["time", "version", "serving then", "mode", "decision", "reason"],
      p.decisions.slice().reverse().map((d) => [when(d.created_at), vname(d.version), vname(d.serving_version), d.mode,
        h("span", { class: "decision " + d.decision }, d.decision), d.reason || "–"]), { class: "decisions" }));
  }
  return part;
}

function versionsTable(p) {
  const versions = new Map();
  const at = (v) => versions.get(v) || versions.set(v, { decision: null, evals: [], attestation: null }).get(v);
  for (const d of p.decisions) if (FINAL.includes(d.decision) || d.decision === "canary" || d.decision === "candidate") at(d.version).decision = d.decision;
  for (const e of p.evals) at(e.version).evals.push(e);
  for (const a of p.attestations) at(a.version).attestation = a;
  const order = [...versions.keys()].sort((a, b) => (a === null ? -1 : b === null ? 1 : a - b));
  return table(["version", "latest decision", "evals (mean ± s.e., n)", "attestation"], order.map((v) => {
    const row = versions.get(v);
    return [v === null ? "base" : link("v" + v, "lineage", p.alias, v), row.decision || "–",
      row.evals.length ? h("ul", { class: "evals" }, row.evals.map(evalItem)) : "–", attestation(v, row.attestation)];
  }), { class: "versions" });
}

function evalItem(e) {
  return h("li", { class: "eval", dataset: { version: e.version === null ? "base" : String(e.version), name: e.name,
    mean: String(e.mean), stderr: String(e.stderr), n: String(e.n) } },
  `${e.name}: ${e.mean.toFixed(3)} ± ${e.stderr.toFixed(3)} (n ${e.n}${e.grader ? ", " + e.grader : ""}, ${when(e.created_at)})`);
}

function attestation(v, a) {
  if (v === null) return "–"; // the base model is not attested
  if (!a) return h("span", { class: "attest none" }, "not attested yet");
  const bad = a.excluded_replicas > 0;
  return h("span", { class: "attest " + (bad ? "bad" : "ok"), title: a.sha256 },
    `sha256 ${a.sha256.slice(0, 12)}… · ` + (bad ? `out of rotation on ${a.excluded_replicas} replica(s)` : "serving as attested"));
}
