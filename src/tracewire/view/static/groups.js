// Groups of rollouts: the list (filtered by reward spread, sorted, paged by the server) and one
// group's rollouts side by side with their rewards and group-normalized advantages. Both
// follow the run live: new episodes of the run reload them, in-flight members are listed.
import { api, el, fmtNum, fmtSecs, followRun, setStatus, sortHeader } from "./util.js";
import { setKeys, tableNav } from "./keys.js";

const FILTERS = ["spread", "env", "q", "step_min", "step_max"];

export const groupHash = (key) => "#/groups/" + encodeURIComponent(key);

// Member rewards as dots on a 0..1-wide strip (min..max of the run's rewards shown).
function dots(rewards, lo, hi) {
  const w = 120, h = 14, NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "dots");
  const span = hi > lo ? hi - lo : 1;
  for (const r of rewards) {
    if (r === null) continue;
    const c = document.createElementNS(NS, "circle");
    c.setAttribute("cx", 4 + ((r - lo) / span) * (w - 8)); c.setAttribute("cy", h / 2);
    c.setAttribute("r", 3.5); c.setAttribute("fill", "#2f6fde80");
    svg.append(c);
  }
  return svg;
}

export async function renderGroups(app, params) {
  const [facets] = await Promise.all([api("/api/facets")]);
  const state = { sort: params.get("sort") || "arrival", order: params.get("order") || "asc",
    offset: Number(params.get("offset") || 0), limit: 50 };
  for (const f of FILTERS) state[f] = params.get(f) || "";
  const summary = el("div", { class: "muted", "data-testid": "group-summary" });
  const table = el("table", { class: "grid", "data-testid": "group-table" });
  const pager = el("div", { class: "pager" });
  const input = (name, label, type) => el("label", {}, label,
    el("input", { name, type, value: state[name], step: "any", "data-testid": "gfilter-" + name }));
  const form = el("form", { class: "filters", "data-testid": "group-filters" },
    el("label", {}, "reward spread", el("select", { name: "spread", "data-testid": "gfilter-spread" },
      ...[["", "any"], ["mixed", "mixed (GRPO learns from these)"], ["equal", "all equal"]].map(([v, l]) =>
        el("option", { value: v, selected: state.spread === v }, l)))),
    el("label", {}, "env", el("select", { name: "env", "data-testid": "gfilter-env" },
      el("option", { value: "" }, "any"),
      ...(facets.env || []).map((v) => el("option", { value: v, selected: state.env === v }, v)))),
    input("q", "task contains", "search"), input("step_min", "step ≥", "number"),
    input("step_max", "step ≤", "number"),
    el("button", { type: "submit", "data-testid": "gapply" }, "apply"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const fd = new FormData(form);
    for (const f of FILTERS) state[f] = String(fd.get(f) || "");
    state.offset = 0; load();
  });
  form.addEventListener("change", (ev) => { if (ev.target.tagName === "SELECT") form.requestSubmit(); });
  app.replaceChildren(el("h2", {}, "Groups of rollouts"), summary, form, pager, table);

  const query = () => {
    const p = new URLSearchParams();
    for (const k of ["sort", "order", "offset", ...FILTERS]) if (state[k] !== "" && state[k] !== 0) p.set(k, state[k]);
    return p;
  };
  let seq = 0;
  async function load() {
    const mine = ++seq;
    const p = query();
    history.replaceState(null, "", "#/groups" + (p.toString() ? "?" + p : ""));
    const data = await api("/api/groups?" + p.toString() + "&limit=" + state.limit);
    if (mine !== seq) return;
    summary.textContent = `${fmtNum(data.groups)} groups: ${fmtNum(data.mixed)} with mixed rewards, ` +
      `${fmtNum(data.equal)} all equal` + (data.total !== data.groups ? ` · ${fmtNum(data.total)} shown by the filter` : "");
    let lo = Infinity, hi = -Infinity;
    for (const r of data.rows) { if (r.min !== null) lo = Math.min(lo, r.min); if (r.max !== null) hi = Math.max(hi, r.max); }
    const head = (k, l, first) => sortHeader(state, k, l, load, first);
    const showStep = data.rows.some((r) => r.step_min !== null);
    const carry = () => { const q = new URLSearchParams(); for (const f of FILTERS) if (state[f]) q.set(f, state[f]); return q.toString(); };
    table.replaceChildren(
      el("thead", {}, el("tr", {}, head("task_key", "task"), el("th", {}, "env"), head("n", "n", "desc"),
        head("mean", "mean reward", "desc"), head("std", "std", "desc"), head("spread", "spread", "desc"),
        el("th", {}, "rewards"), showStep ? el("th", {}, "step") : null, head("arrival", "first"))),
      el("tbody", {}, ...data.rows.map((r) => el("tr", { class: "clickable", "data-testid": "group-row",
        "data-group": r.group, onclick: () => { location.hash = groupHash(r.group) + (carry() ? "?" + carry() : ""); } },
      el("td", { title: r.group }, r.task_key ?? "–"), el("td", {}, r.env ?? "–"),
      el("td", { class: "num" }, fmtNum(r.n)), el("td", { class: "num", "data-testid": "group-mean" }, fmtNum(r.mean)),
      el("td", { class: "num" }, fmtNum(r.std)), el("td", { class: "num" }, fmtNum(r.spread)),
      el("td", {}, dots(r.rewards, lo, hi)),
      showStep ? el("td", { class: "num" }, r.step_min === r.step_max ? fmtNum(r.step_min) : `${fmtNum(r.step_min)}–${fmtNum(r.step_max)}`) : null,
      el("td", { class: "num" }, fmtNum(r.first))))));
    const last = Math.min(data.offset + data.rows.length, data.total);
    pager.replaceChildren(
      el("button", { "data-testid": "gprev", disabled: data.offset === 0,
        onclick: () => { state.offset = Math.max(0, data.offset - state.limit); load(); } }, "‹ prev"),
      el("span", { "data-testid": "group-page-info" }, data.total ? `${data.offset + 1}–${last} of ${data.total}` : "no groups"),
      el("button", { "data-testid": "gnext", disabled: last >= data.total,
        onclick: () => { state.offset = data.offset + state.limit; load(); } }, "next ›"));
  }
  tableNav(() => [...table.querySelectorAll("tbody tr")]);
  await load();
  const stop = followRun((d, { grew }) => { if (grew) load(); });
  return () => { stop(); };
}

function advBar(a, maxAbs) {
  if (a === null || a === undefined) return el("span", { class: "muted" }, "–");
  const w = Math.round(Math.abs(a) / (maxAbs || 1) * 40);
  return el("span", {}, el("span", { class: "advbar", style: `width:${w}px;background:${a >= 0 ? "#27ae60" : "#c0392b"}` }),
    " ", a.toFixed(3));
}

export async function renderGroup(app, key, params) {
  const carry = new URLSearchParams([...params].filter(([k]) => FILTERS.includes(k)));
  const url = `/api/groups/${encodeURIComponent(key)}?${carry}`;
  const header = el("div", { class: "card", "data-testid": "group-header" });
  const table = el("table", { class: "grid", "data-testid": "rollout-table" });
  const liveBox = el("div", { "data-testid": "group-live" });
  app.replaceChildren(header, el("h2", {}, "Rollouts, best first"), table, liveBox);
  let g = null;
  const go = (k) => { if (k) location.hash = groupHash(k) + (carry.toString() ? "?" + carry : ""); };

  async function load() {
    g = await api(url);
    const steps = g.step_min === null ? "–" : g.step_min === g.step_max ? fmtNum(g.step_min) : `${fmtNum(g.step_min)}–${fmtNum(g.step_max)}`;
    header.replaceChildren(
      el("div", { class: "row" },
        el("button", { "data-testid": "group-prev", disabled: !g.prev, onclick: () => go(g.prev) }, "‹ previous group (p)"),
        el("b", { "data-testid": "group-task" }, g.task_key ?? "–"),
        el("span", { class: "muted", "data-testid": "group-key" }, g.group),
        el("button", { "data-testid": "group-next", disabled: !g.next, onclick: () => go(g.next) }, "next group (n) ›")),
      el("dl", { class: "kv" },
        el("dt", {}, "env"), el("dd", {}, g.env ?? "–"),
        el("dt", {}, "rollouts"), el("dd", { "data-testid": "group-n" }, fmtNum(g.n)),
        el("dt", {}, "mean / std"), el("dd", { "data-testid": "group-stats" }, `${fmtNum(g.mean)} / ${fmtNum(g.std)}`),
        el("dt", {}, "spread"), el("dd", {}, g.spread > 1e-9 ? fmtNum(g.spread) : "0 (all equal: no learning signal)"),
        el("dt", {}, "step"), el("dd", {}, steps)));
    const maxAbs = Math.max(...g.rollouts.map((r) => Math.abs(r.advantage || 0)), 1e-9);
    const best = g.rollouts[0], worst = g.rollouts[g.rollouts.length - 1];
    const showStep = g.rollouts.some((r) => r.step !== null || r.policy_version !== null);
    table.replaceChildren(
      el("thead", {}, el("tr", {}, ...["#", "episode", "g", "reward", ...g.reward_names, "advantage", "turns",
        "tokens", "stop", "duration", ...(showStep ? ["step", "policy"] : []), "diff"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...g.rollouts.map((r, i) => {
        const other = r.id === best.id ? worst : best;
        return el("tr", { class: "clickable", "data-testid": "rollout-row", "data-id": r.id,
          onclick: () => { location.hash = "#/episodes/" + r.id; } },
        el("td", { class: "num" }, i + 1), el("td", { title: r.id }, r.id.slice(0, 12)),
        el("td", { class: "num" }, fmtNum(r.group_index)),
        el("td", { class: "num", "data-testid": "rollout-reward" }, fmtNum(r.reward)),
        ...g.reward_names.map((n) => el("td", { class: "num", "data-testid": "rollout-part-" + n }, fmtNum(r.rewards[n]))),
        el("td", { class: "num", "data-testid": "rollout-advantage", "data-value": r.advantage ?? "" }, advBar(r.advantage, maxAbs)),
        el("td", { class: "num" }, fmtNum(r.turns)), el("td", { class: "num" }, fmtNum(r.n_tokens)),
        el("td", {}, r.stop ?? "–"), el("td", { class: "num" }, fmtSecs(r.duration)),
        ...(showStep ? [el("td", { class: "num" }, fmtNum(r.step)), el("td", { class: "num" }, fmtNum(r.policy_version))] : []),
        el("td", {}, other.id === r.id ? "–" : el("a", { href: `#/diff?a=${other.id}&b=${r.id}`, "data-testid": "diff-link",
          onclick: (ev) => ev.stopPropagation() }, other === best ? "vs best" : "vs worst")));
      })));
  }

  function renderLive(rows) {
    const mine = rows.filter((r) => (g.group_id ? r.group_id === g.group_id : !r.group_id && "task:" + r.task_key === g.group));
    liveBox.replaceChildren(...(mine.length ? [el("h2", {}, "Running now"), el("table", { class: "grid" },
      el("tbody", {}, ...mine.map((r) => el("tr", { class: "clickable", "data-testid": "group-live-row", "data-id": r.id,
        onclick: () => { location.hash = "#/episodes/" + r.id; } },
      el("td", {}, el("span", { class: "live-badge" }, "live"), " ", r.id.slice(0, 12)),
      el("td", {}, `g ${r.group_index}`), el("td", {}, `${fmtNum(r.n_nodes)} nodes`), el("td", {}, `${fmtNum(r.n_tokens)} tokens`)))))] : []));
  }

  try { await load(); } catch (err) {
    // A group whose rollouts are all still running has no stored row yet: wait for one.
    if (err.status !== 404) throw err;
    header.replaceChildren(el("p", { class: "muted", "data-testid": "group-waiting" },
      `no stored rollout of group ${key} yet; waiting for the run to store one`));
    g = { group: key, group_id: key.startsWith("task:") ? null : key, rollouts: [], next: null, prev: null };
  }
  tableNav(() => [...table.querySelectorAll("tbody tr")]);
  setKeys({ n: ["next group", () => go(g.next)], p: ["previous group", () => go(g.prev)],
    d: ["diff best vs worst", () => { const r = g.rollouts; if (r.length > 1) location.hash = `#/diff?a=${r[0].id}&b=${r[r.length - 1].id}`; }] });
  const stop = followRun((d, { grew }) => {
    renderLive(d.episodes);
    setStatus(d.episodes.length ? `${d.episodes.length} running` : "");
    if (grew) load().catch((err) => setStatus(String(err.message)));
  });
  return () => { stop(); setStatus(""); };
}
