// Keyboard navigation shared by every page. A page registers its keys with setKeys() (they
// are dropped when the route changes); tables get j/k (or ↓/↑) to move a row cursor and
// Enter to open the row. "?" lists the keys of the page.
import { el } from "./util.js";

const GLOBAL = { i: ["index", () => { location.hash = "#/"; }],
  g: ["groups", () => { location.hash = "#/groups"; }],
  c: ["run against run", () => { location.hash = "#/compare"; }] };
let pageKeys = {};
let cursor = null;  // { rows: () => Element[], at: number }

export function setKeys(keys) { pageKeys = keys || {}; }
export function resetKeys() { pageKeys = {}; cursor = null; document.getElementById("keys-help")?.remove(); }

// Row navigation over the rows a function returns (re-evaluated, since tables re-render).
export function tableNav(rows) {
  cursor = { rows, at: -1 };
}

function moveCursor(delta) {
  const rows = cursor.rows();
  if (!rows.length) return;
  cursor.at = Math.max(0, Math.min(rows.length - 1, cursor.at + delta));
  rows.forEach((r, i) => r.classList.toggle("kbd", i === cursor.at));
  rows[cursor.at].scrollIntoView({ block: "nearest" });
}

function help() {
  const old = document.getElementById("keys-help");
  if (old) { old.remove(); return; }
  const all = { ...Object.fromEntries(Object.entries(GLOBAL).map(([k, [d]]) => [k, d])),
    ...(cursor ? { "j / ↓": "next row", "k / ↑": "previous row", Enter: "open row" } : {}),
    ...Object.fromEntries(Object.entries(pageKeys).map(([k, [d]]) => [k, d])), "?": "this help" };
  document.body.append(el("div", { id: "keys-help", class: "card keys-help", "data-testid": "keys-help" },
    el("b", {}, "keys"), el("dl", { class: "kv" }, ...Object.entries(all).flatMap(([k, d]) => [
      el("dt", {}, el("kbd", {}, k)), el("dd", {}, d)]))));
}

document.addEventListener("keydown", (ev) => {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const t = ev.target;
  if (t && (t.tagName === "INPUT" || t.tagName === "SELECT" || t.tagName === "TEXTAREA")) return;
  const k = ev.key;
  if (k === "?") { help(); ev.preventDefault(); return; }
  if (cursor && (k === "j" || k === "ArrowDown")) { moveCursor(1); ev.preventDefault(); return; }
  if (cursor && (k === "k" || k === "ArrowUp")) { moveCursor(-1); ev.preventDefault(); return; }
  if (cursor && k === "Enter" && cursor.at >= 0) {
    const row = cursor.rows()[cursor.at];
    if (row) { row.click(); ev.preventDefault(); }
    return;
  }
  const hit = pageKeys[k] || GLOBAL[k];
  if (hit) { hit[1](); ev.preventDefault(); }
});
