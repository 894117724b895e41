// Diff of two rollouts: the shared prompt once, then where they part — the first differing
// message and, within the first differing sampled message, the first differing token with
// both continuations around it (token text, logprob heat) — then each side's rest.
import { api, el, fmtNum, heatHue, setStatus } from "./util.js";
import { bubble } from "./episode.js";
import { loadVocab, showPiece } from "./tokens.js";
import { setKeys } from "./keys.js";

function sideHead(s, label, run) {
  // An episode of another run has no page in this viewer: name it and its run instead.
  const id = run ? el("span", { title: s.id, "data-testid": "diff-id-" + label }, s.id.slice(0, 12))
    : el("a", { href: "#/episodes/" + s.id, "data-testid": "diff-id-" + label }, s.id.slice(0, 12));
  return el("div", { class: "card", "data-testid": "diff-side-" + label },
    el("b", {}, label.toUpperCase() + " "), run ? el("span", { class: "muted" }, `run ${run} · `) : null, id,
    el("span", { class: "muted" }, ` · ${s.task_key} · g ${s.group_index ?? "–"} · `),
    el("span", { "data-testid": "diff-reward-" + label }, "reward " + fmtNum(s.reward)),
    el("span", { class: "muted" }, ` · stop ${s.stop ?? "–"} · ${s.n_nodes} messages`));
}

function context(win, at, vocab, label) {
  const cells = win.ids.map((id, k) => {
    const pos = win.start + k, lp = win.logprobs[k], m = win.mask[k];
    const piece = vocab.known && id >= 0 && id < vocab.pieces.length ? vocab.pieces[id] : null;
    const bg = m && lp !== null ? `hsl(${heatHue(lp)}, 70%, 78%)` : "#eceff3";
    const title = `pos ${pos} · id ${id}${piece !== null ? " · text " + JSON.stringify(piece) : ""} · logprob ${lp === null ? "–" : lp.toFixed(4)}`;
    return el("span", { class: "tok" + (pos === at ? " diverge" : ""), style: `background:${bg}`, title,
      "data-pos": pos, "data-id": id, "data-lp": lp ?? "", "data-testid": pos === at ? "diverge-" + label : null },
    el("span", { class: "t" }, piece !== null ? showPiece(piece) : String(id)),
    el("span", { class: "lp" }, lp === null ? "–" : lp.toFixed(2)));
  });
  return el("div", { class: "ctx", "data-testid": "ctx-" + label }, ...cells);
}

export async function renderDiff(app, params) {
  const a = params.get("a"), b = params.get("b"), bRun = params.get("b_run");
  const qs = new URLSearchParams([...params].filter(([k]) => ["a", "b", "ta", "tb", "la", "lb", "b_run"].includes(k)));
  const [d, vocab] = await Promise.all([api("/api/diff?" + qs), loadVocab()]);
  const parts = [el("h2", {}, "Diff of two rollouts"),
    el("div", { class: "sides" }, sideHead(d.a, "a", null), sideHead(d.b, "b", bRun))];
  const where = d.identical ? "the two branches are identical"
    : d.first_message === null ? "messages are equal; token ids differ"
    : `they part at message ${d.first_message}`;
  parts.push(el("p", { "data-testid": "diff-where" }, where,
    d.same_task ? " · same task: the shared prompt is shown once" : " · different tasks"));
  if (d.token) {
    const t = d.token;
    const lpA = t.a.logprobs[t.pos_a - t.a.start], lpB = t.b.logprobs[t.pos_b - t.b.start];
    parts.push(el("div", { class: "card", "data-testid": "diverge" },
      el("div", {}, el("b", {}, "first differing token"), ` in message ${t.message} at token ${t.offset} of it · `,
        el("span", { "data-testid": "diverge-pos" }, `position ${t.pos_a} (A) / ${t.pos_b} (B)`),
        ` · logprob A ${lpA === null || lpA === undefined ? "–" : lpA.toFixed(4)}, B ${lpB === null || lpB === undefined ? "–" : lpB.toFixed(4)}`),
      el("div", { class: "muted" }, "A"), context(t.a, t.pos_a, vocab, "a"),
      el("div", { class: "muted" }, "B"), context(t.b, t.pos_b, vocab, "b")));
  }
  const shared = el("div", { class: "shared", "data-testid": "diff-shared" },
    el("div", { class: "muted" }, `shared: ${d.shared} message(s)` + (d.shared_from ? ` (the last ${d.shared - d.shared_from} shown)` : "")),
    ...d.shared_messages.map((m) => bubble(m.message, { index: m.node, meta: `#${m.index}` })));
  parts.push(shared);
  const side = (rest, n, label) => el("div", { "data-testid": "diff-rest-" + label },
    el("div", { class: "muted" }, `${label.toUpperCase()}: ${n - d.shared} message(s) after the shared part`),
    ...rest.map((m) => {
      const node = bubble(m.message, { index: m.node, meta: `#${m.index}${m.sampled ? " · sampled" : ""}` });
      if (m.index === d.first_message) node.classList.add("first-diff");
      return node;
    }));
  parts.push(el("div", { class: "sides" }, side(d.rest_a, d.n_a, "a"), side(d.rest_b, d.n_b, "b")));
  app.replaceChildren(...parts);
  const div = app.querySelector("[data-testid=diverge]");
  if (div) div.scrollIntoView({ block: "nearest" });

  // n / p: B steps through the other rollouts of A's group (fetched on first use).
  let siblings = null;
  const step = async (k) => {
    if (siblings === null) {
      siblings = [];
      if (d.a.group_id && !bRun) {
        try { siblings = (await api("/api/groups/" + encodeURIComponent(d.a.group_id))).rollouts.map((r) => r.id).filter((id) => id !== a); }
        catch (err) { siblings = []; }
      }
    }
    if (!siblings.length) return;
    const i = siblings.indexOf(b);
    location.hash = `#/diff?a=${a}&b=${siblings[(i + k + siblings.length) % siblings.length]}`;
  };
  setKeys({ n: ["B: next rollout of the group", () => step(1)], p: ["B: previous rollout of the group", () => step(-1)],
    ...(bRun ? {} : { s: ["swap A and B", () => { location.hash = `#/diff?a=${b}&b=${a}`; }] }) });
  setStatus("");
  return () => {};
}
