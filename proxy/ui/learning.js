// Learning: reward over time per alias and version with deployments and rollbacks on the time axis,
// training runs, and one run's steps (loss, reward, importance-ratio statistics, exclusions by reason).
import { api, optional, seg } from "./api.js";
import { lineChart } from "./chart.js";
import { card, fmt, h, link, notice, table, version, when } from "./dom.js";

function markers(events) {
  return events.map((e) => ({
    x: e.t, kind: e.kind,
    short: e.version === null ? "base" : "v" + e.version,
    label: `${when(e.created_at)} ${e.kind} ${version(e.alias, e.version)} (was ${e.previous_version === null ? "base" : "v" + e.previous_version}; ${e.status})`,
  }));
}

export async function learningView(root, _args, params) {
  const alias = params.get("alias");
  const data = await api("/v1/ui/learning", { query: { alias } });
  const series = data.series.map((se) => ({ key: se.key, points: se.points.map((p) => ({ x: p.t, y: p.mean, n: p.n })) }));
  const chart = h("div", { id: "reward-chart" }, lineChart(series, { markers: markers(data.events), xTime: true, title: "mean reward per time bucket" }));
  root.append(card("Reward over time",
    h("p", { class: "muted" }, `each feedback item's scalar under the project's reward rule, on the version that served it; up to ${data.per_bucket} items per time bucket (the newest in it), ${data.points} scored`),
    chart));
  root.append(card("Deployments and rollbacks",
    data.events.length ? table(["time", "alias", "version", "previous", "kind", "status"],
      data.events.slice().reverse().map((e) => [when(e.created_at), e.alias, e.version === null ? "base" : "v" + e.version,
        e.previous_version === null ? "base" : "v" + e.previous_version, e.kind, e.status]), { id: "events" }) : notice("no deployments yet")));
  // Filled in when issue 17's routes answer (not part of the first paint); its decisions join the chart's markers.
  root.append(promotions(data.events, (decisions) => chart.replaceChildren(lineChart(series, {
    markers: [...markers(data.events), ...decisions], xTime: true, title: "mean reward per time bucket" }))));
  root.append(card("Training runs",
    data.runs.length ? table(["run", "alias", "objective", "status", "started", "steps", "last version", "last loss", "last reward"],
      data.runs.map((r) => [link(String(r.id), "run", r.id), r.alias, r.objective, r.status, when(r.started_at), String(r.steps),
        r.last_version === null ? "–" : "v" + r.last_version, fmt(r.last_metrics && r.last_metrics.loss),
        fmt(r.last_metrics && r.last_metrics.reward_mean)]), { id: "runs" }) : notice("no training runs yet")));
}

// Promotion policies, decisions (promotions, holds, rollbacks) and evals per version come with the promotion
// work (issue 17): shown from its routes when this proxy serves them (admin keys), a placeholder until then.
function promotions(deployments, onDecisions) {
  const out = card("Promotions, holds and evals");
  fillPromotions(out, deployments, onDecisions).catch((e) => out.append(notice(e.message, "error")));
  return out;
}

async function fillPromotions(out, deployments, onDecisions) {
  const aliases = [...new Set(deployments.map((e) => e.alias))].slice(0, 10);
  if (!aliases.length) {
    out.append(notice("no alias has been deployed yet"));
    return;
  }
  const decisions = [];
  for (const a of aliases) {
    let policy;
    try {
      policy = await optional(`/v1/admin/aliases/${seg(a)}/policy`);
    } catch (e) {
      out.append(notice(`${a}: ${e.message}`));
      continue;
    }
    if (policy === null) {
      out.append(notice("promotion policies and evals are not served by this proxy yet (GET /v1/admin/aliases/{alias}/policy)", "placeholder"));
      return;
    }
    out.append(h("h3", null, `${a} · policy ${policy.mode}`, policy.candidate_version ? ` · candidate v${policy.candidate_version}` : ""));
    const promos = await optional(`/v1/admin/aliases/${seg(a)}/promotions`).catch(() => null);
    if (promos && promos.data.length) {
      out.append(table(["time", "version", "serving", "mode", "decision", "reason"], promos.data.slice().reverse().map((d) =>
        [when(d.created_at), d.version === null ? "base" : "v" + d.version, d.serving_version === null ? "base" : "v" + d.serving_version,
          d.mode, d.decision, d.reason || "–"]), { class: "decisions" }));
      for (const d of promos.data) {
        decisions.push({ x: Date.parse(d.created_at) / 1000, kind: "promo-" + String(d.decision).replace(/[^a-z_]/g, ""),
          short: d.decision, label: `${when(d.created_at)} ${d.decision} ${version(a, d.version)}: ${d.reason || ""}` });
      }
    }
    const versions = [...new Set([...deployments.filter((e) => e.alias === a).map((e) => e.version),
      ...(promos ? promos.data.map((d) => d.version) : [])])];
    const rows = [];
    for (const v of versions.slice(-6)) {
      const vname = v === null ? "base" : String(v);
      const evals = await optional(`/v1/admin/aliases/${seg(a)}/versions/${seg(vname)}/evals`).catch(() => null);
      for (const e of (evals && evals.data) || []) rows.push([v === null ? "base" : "v" + v, e.name, String(e.n), fmt(e.mean), fmt(e.stderr), e.grader || "–"]);
    }
    if (rows.length) out.append(table(["version", "eval", "n", "mean", "stderr", "grader"], rows, { class: "evals" }));
  }
  if (decisions.length) onDecisions(decisions);
}

const METRICS = [["loss"], ["reward_mean"], ["ratio_mean", "ratio_max"], ["clipped_frac"], ["ess"], ["kl_mu_pi"]];

export async function runView(root, args) {
  const run = await api(`/v1/ui/runs/${seg(args[0])}`);
  root.append(card(`Run ${run.id} · ${run.alias} · ${run.objective} · ${run.status}`,
    h("p", { class: "muted" }, `${run.steps.length} steps`)));
  const charts = h("div", { class: "grid" });
  for (const keys of METRICS) {
    const series = keys.map((k) => ({ key: k, points: run.steps.filter((s) => typeof s.metrics[k] === "number").map((s) => ({ x: s.step, y: s.metrics[k] })) }));
    if (series.some((se) => se.points.length)) charts.append(lineChart(series, { title: keys.join(" / ") + " per step" }));
  }
  root.append(card("Step metrics", charts));
  const reasons = [...new Set(run.steps.flatMap((s) => Object.keys(s.metrics.excluded || {})))].sort();
  root.append(card("Steps and exclusions by reason",
    table(["step", "version", "time", "trajectories", "tokens", "loss", "reward", "ratio mean", "ratio max", ...reasons],
      run.steps.map((s) => [String(s.step), s.adapter_version === null ? "–" : "v" + s.adapter_version, when(s.created_at),
        fmt(s.metrics.trajectories), fmt(s.metrics.tokens), fmt(s.metrics.loss), fmt(s.metrics.reward_mean),
        fmt(s.metrics.ratio_mean), fmt(s.metrics.ratio_max), ...reasons.map((r) => fmt((s.metrics.excluded || {})[r] || 0))]), { id: "steps" })));
}
