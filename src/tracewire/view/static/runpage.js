// The run page: metadata, reward plots, episodes running now (live), and the episode table
// (sorted, filtered and paginated by the server).
import { api, el, fmtNum, fmtSecs, fmtTime, setStatus } from "./util.js";
import { histogram, lineChart, stepChart } from "./plots.js";
import { tableNav } from "./keys.js";

// Optional index columns (shown when the run has values): key -> header label.
const OPTIONAL = { step: "step", policy_version: "policy", tito_mismatch: "tito mismatch" };
const BASE_COLUMNS = [
  ["arrival", "#", true], ["id", "episode", false], ["env", "env", true],
  ["task_key", "task", true], ["group_index", "g", false], ["status", "status", true],
  ["stop", "stop", true], ["reward", "reward", true], ["turns", "turns", true],
  ["n_tokens", "tokens", true], ["errors", "errors", true], ["duration", "duration", true],
  ["started", "started", true],
];
const BASE_FILTERS = ["env", "status", "stop", "reward_min", "reward_max", "errors", "q"];

function cell(key, row) {
  const v = row[key];
  switch (key) {
    case "id": return el("td", { title: v }, String(v).slice(0, 12));
    case "reward": return el("td", { class: "num" }, fmtNum(v));
    case "duration": return el("td", { class: "num" }, fmtSecs(v));
    case "started": return el("td", {}, fmtTime(v));
    case "task_key": {
      const key = row.group_id || "task:" + v;
      return el("td", {}, el("a", { href: "#/groups/" + encodeURIComponent(key), "data-testid": "group-link",
        title: "the group of rollouts of this task", onclick: (ev) => ev.stopPropagation() }, v ?? "–"));
    }
    case "arrival": case "turns": case "n_tokens": case "errors": case "group_index":
    case "step": case "policy_version": case "tito_mismatch":
      return el("td", { class: "num" }, fmtNum(v));
    default: return el("td", {}, v === null || v === undefined ? "–" : String(v));
  }
}

export async function renderRun(app, params) {
  const [info, facets] = await Promise.all([api("/api/run"), api("/api/facets")]);
  const extra = (info.columns || []).filter((c) => c in OPTIONAL);
  const COLUMNS = [...BASE_COLUMNS, ...extra.map((c) => [c, OPTIONAL[c], true])];
  const FILTERS = [...BASE_FILTERS, ...extra.flatMap((c) => [c + "_min", c + "_max"])];
  const state = {
    sort: params.get("sort") || "arrival", order: params.get("order") || "asc",
    offset: Number(params.get("offset") || 0), limit: Number(params.get("limit") || 50),
  };
  for (const f of FILTERS) state[f] = params.get(f) || "";

  // Times in the run metadata are epoch seconds; show them as dates.
  const metaValue = (k, v) => {
    if (typeof v === "number" && /^(created|started|ended|finished)/.test(k)) return fmtTime(v);
    const text = typeof v === "object" ? JSON.stringify(v) : String(v);
    // Long values (a run's config) are cut so the card leaves room for the plots.
    return text.length > 90 ? el("span", { title: text }, text.slice(0, 88) + "…") : text;
  };
  const metaBox = el("dl", { class: "kv card", "data-testid": "run-meta" },
    el("dt", {}, "run"), el("dd", {}, info.dir),
    el("dt", {}, "episodes"), el("dd", { "data-testid": "run-count" }, fmtNum(info.episodes)),
    ...Object.entries(info.meta || {}).slice(0, 12).flatMap(([k, v]) => [
      el("dt", {}, k), el("dd", {}, metaValue(k, v))]));
  const histSvg = el("div", { "data-testid": "reward-hist" });
  const lineSvg = el("div", { "data-testid": "reward-over-time" });
  const liveBox = el("div", { "data-testid": "live-list" });
  const stepsBox = el("div", { class: "row", "data-testid": "steps" });
  const repairBox = el("div", {});
  const liveTitle = el("h2", {}, "Running now");
  let health = info.health || {};
  function renderHealth(h) {
    health = h || {};
    const broken = health.state === "needs_repair";
    liveTitle.textContent = broken ? "Left by a crashed writer (not running)" : "Running now";
    repairBox.replaceChildren(...(broken ? [el("div", { class: "banner", "data-testid": "needs-repair" },
      `needs repair: ${health.hint} — the writer of this run is gone`,
      health.journals ? ` and left ${health.journals} unfinished episode(s) in journals` : "",
      "; what is shown below is what it wrote before it stopped.")] : []));
  }
  renderHealth(health);
  const table = el("table", { class: "grid", "data-testid": "episode-table" });
  const pager = el("div", { class: "pager", "data-testid": "pager" });

  const select = (name, values) => el("label", {}, name,
    el("select", { name, "data-testid": "filter-" + name },
      el("option", { value: "" }, "any"),
      ...values.map((v) => el("option", { value: v, selected: state[name] === String(v) }, String(v)))));
  const input = (name, label, type) => el("label", {}, label,
    el("input", { name, type, value: state[name], step: "any", "data-testid": "filter-" + name }));
  const form = el("form", { class: "filters", "data-testid": "filters" },
    select("env", facets.env || []), select("status", facets.status || []),
    select("stop", facets.stop || []),
    input("reward_min", "reward ≥", "number"), input("reward_max", "reward ≤", "number"),
    el("label", {}, "errors", el("select", { name: "errors", "data-testid": "filter-errors" },
      el("option", { value: "" }, "any"),
      el("option", { value: "true", selected: state.errors === "true" }, "with errors"),
      el("option", { value: "false", selected: state.errors === "false" }, "without"))),
    input("q", "task contains", "search"),
    ...extra.flatMap((c) => [input(c + "_min", OPTIONAL[c] + " ≥", "number"),
      input(c + "_max", OPTIONAL[c] + " ≤", "number")]),
    el("button", { type: "submit", "data-testid": "apply" }, "apply"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const fd = new FormData(form);
    for (const f of FILTERS) state[f] = String(fd.get(f) || "");
    state.offset = 0;
    loadTable();
  });
  form.addEventListener("change", (ev) => { if (ev.target.tagName === "SELECT") form.requestSubmit(); });

  app.replaceChildren(
    el("div", { class: "row" }, metaBox,
      el("div", { class: "card" }, el("div", { class: "muted" }, "reward histogram"), histSvg),
      el("div", { class: "card" }, el("div", { class: "muted" }, "mean reward over arrival"), lineSvg)),
    repairBox, stepsBox,
    liveTitle, liveBox,
    el("h2", {}, "Episodes"), form, pager, table);

  function query() {
    const p = new URLSearchParams();
    for (const k of ["sort", "order", "offset", "limit", ...FILTERS]) if (state[k] !== "") p.set(k, state[k]);
    return p;
  }

  let seq = 0;
  async function loadTable() {
    const mine = ++seq;
    const p = query();
    history.replaceState(null, "", "#/?" + p.toString());
    let data;
    try { data = await api("/api/episodes?" + p.toString()); }
    catch (err) {
      table.replaceChildren(el("caption", { class: "err", "data-testid": "error" }, err.message));
      return;
    }
    if (mine !== seq) return;  // a newer request superseded this one
    const head = el("tr", {}, ...COLUMNS.map(([key, label, sortable]) => {
      const cls = state.sort === key ? "sorted-" + state.order : null;
      return el("th", { class: cls, "data-col": key, "data-testid": "col-" + key,
        onclick: sortable ? () => {
          if (state.sort === key) state.order = state.order === "asc" ? "desc" : "asc";
          else { state.sort = key; state.order = key === "reward" ? "desc" : "asc"; }
          state.offset = 0; loadTable();
        } : null }, label);
    }));
    const rows = data.rows.map((row) => el("tr", {
      class: "clickable", "data-testid": "episode-row", "data-id": row.id,
      onclick: () => { location.hash = "#/episodes/" + row.id; },
    }, ...COLUMNS.map(([key]) => cell(key, row))));
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    const last = Math.min(data.offset + data.rows.length, data.total);
    pager.replaceChildren(
      el("button", { "data-testid": "prev", disabled: data.offset === 0,
        onclick: () => { state.offset = Math.max(0, data.offset - state.limit); loadTable(); } }, "‹ prev"),
      el("span", { "data-testid": "page-info" },
        data.total ? `${data.offset + 1}–${last} of ${data.total}` : "no episodes"),
      el("button", { "data-testid": "next", disabled: last >= data.total,
        onclick: () => { state.offset = data.offset + state.limit; loadTable(); } }, "next ›"));
  }

  async function loadPlots() {
    const stats = await api("/api/stats?bins=20");
    histSvg.replaceChildren(histogram(stats.hist, 320, 140));
    lineSvg.replaceChildren(lineChart(stats.over_time, 320, 140));
    if (stats.mean !== null) histSvg.title = "mean reward " + fmtNum(stats.mean);
    const steps = await api("/api/steps");
    if (!steps.source) { stepsBox.replaceChildren(); return; }
    const card = (label, testid, values, colour) => el("div", { class: "card" },
      el("div", { class: "muted" }, label),
      el("div", { "data-testid": testid }, stepChart(steps.step, values, 320, 140, colour, label)));
    const cards = [card("mean reward per step", "reward-over-steps", steps.reward, "#27ae60")];
    if (steps.mismatch_max) cards.push(card("logprob mismatch (max) per step", "mismatch-over-steps", steps.mismatch_max, "#c0392b"));
    else if (steps.tito_mismatch) cards.push(card("tito mismatch per step", "mismatch-over-steps", steps.tito_mismatch, "#c0392b"));
    if (steps.staleness) cards.push(card("staleness per step", "staleness-over-steps", steps.staleness, "#8e44ad"));
    stepsBox.replaceChildren(...cards);
  }

  function renderLive(rows) {
    if (!rows.length) { liveBox.replaceChildren(el("p", { class: "muted" }, "nothing in flight")); return; }
    liveBox.replaceChildren(el("table", { class: "grid" },
      el("thead", {}, el("tr", {}, ...["episode", "env", "task", "nodes", "tokens", "calls", "pending"]
        .map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows.map((r) => el("tr", {
        class: "clickable", "data-testid": "live-row", "data-id": r.id,
        onclick: () => { location.hash = "#/episodes/" + r.id; },
      }, el("td", {}, health.state === "needs_repair"
        ? el("span", { class: "stale-badge", "data-testid": "stale-badge" }, "stale")
        : el("span", { class: "live-badge" }, "live"), " ", r.id.slice(0, 12)),
      el("td", {}, r.env), el("td", {}, r.task_key), el("td", { class: "num" }, fmtNum(r.n_nodes)),
      el("td", { class: "num" }, fmtNum(r.n_tokens)), el("td", { class: "num" }, fmtNum(r.n_calls)),
      el("td", { class: "num" }, fmtNum(r.pending)))))));
  }

  renderLive([]);
  tableNav(() => [...table.querySelectorAll("tbody tr")]);
  await Promise.all([loadTable(), loadPlots()]);
  let indexRows = info.episodes, stepsSig = null;
  const events = new EventSource("/api/events");
  events.addEventListener("live", (ev) => {
    const d = JSON.parse(ev.data);
    renderHealth(d.health);
    renderLive(d.episodes);
    setStatus(health.state === "needs_repair" ? "needs repair"
      : d.episodes.length ? `${d.episodes.length} running` : "");
    const sig = String(d.steps);
    if (d.index_rows !== indexRows) {
      indexRows = d.index_rows;
      document.querySelector("[data-testid=run-count]").textContent = fmtNum(indexRows);
      loadTable(); loadPlots();
    } else if (stepsSig === null || sig !== stepsSig) {
      // `tracewire train` wrote a step summary; on the first event the plots are reloaded
      // once, since a step written between their first load and this event has no older
      // signature to differ from.
      loadPlots();
    }
    stepsSig = sig;
  });
  return () => { events.close(); setStatus(""); };
}
