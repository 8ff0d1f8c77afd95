// A completion's token view: every sampled token with its behaviour logprob, and the trajectory it
// belongs to with its mask (1: sampled by the model, 0: prompt, tool output, user turns).
import { api, seg } from "./api.js";
import { card, fmt, h, link, notice, stat, version } from "./dom.js";
import { feedbackList } from "./session.js";

const MAX_CHIPS = 4000;

function bucket(lp) {
  if (lp === null || lp === undefined || Number.isNaN(lp)) return "pn";
  const p = Math.exp(lp);
  return p > 0.9 ? "p4" : p > 0.6 ? "p3" : p > 0.3 ? "p2" : p > 0.1 ? "p1" : "p0";
}

function chip(id, lp, cls) {
  const title = lp === null || lp === undefined ? `token ${id}` : `token ${id} · logprob ${lp} · p ${Math.exp(lp).toFixed(3)}`;
  return h("span", { class: `tok ${cls} ${bucket(lp)}`, title, dataset: { id: String(id), lp: lp === null || lp === undefined ? "" : String(lp) } }, String(id));
}

function sampled(ids, lps) {
  const sum = lps.reduce((a, b) => a + (b || 0), 0);
  return h("div", null,
    h("div", { class: "stats" }, stat("sampled tokens", ids.length, "sampled"),
      stat("sum logprob", lps.length ? sum : null, "lp-sum"), stat("mean logprob", lps.length ? sum / lps.length : null, "lp-mean")),
    h("div", { class: "tokens", id: "sampled" }, ids.slice(0, MAX_CHIPS).map((id, i) => chip(id, lps[i], "smp"))),
    ids.length > MAX_CHIPS ? notice(`first ${MAX_CHIPS} of ${ids.length} tokens shown`) : null);
}

// Contiguous spans of one kind: the prompt, a sampled turn (this call's or another's), context added between turns.
function spans(traj, callId) {
  const own = traj.turns.filter((t) => t.completion_id === callId);
  const kindAt = (i) => {
    if (traj.mask[i]) return own.some((t) => i >= t.start && i < t.end) ? "this" : "smp";
    return i < (traj.turns[0] ? traj.turns[0].start : traj.token_ids.length) ? "ctx" : "gap";
  };
  const out = [];
  for (let i = 0; i < traj.token_ids.length; i++) {
    const k = kindAt(i);
    if (!out.length || out[out.length - 1].kind !== k) out.push({ kind: k, start: i, end: i + 1 });
    else out[out.length - 1].end = i + 1;
  }
  return out;
}

const LABEL = { ctx: "prompt", gap: "context added between turns (tool output, user turns)", smp: "sampled (another call)", this: "sampled by this call" };

function trajectory(traj, callId, alias) {
  const parts = spans(traj, callId);
  let shown = 0;
  const strip = h("div", { class: "tokens traj", id: "trajectory" });
  const texts = [];
  for (const sp of parts) {
    const box = h("span", { class: "span " + sp.kind, title: LABEL[sp.kind] });
    for (let i = sp.start; i < sp.end && shown < MAX_CHIPS; i++, shown++) box.append(chip(traj.token_ids[i], traj.logprobs[i], sp.kind));
    strip.append(box);
    texts.push(sp);
  }
  const decoded = h("div", { class: "decoded" });
  const decode = h("button", { type: "button", id: "decode" }, "Decode each span to text");
  decode.addEventListener("click", async () => {
    decode.disabled = true;
    decoded.replaceChildren();
    for (const sp of texts.slice(0, 40)) {
      try {
        const out = await api("/detokenize", { method: "POST", body: { model: alias, tokens: traj.token_ids.slice(sp.start, sp.end) } });
        decoded.append(h("div", { class: "span-text " + sp.kind }, h("span", { class: "role" }, LABEL[sp.kind]), h("pre", { class: "content" }, out.prompt || "")));
      } catch (e) {
        decoded.append(notice(e.message, "error"));
        break;
      }
    }
  });
  return card(`Trajectory ${traj.id}`,
    h("p", null, `${traj.token_ids.length} tokens · ${traj.mask.filter(Boolean).length} sampled · reward `,
      h("strong", { dataset: { k: "reward" } }, fmt(traj.reward)), traj.flags.length ? ` · flags ${traj.flags.join(", ")}` : ""),
    h("p", { class: "legend" }, Object.entries(LABEL).map(([k, v]) => h("span", { class: "span " + k }, v))),
    strip, shown < traj.token_ids.length ? notice(`first ${MAX_CHIPS} tokens shown`) : null, decode, decoded);
}

export async function callView(root, args) {
  const id = args.join("/");
  const rec = await api(`/v1/chat/completions/${seg(id)}`);
  const o = rec.onthejob;
  const [trajs, fb] = await Promise.all([
    api(`/v1/sessions/${seg(o.session_id)}/trajectories`).catch(() => ({ data: [] })),
    api("/v1/feedback", { query: { completion_id: id } }),
  ]);
  root.append(card(`Call ${id}`,
    h("p", null, "session ", link(o.session_id, "session", o.session_id), ` · ${version(rec.model, o.adapter_version)} · ${o.dialect} · ${o.termination}`,
      ` · prompt ${(o.prompt_token_ids || []).length} tokens`)));
  (o.completion_token_ids || []).forEach((ids, i) => {
    root.append(card(`Choice ${i}`, ids ? sampled(ids, o.logprobs[i] || []) : notice("no token ids captured")));
  });
  root.append(card("Feedback on this call", feedbackList(fb.data)));
  const mine = trajs.data.filter((t) => t.completion_ids.includes(id));
  if (!mine.length) root.append(notice("this call is in no trajectory (see the session's flags)"));
  for (const t of mine) root.append(trajectory(t, id, rec.model));
}
