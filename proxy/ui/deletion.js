// Deleting recorded data and keeping it for a while: a session (on its page), an end user's sessions and the
// project's retention (on Control). Admin actions, each after a confirmation; the answer names the versions
// that learned from what was deleted (their weights still hold it: retrain without it, or roll back).
import { api, seg } from "./api.js";
import { card, confirmed, fmt, h, link, notice, version } from "./dom.js";

function learned(adapters) {
  if (!adapters.length) return "no version learned from it";
  return h("span", null, "learned from it: ", adapters.flatMap((a, i) => [i ? ", " : null,
    link(version(a.alias, a.version), "lineage", a.alias, a.version), a.direct ? "" : " (through its parent)"]));
}

function deleted(out, ...more) {
  const d = out.deleted;
  return h("p", { class: "notice ok" }, `done: deleted ${d.calls} calls, ${d.feedback} feedback items, ${d.dataset_items} dataset items; `,
    ...more, "; ", learned(out.adapters));
}

export function deleteSessionCard(id) {
  const result = h("div", { id: "delete-result" });
  const button = h("button", { type: "button", id: "delete-session" }, "Delete this session");
  button.addEventListener("click", () => confirmed(result,
    `Really delete session ${id}: its calls, feedback and flags, for good?`, async () => {
      const out = await api(`/v1/admin/sessions/${seg(id)}`, { method: "DELETE" });
      return deleted(out);
    }));
  return card("Delete (admin)", button, result);
}

const kept = (settings) => (settings.retention_days ? `now: ${settings.retention_days} days` : "now: kept forever");

export function projectCard(admin) {
  const out = card("Retention and end users (admin)");
  const days = h("input", { name: "retention_days", size: 6, placeholder: "keep" });
  const keepResult = h("div", { id: "retention-result" });
  const now = h("span", { class: "muted", id: "retention-current" });
  const keep = h("form", { id: "retention-form", class: "filters" }, h("label", null, "keep raw calls for days ", days),
    h("button", { type: "submit" }, "Set retention"), now);
  keep.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = days.value.trim() === "" ? null : Number(days.value);
    const what = value === null ? "keep raw calls forever" : `delete raw calls and their feedback after ${value} days`;
    confirmed(keepResult, `Really ${what}?`, async () => {
      const set = await api("/v1/admin/project", { method: "PUT", body: { retention_days: value } });
      now.textContent = kept(set.settings);
      return notice(`done: retention_days ${fmt(set.settings.retention_days)}`, "ok");
    });
  });
  const user = h("input", { name: "end_user", size: 20, required: true });
  const userResult = h("div", { id: "end-user-result" });
  const forget = h("form", { id: "end-user-form", class: "filters" }, h("label", null, "end user ", user),
    h("button", { type: "submit" }, "Delete their sessions"));
  forget.addEventListener("submit", (ev) => {
    ev.preventDefault();
    confirmed(userResult, `Really delete every session of end user ${user.value}, for good?`, async () => {
      const gone = await api(`/v1/admin/end-users/${seg(user.value)}`, { method: "DELETE" });
      return deleted(gone, `${gone.sessions.length} session(s)`);
    });
  });
  out.append(keep, keepResult, forget, userResult);
  if (admin) {
    api("/v1/admin/project").then((p) => { now.textContent = kept(p.settings); }).catch((e) => out.append(notice(e.message, "error")));
  }
  return out;
}
