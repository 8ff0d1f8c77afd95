// Control: aliases, adapters (each version links to its lineage) and deployments; deploy a version, roll back or
// set a promotion policy (admin keys, after a confirmation).
// The proxy decides: a harness key's request is refused (403) and the refusal is shown.
import { api, seg } from "./api.js";
import { projectCard } from "./deletion.js";
import { card, confirmed, h, link, notice, table, when } from "./dom.js";

export async function controlView(root, _args, _params, who) {
  const admin = who.role === "admin";
  if (!admin) root.append(notice("this key is not an admin key: the proxy refuses the actions below", "placeholder"));
  let aliases = [];
  let adapters = [];
  let deployments = [];
  try {
    [aliases, adapters, deployments] = (await Promise.all([
      api("/v1/admin/aliases"), api("/v1/admin/adapters"), api("/v1/admin/deployments"),
    ])).map((r) => r.data);
  } catch (e) {
    root.append(notice(e.message, "error"));
  }
  root.append(card("Aliases", aliases.length ? table(["alias", "base model", "serving"],
    aliases.map((a) => [a.name, a.base_model, a.deployed_version === null ? "base" : "v" + a.deployed_version]), { id: "aliases" }) : notice("–")));
  root.append(actionForm(aliases, adapters));
  root.append(card("Adapters", adapters.length ? table(["alias", "version", "parent", "run", "sha256", "created"],
    adapters.map((a) => [a.alias, link("v" + a.version, "lineage", a.alias, a.version), a.parent_version === null ? "–" : "v" + a.parent_version,
      a.training_run_id === null ? "–" : String(a.training_run_id), a.sha256.slice(0, 12), when(a.created_at)]), { id: "adapters" }) : notice("–")));
  root.append(card("Deployments", deployments.length ? table(["time", "alias", "version", "previous", "status"],
    deployments.slice().sort((a, b) => (a.created_at < b.created_at ? 1 : -1)).map((d) => [when(d.created_at), d.alias, d.version === null ? "base" : "v" + d.version,
      d.previous_version === null ? "base" : "v" + d.previous_version, d.status]), { id: "deployments" }) : notice("–")));
  root.append(policies(aliases)); // filled in when its route answers: not part of the first paint
  root.append(projectCard(admin));
}

function actionForm(aliases, adapters) {
  const result = h("div", { id: "action-result" });
  const alias = h("input", { name: "alias", list: "alias-names", required: true, size: 16 });
  const ver = h("input", { name: "version", list: "versions", size: 6, placeholder: "N" });
  const form = h("form", { id: "deploy-form", class: "filters" },
    h("datalist", { id: "alias-names" }, aliases.map((a) => h("option", { value: a.name }))),
    h("datalist", { id: "versions" }, adapters.map((a) => h("option", { value: String(a.version) }, `${a.alias}@v${a.version}`))),
    h("label", null, "alias ", alias), h("label", null, "version ", ver),
    h("button", { type: "submit", id: "deploy" }, "Deploy version"),
    h("button", { type: "button", id: "rollback" }, "Roll back to base"));
  const act = (version) => {
    const what = version === null ? `roll ${alias.value} back to its base model` : `deploy ${alias.value}@v${version}`;
    return confirmed(result, `Really ${what}? Traffic switches as soon as every replica has it.`, async () => {
      const out = await api("/v1/admin/deployments", { method: "POST", body: { alias: alias.value, version } });
      return notice(`done: ${out.alias} now serves ${out.served_model} (deployment ${out.id})`, "ok");
    });
  };
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = parseInt(ver.value, 10);
    if (!Number.isInteger(v) || v < 1) {
      result.replaceChildren(notice("give a version number", "error"));
      return;
    }
    act(v);
  });
  form.querySelector("#rollback").addEventListener("click", () => {
    if (alias.value) act(null);
    else result.replaceChildren(notice("give an alias", "error"));
  });
  return card("Deploy or roll back", form, result);
}

// Promotion policy per alias: the current ones from GET /v1/ui/promotions (any key), set with PUT
// /v1/admin/aliases/{alias}/policy (admin keys, after a confirmation).
function policies(aliases) {
  const out = card("Promotion policy");
  if (aliases.length) fillPolicies(out, aliases).catch((e) => out.append(notice(e.message, "error")));
  else out.append(notice("no alias yet"));
  return out;
}

const MODES = ["auto", "gate", "canary"];
const SETTINGS = { gate: ["margin", "z"], canary: ["share", "min_sample", "margin", "z"], auto: [] };

async function fillPolicies(out, aliases) {
  const known = Object.fromEntries((await api("/v1/ui/promotions")).data.map((p) => [p.alias, p.policy]));
  const shown = (name) => JSON.stringify(known[name] || { alias: name, mode: "auto" }, null, 2);
  const current = h("pre", { class: "content", id: "policy-current" }, shown(aliases[0].name));
  const alias = h("select", { name: "alias" }, aliases.map((a) => h("option", { value: a.name }, a.name)));
  const mode = h("select", { name: "mode" }, MODES.map((m) => h("option", { value: m }, m)));
  const pick = () => {
    current.textContent = shown(alias.value);
    mode.value = (known[alias.value] || { mode: "auto" }).mode;
  };
  pick();
  const inputs = Object.fromEntries(["margin", "z", "share", "min_sample"].map((k) => [k, h("input", { name: k, size: 6, placeholder: "default" })]));
  const result = h("div", { id: "policy-result" });
  const form = h("form", { id: "policy-form", class: "filters" }, h("label", null, "alias ", alias), h("label", null, "mode ", mode),
    Object.entries(inputs).map(([k, el]) => h("label", null, k + " ", el)), h("button", { type: "submit" }, "Set policy"));
  alias.addEventListener("change", pick);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = { mode: mode.value };
    for (const k of SETTINGS[mode.value]) if (inputs[k].value !== "") body[k] = Number(inputs[k].value);
    await confirmed(result, `Really set ${alias.value}'s promotion policy to ${JSON.stringify(body)}?`, async () => {
      const set = await api(`/v1/admin/aliases/${seg(alias.value)}/policy`, { method: "PUT", body });
      known[set.alias] = set;
      current.textContent = shown(set.alias);
      return notice(`done: ${set.alias} is now ${set.mode}`, "ok");
    });
  });
  out.append(form, result, current);
}
