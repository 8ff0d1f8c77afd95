// Learning: reward over time per alias and version with deployments, rollbacks and promotion decisions on the
// time axis, promotions and evals per version (promotions.js), training runs, and one run's steps (loss, reward,
// importance-ratio statistics, exclusions by reason).
import { api, seg } from "./api.js";
import { lineChart } from "./chart.js";
import { card, fmt, h, link, notice, table, version, when } from "./dom.js";
import { decisionMarkers, promotionsCard } from "./promotions.js";

function markers(events) {
  return events.map((e) => ({
    x: e.t, kind: e.kind,
    short: e.version === null ? "base" : "v" + e.version,
    label: `${when(e.created_at)} ${e.kind} ${version(e.alias, e.version)} (was ${e.previous_version === null ? "base" : "v" + e.previous_version}; ${e.status})`,
  }));
}

export async function learningView(root, _args, params) {
  const alias = params.get("alias");
  const [data, promos] = await Promise.all([api("/v1/ui/learning", { query: { alias } }), api("/v1/ui/promotions", { query: { alias } })]);
  const series = data.series.map((se) => ({ key: se.key, points: se.points.map((p) => ({ x: p.t, y: p.mean, n: p.n })) }));
  const marks = [...markers(data.events), ...decisionMarkers(promos.data)];
  root.append(card("Reward over time",
    h("p", { class: "muted" }, `each feedback item's scalar under the project's reward rule, on the version that served it; up to ${data.per_bucket} items per time bucket (the newest in it), ${data.points} scored`),
    h("div", { id: "reward-chart" }, lineChart(series, { markers: marks, xTime: true, title: "mean reward per time bucket" }))));
  root.append(card("Deployments and rollbacks",
    data.events.length ? table(["time", "alias", "version", "previous", "kind", "status"],
      data.events.slice().reverse().map((e) => [when(e.created_at), e.alias, e.version === null ? "base" : "v" + e.version,
        e.previous_version === null ? "base" : "v" + e.previous_version, e.kind, e.status]), { id: "events" }) : notice("no deployments yet")));
  root.append(promotionsCard(promos.data));
  root.append(card("Training runs",
    data.runs.length ? table(["run", "alias", "objective", "status", "started", "steps", "last version", "last loss", "last reward"],
      data.runs.map((r) => [link(String(r.id), "run", r.id), r.alias, r.objective, r.status, when(r.started_at), String(r.steps),
        r.last_version === null ? "–" : link("v" + r.last_version, "lineage", r.alias, r.last_version), fmt(r.last_metrics && r.last_metrics.loss),
        fmt(r.last_metrics && r.last_metrics.reward_mean)]), { id: "runs" }) : notice("no training runs yet")));
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
