// One session: its turns (the messages each call added, tool calls and results, the reply),
// the feedback on each call with its history, and a link to each completion's token view.
import { api, seg } from "./api.js";
import { deleteSessionCard } from "./deletion.js";
import { card, fmt, h, link, notice, version, when } from "./dom.js";

function text(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (p && typeof p.text === "string" ? p.text : JSON.stringify(p))).join("\n");
  return JSON.stringify(content);
}

function toolCalls(calls) {
  return (calls || []).map((tc) => h("div", { class: "toolcall" },
    h("span", { class: "tag" }, "tool call"), " ", h("code", null, (tc.function && tc.function.name) || "?"),
    " ", h("code", { class: "args" }, (tc.function && tc.function.arguments) || ""),
    tc.id ? h("span", { class: "muted" }, ` (${tc.id})`) : null));
}

export function message(m) {
  const role = m.role || "?";
  return h("div", { class: "msg role-" + role.replace(/[^a-z]/g, "") },
    h("span", { class: "role" }, role + (m.tool_call_id ? ` → ${m.tool_call_id}` : "")),
    h("pre", { class: "content" }, text(m.content)),
    toolCalls(m.tool_calls));
}

export function feedbackList(items) {
  if (!items.length) return h("p", { class: "muted" }, "no feedback");
  return h("ul", { class: "feedback" }, items.map((f) => h("li", { class: f.current ? "current" : "superseded" },
    h("code", null, f.name), " = ", h("strong", null, fmt(f.value)),
    f.target && f.target.choice !== undefined ? ` (choice ${f.target.choice})` : "",
    f.source ? h("span", { class: "muted" }, ` from ${f.source}`) : null,
    " ", h("span", { class: "muted" }, when(f.created_at)),
    f.current ? null : h("span", { class: "tag" }, "superseded"),
    f.status === "pending" ? h("span", { class: "tag" }, "pending") : null,
    f.comment ? h("blockquote", { class: "comment" }, f.comment) : null)));
}

export async function sessionView(root, args, _params, who) {
  const id = args.join("/");
  const [session, turns] = await Promise.all([
    api(`/v1/sessions/${seg(id)}`),
    api(`/v1/ui/sessions/${seg(id)}/turns`),
  ]);
  const byCall = {};
  const onSession = [];
  for (const f of session.feedback) {
    if (f.completion_id) (byCall[f.completion_id] = byCall[f.completion_id] || []).push(f);
    else onSession.push(f);
  }
  root.append(card(`Session ${id}`,
    h("p", null, `task ${session.task_id || "–"} · found by ${session.source || "–"} · tags ${session.tags.join(" ") || "–"} · `,
      `${turns.data.length} calls · ${when(session.created_at)} → ${when(session.updated_at)}`),
    h("h3", null, "Feedback on the whole session"), feedbackList(onSession)));
  turns.data.forEach((t, i) => {
    root.append(h("section", { class: "card turn", dataset: { call: t.id } },
      h("h3", null, `Turn ${i + 1} · `, link(t.id, "call", t.id), ` · ${version(t.alias, t.adapter_version)} · ${t.termination}`,
        t.status_code >= 400 ? ` · HTTP ${t.status_code}` : "", h("span", { class: "muted" }, ` ${when(t.created_at)}`)),
      t.tools.length ? h("p", { class: "muted" }, "tools offered: " + t.tools.join(", ")) : null,
      t.error ? notice(t.error, "error") : null,
      h("div", { class: "msgs" }, t.messages.map(message)),
      t.choices.map((c) => h("div", { class: "reply" },
        h("span", { class: "role" }, `reply${t.choices.length > 1 ? " " + c.index : ""} · ${c.finish_reason || "–"} · ${c.tokens} tokens`),
        c.message ? message({ role: "assistant", ...c.message }) : h("pre", { class: "content" }, c.text || ""))),
      h("h4", null, "Feedback"), feedbackList(byCall[t.id] || []),
      h("p", null, link("token view →", "call", t.id))));
  });
  if (!turns.data.length) root.append(notice("no recorded calls"));
  if (who.role === "admin") root.append(deleteSessionCard(id));
}
