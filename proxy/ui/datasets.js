// Datasets (read by any key): the list with the versions trained from each, one dataset's items with their pinned
// feedback and rewards, and a version's lineage (what trained it). Creating a dataset is an admin action, confirmed.
import { api, seg } from "./api.js";
import { card, confirmed, fmt, h, link, notice, stat, table, version, when } from "./dom.js";

const trainedLinks = (versions) => (versions.length
  ? versions.flatMap((v, i) => [i ? ", " : null, link(version(v.alias, v.version), "lineage", v.alias, v.version)]) : "–");

export async function datasetsView(root, _args, _params, who) {
  const { data } = await api("/v1/ui/datasets");
  root.append(card("Datasets", data.length ? table(
    ["name", "created", "trajectories", "sessions", "graded", "feedback items", "removed (deleted sessions)", "selected by", "trained versions", "description"],
    data.map((d) => [link(d.name, "dataset", d.name), when(d.created_at), fmt(d.counts.trajectories), fmt(d.counts.sessions),
      fmt(d.counts.graded), fmt(d.counts.feedback), fmt(d.removed), fmt(d.filter), trainedLinks(d.versions), d.description || "–"]),
    { id: "datasets" }) : notice("no datasets yet: create one below (admin keys) or with `onthejob dataset create`")));
  root.append(createForm(who));
}

function createForm(who) {
  const result = h("div", { id: "dataset-result" });
  const field = (name, props) => h("label", null, name.replace("_", " ") + " ", h("input", { name, size: 10, ...props }));
  const form = h("form", { id: "dataset-form", class: "filters" },
    field("name", { required: true, size: 16 }), field("description", { size: 24 }), field("alias"),
    field("tags", { placeholder: "a,b" }), field("min_reward", { size: 5 }), field("max_reward", { size: 5 }),
    h("button", { type: "submit" }, "Create dataset"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const val = (k) => form.elements[k].value.trim();
    const filter = {};
    if (val("alias")) filter.alias = val("alias");
    if (val("tags")) filter.tags = val("tags").split(",").map((t) => t.trim()).filter(Boolean);
    for (const k of ["min_reward", "max_reward"]) if (val(k)) filter[k] = Number(val(k));
    const body = { name: val("name"), description: val("description"), filter };
    await confirmed(result, `Really create dataset ${body.name} from ${JSON.stringify(filter)}? A name is taken for good.`, async () => {
      const made = await api("/v1/admin/datasets", { method: "POST", body });
      return [notice(`done: ${made.name} holds ${made.counts.trajectories} trajectories`, "ok"), " ", link("open it", "dataset", made.name)];
    });
  });
  const hint = who.role === "admin" ? null : notice("this key is not an admin key: the proxy refuses to create a dataset", "placeholder");
  return card("Create a dataset (admin)", hint, form, result);
}

const PAGE = 100;

export async function datasetView(root, args, params) {
  const offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  const d = await api(`/v1/ui/datasets/${seg(args[0])}`, { query: { offset, limit: PAGE } });
  root.append(card(`Dataset ${d.name}`, d.description ? h("p", null, d.description) : null,
    h("div", { class: "stats" }, stat("trajectories", d.counts.trajectories, "ds-trajectories"), stat("sessions", d.counts.sessions, "ds-sessions"),
      stat("graded", d.counts.graded, "ds-graded"), stat("feedback items", d.counts.feedback, "ds-feedback"),
      stat("removed (deleted sessions)", d.removed, "ds-removed")),
    h("p", { class: "muted" }, `created ${when(d.created_at)}; selected by `, fmt(d.filter)),
    h("p", null, "trained versions: ", trainedLinks(d.versions))));
  const rows = d.items.map((it) => [callLink(it.trajectory_id), link(it.session_id, "session", it.session_id), it.task_id || "–", it.role,
    h("span", { class: "reward", dataset: { reward: String(it.reward) } }, fmt(it.reward)), it.reward_feedback_id || "–",
    it.feedback.length ? h("ul", { class: "feedback" }, it.feedback.map((f) => h("li", null, `${f.name} = ${fmt(f.value)} (${f.source || "–"})`))) : "–",
    String(it.completion_ids.length)]);
  const more = (o) => `#/dataset/${encodeURIComponent(d.name)}?offset=${o}`;
  root.append(card(`Items ${d.total_items ? offset + 1 : 0}–${offset + d.items.length} of ${d.total_items} (pinned at creation)`,
    rows.length ? table(["trajectory", "session", "task", "role", "pinned reward", "reward from", "pinned feedback", "calls"], rows, { id: "items" }) : notice("no items"),
    h("div", { class: "pager" }, offset > 0 ? h("a", { href: more(Math.max(0, offset - PAGE)) }, "« previous") : null,
      offset + d.items.length < d.total_items ? h("a", { href: more(offset + PAGE), id: "older" }, "next »") : null)));
}

// A trajectory's id is its leaf call's id (":<n>" after it when one call holds several choices).
function callLink(trajectory) {
  return link(trajectory, "call", trajectory.replace(/:\d+$/, ""));
}

export async function lineageView(root, args) {
  const [alias, v] = args;
  const l = await api(`/v1/ui/aliases/${seg(alias)}/versions/${seg(v)}/lineage`);
  const chain = [l.version, ...l.ancestors].map((n) => version(alias, n)).join(" ← ");
  root.append(card(`Lineage of ${version(alias, l.version)}`,
    h("div", { class: "stats" }, stat("trajectories trained on", l.trajectories.length, "lin-trajectories"),
      stat("feedback items", l.feedback.length, "lin-feedback")),
    table(["", ""], [
      ["weights started from", l.parent_version === null ? "the base model" : link(version(alias, l.parent_version), "lineage", alias, l.parent_version)],
      ["chain", chain + (l.ancestors.length ? " ← base" : "")],
      ["training run", l.training_run_id === null ? "– (recorded outside a run)" : link(String(l.training_run_id), "run", l.training_run_id)],
      ["datasets", l.datasets.length ? l.datasets.flatMap((n, i) => [i ? ", " : null, link(n, "dataset", n)]) : "– (live traffic, or none)"],
    ], { id: "lineage" })));
  const shown = l.used.slice(0, 500);
  root.append(card(`Trajectories and feedback trained on (${l.used.length}${l.used.length > shown.length ? ", first 500 shown" : ""})`,
    shown.length ? table(["trajectory", "feedback item", "objective"], shown.map((u) => [callLink(u.trajectory_id), u.feedback_id || "–", u.objective]), { id: "used" })
      : notice("no training step recorded what it used for this version")));
}
