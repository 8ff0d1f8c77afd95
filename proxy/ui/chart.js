// A small SVG line chart: series of {x, y} points, optional vertical markers (deployments, rollbacks, promotion
// decisions), each kind in the legend.
import { h, s } from "./dom.js";

const W = 720;
const H = 220;
const PAD = { l: 48, r: 12, t: 12, b: 28 };

function scale(lo, hi, a, b) {
  const span = hi - lo || 1;
  return (v) => a + ((v - lo) / span) * (b - a);
}

export function lineChart(series, { markers = [], xTime = false, title = "" } = {}) {
  const pts = series.flatMap((se) => se.points);
  if (!pts.length) return h("p", { class: "muted" }, `no data for ${title || "this chart"} yet`);
  const xs = [...pts.map((p) => p.x), ...markers.map((m) => m.x)];
  const ys = pts.map((p) => p.y).filter((y) => Number.isFinite(y));
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.min(...ys, 0), Math.max(...ys, 0)];
  const X = scale(x0, x1, PAD.l, W - PAD.r);
  const Y = scale(y0, y1, H - PAD.b, PAD.t);
  const fx = (v) => (xTime ? new Date(v * 1000).toISOString().slice(5, 16).replace("T", " ") : String(Math.round(v)));
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title },
    s("line", { x1: PAD.l, x2: W - PAD.r, y1: Y(0), y2: Y(0), class: "axis" }),
    s("line", { x1: PAD.l, x2: PAD.l, y1: PAD.t, y2: H - PAD.b, class: "axis" }),
    [y0, y1].map((v) => s("text", { x: PAD.l - 4, y: Y(v) + 4, class: "tick", "text-anchor": "end" }, v.toPrecision(3))),
    [x0, x1].map((v, i) => s("text", { x: X(v), y: H - 8, class: "tick", "text-anchor": i ? "end" : "start" }, fx(v))));
  for (const m of markers) {
    svg.append(s("g", { class: "marker " + m.kind },
      s("line", { x1: X(m.x), x2: X(m.x), y1: PAD.t, y2: H - PAD.b }),
      s("title", null, m.label),
      s("text", { x: X(m.x) + 2, y: PAD.t + 10, class: "tick" }, m.short || "")));
  }
  series.forEach((se, i) => {
    const cls = "s" + (i % 6);
    const d = se.points.filter((p) => Number.isFinite(p.y)).map((p, j) => `${j ? "L" : "M"}${X(p.x).toFixed(1)},${Y(p.y).toFixed(1)}`).join("");
    svg.append(s("path", { d, class: "line " + cls }));
    for (const p of se.points) {
      if (Number.isFinite(p.y)) svg.append(s("circle", { cx: X(p.x), cy: Y(p.y), r: 2.5, class: "dot " + cls }, s("title", null, `${se.key}: ${p.y.toFixed(3)}${p.n ? ` (n=${p.n})` : ""}`)));
    }
  });
  const kinds = [...new Set(markers.map((m) => m.kind))];
  const legend = h("div", { class: "legend" }, series.map((se, i) => h("span", { class: "key s" + (i % 6) }, se.key)),
    kinds.map((k) => h("span", { class: "key " + k }, k.replace(/^promo-/, "").replace("_", " "))));
  return h("figure", { class: "chart" }, title ? h("figcaption", null, title) : null, svg, legend);
}
