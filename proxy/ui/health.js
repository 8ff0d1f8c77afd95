// Health: records dropped (must be 0), the spool, each engine replica (in rotation or not) and its adapters,
// monitors and alerts (from GET /v1/admin/alerts once this proxy serves it).
import { api, optional } from "./api.js";
import { card, fmt, h, notice, stat, table, version, when } from "./dom.js";

export async function healthView(root) {
  const hl = await api("/v1/ui/health");
  if (hl.records) {
    const dropped = hl.records.dropped;
    root.append(card("Recording (this proxy process)",
      h("div", { class: "stats" },
        h("div", { class: "stat " + (dropped ? "bad" : "good") }, h("span", { class: "v", dataset: { k: "dropped" } }, fmt(dropped)),
          h("span", { class: "l" }, "records dropped (must be 0)")),
        stat("records spooled", hl.records.spooled, "spooled"), stat("records written", hl.records.written, "written"),
        stat("spool depth", hl.spool.depth, "spool-depth"), stat("oldest spooled (s)", hl.spool.oldest_age_s, "spool-age"),
        stat("spool bytes", hl.spool.bytes, "spool-bytes")),
      hl.spool.full ? notice("the spool is full", "error") : null,
      hl.spool.writable ? null : notice("the spool is not writable", "error")));
  } else {
    root.append(card("Recording", notice("the spool and records dropped count every project's traffic: they are shown to the operator's key (an admin key of the default project)", "placeholder")));
  }
  if (hl.draining) root.append(notice("draining: this process is shutting down", "error"));
  root.append(card("Engine replicas",
    table(["replica", "state", "since", "in flight", "adapters of this project loaded", "missing", "excluded", "last error"],
      hl.replicas.map((r) => [String(r.replica) + (r.url ? ` (${r.url})` : ""), r.state, when(r.since), String(r.inflight),
        r.adapters.join(", ") || "–", r.missing.join(", ") || "–", r.excluded.join(", ") || "–", r.last_error || "–"]), { id: "replicas" })));
  root.append(alerts()); // filled in when GET /v1/admin/alerts answers: not part of the first paint
}

function alerts() {
  const out = card("Monitors and alerts");
  fillAlerts(out).catch((e) => out.append(notice(e.message, "error")));
  return out;
}

async function fillAlerts(out) {
  let data;
  try {
    data = await optional("/v1/admin/alerts", { query: { status: "all" } });
  } catch (e) {
    out.append(notice(e.message)); // a harness key: the proxy serves alerts to admin keys
    return;
  }
  if (data === null) {
    out.append(notice("monitors and alerts are not served by this proxy yet (GET /v1/admin/alerts)", "placeholder"));
    return;
  }
  const items = data.data || [];
  const open = items.filter((a) => a.status === "open").length;
  out.append(h("div", { class: "stats" }, h("div", { class: "stat " + (open ? "bad" : "good") },
    h("span", { class: "v", dataset: { k: "alerts-open" } }, String(open)), h("span", { class: "l" }, "open alerts"))));
  if (items.length) {
    out.append(table(["raised", "last seen", "served by", "kind", "monitor", "status", "value", "baseline", "threshold", "message"],
      items.map((a) => [when(a.created_at), when(a.last_seen_at), version(a.alias, a.version), a.kind, a.name, a.status,
        fmt(a.value), fmt(a.baseline), fmt(a.threshold), a.message || "–"]), { id: "alerts" }));
  }
  out.append(h("p", { class: "muted" }, "monitor windows per alias and version: GET /v1/admin/aliases/{alias}/monitors; `onthejob monitor` computes them"));
}
