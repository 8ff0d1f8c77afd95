// DOM helpers. Recorded text (prompts, replies, comments, ids) is written with text nodes only:
// nothing here parses a string as HTML, and the page's CSP forbids inline script besides.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  append(el, children);
  return el;
}

const SVG = "http://www.w3.org/2000/svg";

export function s(tag, props, ...children) {
  const el = document.createElementNS(SVG, tag);
  setProps(el, props);
  append(el, children);
  return el;
}

function setProps(el, props) {
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "on") {
      for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    } else if (k === "class") {
      el.setAttribute("class", v);
    } else if (k === "dataset") {
      Object.assign(el.dataset, v);
    } else if (k.startsWith("on") || k === "style" || k === "srcdoc") {
      throw new Error(`attribute ${k} is not set from data`);
    } else {
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// A link inside the page: the hash route is built here, each part encoded.
export function link(text, ...parts) {
  return h("a", { href: "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/") }, text);
}

export function table(head, rows, props) {
  return h("table", props, h("thead", null, h("tr", null, head.map((t) => h("th", null, t)))),
    h("tbody", null, rows.map((r) => h("tr", null, r.map((c) => h("td", null, c))))));
}

export function card(title, ...children) {
  return h("section", { class: "card" }, title ? h("h2", null, title) : null, ...children);
}

export function stat(label, value, key) {
  return h("div", { class: "stat" }, h("span", { class: "v", dataset: { k: key } }, fmt(value)), h("span", { class: "l" }, label));
}

export function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(3);
  if (typeof v === "boolean") return v ? "true" : "false";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

export function when(iso) {
  if (!iso) return "–";
  const d = new Date(typeof iso === "number" ? iso * 1000 : iso);
  return d.toISOString().replace("T", " ").slice(0, 19);
}

export function version(alias, v) {
  return v === null || v === undefined ? `${alias}@base` : `${alias}@v${v}`;
}

export function notice(text, kind) {
  return h("p", { class: "notice " + (kind || "") }, text);
}

// An admin action: ask first, then show "working…", then what `run` answers (done) or the proxy's refusal.
export async function confirmed(result, question, run) {
  if (!window.confirm(question)) {
    result.replaceChildren(notice("cancelled"));
    return;
  }
  result.replaceChildren(notice("working…"));
  try {
    result.replaceChildren(...[await run()].flat());
  } catch (e) {
    result.replaceChildren(notice(`refused: ${e.message}`, "error"));
  }
}
