// Small DOM and fetch helpers shared by the viewer's pages (plain ES modules, no build step).

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export async function api(path) {
  const resp = await fetch(path);
  if (!resp.ok) {
    let msg = resp.statusText;
    try { msg = (await resp.json()).error || msg; } catch (e) { /* not JSON */ }
    throw new ApiError(resp.status, msg);
  }
  return resp.json();
}

export function fmtNum(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (Number.isInteger(x)) return x.toLocaleString("en-US");
  return Number(x).toFixed(digits);
}

export function fmtSecs(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return (s * 1000).toFixed(0) + " ms";
  if (s < 120) return s.toFixed(2) + " s";
  return (s / 60).toFixed(1) + " min";
}

export function fmtTime(ts) {
  if (!ts) return "–";
  return new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19);
}

export function setStatus(text) {
  document.getElementById("status").textContent = text || "";
}

export function showError(target, err) {
  target.replaceChildren(el("p", { class: "err", "data-testid": "error" }, String(err.message || err)));
}

// Colour of a logprob on the heat scale: hue 0 (p≈0, red) .. 120 (p≈1, green).
export function heatHue(lp) { return Math.round(Math.max(0, Math.min(1, Math.exp(lp))) * 120); }

// A sortable header cell: clicking flips the order of an active column or activates it.
export function sortHeader(state, key, label, reload, firstOrder = "asc") {
  const cls = state.sort === key ? "sorted-" + state.order : null;
  return el("th", { class: cls, "data-col": key, "data-testid": "col-" + key,
    onclick: () => {
      if (state.sort === key) state.order = state.order === "asc" ? "desc" : "asc";
      else { state.sort = key; state.order = firstOrder; }
      state.offset = 0; reload();
    } }, label);
}

// Live index changes: calls onChange(event data) when episodes arrive or in-flight ones move.
export function followRun(onChange) {
  const events = new EventSource("/api/events");
  let rows = null, steps = null;
  events.addEventListener("live", (ev) => {
    const d = JSON.parse(ev.data);
    const grew = rows !== null && d.index_rows !== rows;
    const stepsMoved = steps !== null && String(d.steps) !== steps;
    rows = d.index_rows; steps = String(d.steps);
    onChange(d, { grew, stepsMoved });
  });
  return () => events.close();
}
