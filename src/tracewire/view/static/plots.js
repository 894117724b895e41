// Plots drawn locally: reward histogram and mean-reward line as inline SVG, the timing
// waterfall on a canvas (thousands of model calls stay cheap to draw).
const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function frame(w, h) {
  return svg("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, class: "plot" });
}

export function histogram(hist, w, h) {
  const root = frame(w, h);
  const counts = hist.counts || [];
  if (!counts.length) { root.append(svg("text", { x: 10, y: 20, fill: "#888" }, "no data")); return root; }
  const pad = 24, max = Math.max(...counts, 1), bw = (w - 2 * pad) / counts.length;
  counts.forEach((c, i) => {
    const bh = (h - 2 * pad) * c / max;
    const r = svg("rect", { x: pad + i * bw + 1, y: h - pad - bh, width: Math.max(bw - 2, 1),
      height: bh, fill: "#2f6fde", "data-count": c });
    r.append(svg("title", {}, `[${hist.edges[i].toFixed(3)}, ${hist.edges[i + 1].toFixed(3)}): ${c}`));
    root.append(r);
  });
  const lo = hist.edges[0], hi = hist.edges[hist.edges.length - 1];
  root.append(svg("text", { x: pad, y: h - 6, "font-size": 10, fill: "#555" }, lo.toFixed(2)));
  root.append(svg("text", { x: w - pad, y: h - 6, "font-size": 10, fill: "#555", "text-anchor": "end" },
    hi.toFixed(2)));
  root.append(svg("text", { x: pad, y: 14, "font-size": 10, fill: "#555" }, `max ${max}`));
  return root;
}

export function lineChart(series, w, h) {
  const root = frame(w, h);
  const ys = (series.mean || []).filter((y) => y !== null && !Number.isNaN(y));
  if (!ys.length) { root.append(svg("text", { x: 10, y: 20, fill: "#888" }, "no data")); return root; }
  const pad = 24;
  let lo = Math.min(...ys), hi = Math.max(...ys);
  if (hi === lo) { lo -= 0.5; hi += 0.5; }
  const n = series.mean.length;
  const pts = series.mean.map((y, i) => [
    pad + (n === 1 ? 0.5 : i / (n - 1)) * (w - 2 * pad),
    h - pad - ((y - lo) / (hi - lo)) * (h - 2 * pad)]);
  root.append(svg("polyline", { points: pts.map((p) => p.join(",")).join(" "), fill: "none",
    stroke: "#27ae60", "stroke-width": 2 }));
  pts.forEach(([x, y], i) => {
    const c = svg("circle", { cx: x, cy: y, r: 2.5, fill: "#27ae60" });
    c.append(svg("title", {}, `mean ${series.mean[i].toFixed(3)} over ${series.n[i]} episodes`));
    root.append(c);
  });
  root.append(svg("text", { x: 2, y: pad, "font-size": 10, fill: "#555" }, hi.toFixed(2)));
  root.append(svg("text", { x: 2, y: h - pad, "font-size": 10, fill: "#555" }, lo.toFixed(2)));
  root.append(svg("text", { x: w - pad, y: h - 6, "font-size": 10, fill: "#555", "text-anchor": "end" },
    "arrival →"));
  return root;
}

// One value per training step (x = step numbers; null values are gaps), as a line.
export function stepChart(steps, values, w, h, colour, what) {
  const root = frame(w, h);
  const pts = [];
  steps.forEach((x, i) => { const y = values[i]; if (y !== null && !Number.isNaN(y)) pts.push([x, y]); });
  if (!pts.length) { root.append(svg("text", { x: 10, y: 20, fill: "#888" }, "no data")); return root; }
  const pad = 24;
  let lo = Math.min(...pts.map((p) => p[1])), hi = Math.max(...pts.map((p) => p[1]));
  if (hi === lo) { lo -= 0.5; hi += 0.5; }
  const x0 = Math.min(...steps), x1 = Math.max(...steps);
  const X = (x) => pad + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (w - 2 * pad);
  const Y = (y) => h - pad - ((y - lo) / (hi - lo)) * (h - 2 * pad);
  root.append(svg("polyline", { points: pts.map(([x, y]) => `${X(x)},${Y(y)}`).join(" "),
    fill: "none", stroke: colour, "stroke-width": 2 }));
  for (const [x, y] of pts) {
    const c = svg("circle", { cx: X(x), cy: Y(y), r: 2.5, fill: colour, "data-step": x, "data-value": y });
    c.append(svg("title", {}, `step ${x}: ${what} ${y.toFixed(4)}`));
    root.append(c);
  }
  root.append(svg("text", { x: 2, y: pad, "font-size": 10, fill: "#555" }, hi.toFixed(2)));
  root.append(svg("text", { x: 2, y: h - pad, "font-size": 10, fill: "#555" }, lo.toFixed(2)));
  root.append(svg("text", { x: w - pad, y: h - 6, "font-size": 10, fill: "#555", "text-anchor": "end" },
    "step →"));
  return root;
}

const FINISH_COLOURS = { stop: "#27ae60", tool_calls: "#8e44ad", length: "#e67e22", error: "#c0392b" };

// Phases get one lane each; calls get one lane each when few, else share lanes packed greedily.
export function waterfall(canvas, timing, now) {
  const phases = timing.phases || [];
  const cs = timing.calls || { start: [], end: [], finish: [], node: [] };
  const n = cs.start.length;
  let t0 = Infinity, t1 = -Infinity;
  const upd = (s, e) => { if (s !== null && !Number.isNaN(s)) { t0 = Math.min(t0, s); t1 = Math.max(t1, e ?? s); } };
  for (const p of phases) upd(p.start, p.end ?? now);
  for (let i = 0; i < n; i++) upd(cs.start[i], cs.end[i] ?? now);
  const callLanes = n <= 40 ? n : Math.min(40, Math.ceil(n / 50));
  const lanes = phases.length + callLanes;
  const laneH = 16, labelW = 130;
  const width = canvas.clientWidth || 800;
  canvas.width = width; canvas.height = Math.max(lanes, 1) * laneH + 20;
  const g = canvas.getContext("2d");
  g.font = "11px sans-serif"; g.fillStyle = "#fff"; g.fillRect(0, 0, canvas.width, canvas.height);
  if (!Number.isFinite(t0)) { g.fillStyle = "#888"; g.fillText("no timing recorded", 8, 14); return; }
  const span = Math.max(t1 - t0, 1e-6), plotW = width - labelW - 10;
  const X = (t) => labelW + ((t - t0) / span) * plotW;
  phases.forEach((p, i) => {
    const y = i * laneH;
    g.fillStyle = "#333"; g.fillText(`${p.scope}:${p.name}`, 4, y + 12);
    g.fillStyle = p.scope === "episode" ? "#95a5a6" : "#3498db";
    const e = p.end ?? now;
    g.fillRect(X(p.start), y + 3, Math.max(X(e) - X(p.start), 1), laneH - 6);
  });
  const laneEnd = new Array(callLanes).fill(-Infinity);
  for (let i = 0; i < n; i++) {
    const s = cs.start[i]; if (s === null || Number.isNaN(s)) continue;
    const e = cs.end[i] ?? now;
    let lane = n <= 40 ? i : laneEnd.findIndex((le) => le <= s);
    if (lane < 0) lane = i % callLanes;
    laneEnd[lane] = e;
    const y = (phases.length + lane) * laneH;
    if (n <= 40) { g.fillStyle = "#333"; g.fillText(`call ${i} → node ${cs.node[i]}`, 4, y + 12); }
    g.fillStyle = FINISH_COLOURS[cs.finish[i]] || "#7f8c8d";
    g.fillRect(X(s), y + 3, Math.max(X(e) - X(s), 1), laneH - 6);
  }
  if (n > 40) { g.fillStyle = "#333"; g.fillText(`${n} calls`, 4, phases.length * laneH + 12); }
  g.fillStyle = "#555";
  g.fillText(`0`, labelW, canvas.height - 4);
  g.textAlign = "right"; g.fillText(`${span.toFixed(2)} s`, width - 10, canvas.height - 4);
}
