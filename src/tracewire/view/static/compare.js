// Run against run: mean reward per task of the viewed run (A) and another run or step range
// (B), the difference B − A, sortable; tasks that got worse come first.
import { api, el, fmtNum, followRun, sortHeader } from "./util.js";
import { tableNav } from "./keys.js";

const PARAMS = ["b", "a_step_min", "a_step_max", "b_step_min", "b_step_max"];

export async function renderCompare(app, params) {
  const runs = await api("/api/runs");
  const state = { sort: params.get("sort") || "diff", order: params.get("order") || "asc", offset: 0 };
  for (const k of PARAMS) state[k] = params.get(k) || "";
  if (!state.b) state.b = runs.default || runs.current;
  const summary = el("div", { class: "row", "data-testid": "compare-summary" });
  const table = el("table", { class: "grid", "data-testid": "compare-table" });
  const input = (name, label) => el("label", {}, label,
    el("input", { name, type: "number", step: "any", value: state[name], "data-testid": "cfilter-" + name }));
  const form = el("form", { class: "filters", "data-testid": "compare-form" },
    el("label", {}, "run B", el("select", { name: "b", "data-testid": "compare-run" },
      ...runs.runs.map((r) => el("option", { value: r.name, selected: r.name === state.b },
        r.current ? `${r.name} (this run)` : r.name)))),
    input("a_step_min", "A step ≥"), input("a_step_max", "A step ≤"),
    input("b_step_min", "B step ≥"), input("b_step_max", "B step ≤"),
    el("button", { type: "submit", "data-testid": "capply" }, "compare"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const fd = new FormData(form);
    for (const k of PARAMS) state[k] = String(fd.get(k) || "");
    load();
  });
  form.addEventListener("change", (ev) => { if (ev.target.tagName === "SELECT") form.requestSubmit(); });
  app.replaceChildren(el("h2", {}, `Run against run: ${runs.current} (A) vs B`), form, summary, table);

  let seq = 0;
  async function load() {
    const mine = ++seq;
    const p = new URLSearchParams();
    for (const k of ["sort", "order", ...PARAMS]) if (state[k] !== "") p.set(k, state[k]);
    history.replaceState(null, "", "#/compare?" + p);
    const d = await api("/api/compare?" + p + "&limit=2000");
    if (mine !== seq) return;
    const range = (s) => s.step_min === null && s.step_max === null ? "" : ` steps ${fmtNum(s.step_min)}–${fmtNum(s.step_max)}`;
    const box = (label, s) => el("div", { class: "card", "data-testid": "compare-" + label },
      el("b", {}, label.toUpperCase()), ` ${s.run}${range(s)}: mean `, el("span", { "data-testid": "compare-mean-" + label }, fmtNum(s.mean)),
      ` over ${fmtNum(s.episodes)} episodes, ${fmtNum(s.tasks)} tasks`);
    summary.replaceChildren(box("a", d.a), box("b", d.b),
      el("div", { class: "card", "data-testid": "compare-counts" },
        `${d.both} tasks in both: `, el("span", { class: "neg" }, `${d.worse} worse`), ", ",
        el("span", { class: "pos" }, `${d.better} better`), `, ${d.same} same · mean difference ${fmtNum(d.mean_diff)}`));
    const head = (k, l, first) => sortHeader(state, k, l, load, first);
    table.replaceChildren(
      el("thead", {}, el("tr", {}, head("task_key", "task"), head("a", "A reward", "desc"), el("th", {}, "A n"),
        head("b", "B reward", "desc"), el("th", {}, "B n"), head("diff", "B − A"), el("th", {}, "diff"))),
      el("tbody", {}, ...d.rows.map((r) => el("tr", { class: "clickable", "data-testid": "compare-row", "data-task": r.task_key,
        onclick: () => { location.hash = "#/groups?q=" + encodeURIComponent(r.task_key); } },
      el("td", {}, r.task_key), el("td", { class: "num" }, fmtNum(r.a)), el("td", { class: "num" }, fmtNum(r.a_n)),
      el("td", { class: "num" }, fmtNum(r.b)), el("td", { class: "num" }, fmtNum(r.b_n)),
      el("td", { class: "num " + (r.diff === null ? "" : r.diff < -1e-9 ? "neg" : r.diff > 1e-9 ? "pos" : ""),
        "data-testid": "compare-diff", "data-value": r.diff ?? "" }, r.diff === null ? "–" : (r.diff > 0 ? "+" : "") + fmtNum(r.diff)),
      el("td", {}, r.a_id && r.b_id ? el("a", { "data-testid": "compare-diff-link", title: "A's best rollout of the task against B's worst",
        href: `#/diff?a=${r.a_id}&b=${r.b_id}` + (d.b.run === d.a.run ? "" : `&b_run=${encodeURIComponent(d.b.run)}`),
        onclick: (ev) => ev.stopPropagation() }, "A best vs B worst") : "–")))));
  }
  tableNav(() => [...table.querySelectorAll("tbody tr")]);
  await load();
  const stop = followRun((d, { grew }) => { if (grew) load(); });
  return () => stop();
}
