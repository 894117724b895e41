// The episode page: header (rewards, metrics, errors, stop), traces, branch choice, and three
// views of the chosen branch: conversation bubbles, tokens, timing waterfall. A live episode
// follows its event stream and grows turn by turn, pending tool results included.
import { ApiError, api, el, fmtNum, fmtSecs, setStatus } from "./util.js";
import { TokenView, loadVocab } from "./tokens.js";
import { waterfall } from "./plots.js";
import { setKeys } from "./keys.js";

const PAGE = 200;

function prettyArgs(text) {
  try { return JSON.stringify(JSON.parse(text), null, 1); } catch (e) { return text; }
}

function content(msg) {
  const c = msg.content;
  if (c === null || c === undefined) return [];
  if (typeof c === "string") return [el("div", { class: "text" }, c)];
  return c.map((p) => p.omitted ? el("div", { class: "muted" }, `[${p.type}]`) : el("div", {}, p.text));
}

export function bubble(msg, extra) {
  const who = [msg.role];
  if (msg.name) who.push(msg.name);
  if (msg.tool_call_id) who.push("result of " + msg.tool_call_id);
  return el("div", { class: `bubble ${msg.role} ${extra.pending ? "pending" : ""}`,
    "data-testid": extra.pending ? "pending-bubble" : "bubble", "data-role": msg.role,
    "data-node": extra.index ?? null },
  el("div", { class: "who" }, who.join(" · "), extra.meta ? " · " + extra.meta : "",
    extra.pending ? " · pending (waiting for the model)" : ""),
  msg.reasoning ? el("details", {}, el("summary", {}, "reasoning"), msg.reasoning) : null,
  ...content(msg),
  ...(msg.tool_calls || []).map((tc) => el("div", { class: "toolcall", "data-testid": "tool-call" },
    el("b", {}, tc.name), ` (${tc.id})\n`, prettyArgs(tc.arguments))),
  msg.truncated ? el("div", { class: "muted" }, "[cut: message too long to show whole]") : null);
}

function nodeMeta(n) {
  const parts = [`#${n.index}`, `tokens ${n.start}–${n.end}`];
  if (n.sampled) parts.push("sampled");
  if (!n.has_tokens) parts.push("no token ids");
  if (n.call) {
    parts.push(`finish ${n.call.finish_reason || n.call.error || "?"}`);
    if (n.call.start && n.call.end) parts.push(fmtSecs(n.call.end - n.call.start));
    if (n.call.usage && n.call.usage.completion_tokens) parts.push(`${n.call.usage.completion_tokens} out`);
  }
  return parts.join(" · ");
}

function kv(obj, testid) {
  const entries = Object.entries(obj || {});
  if (!entries.length) return el("span", { class: "muted", "data-testid": testid }, "none");
  return el("dl", { class: "kv", "data-testid": testid }, ...entries.flatMap(([k, v]) => [
    el("dt", {}, k),
    el("dd", {}, typeof v === "object" && v !== null
      ? ("score" in v ? `${fmtNum(v.score)} × ${fmtNum(v.weight)}` : JSON.stringify(v)) : fmtNum(v))]));
}

function errorList(errors) {
  if (!errors.length) return el("span", { class: "muted" }, "none");
  return el("ul", { class: "err", "data-testid": "errors" },
    ...errors.map((e) => el("li", {}, `${e.type}${e.phase ? " in " + e.phase : ""}: ${e.message}`)));
}

export async function renderEpisode(app, id, params) {
  const base = `/api/episodes/${id}`;
  let ep = await api(base);
  const st = { t: Number(params.get("t") || 0), tab: params.get("tab") || "chat", leaf: null,
    follow: false, shown: 0, lastIndex: -1, tokens: null };
  const header = el("div", { class: "card", "data-testid": "episode-header" });
  const traceTabs = el("div", { class: "tabs", "data-testid": "trace-tabs" });
  const traceInfo = el("div", { class: "row" });
  const branchSel = el("select", { "data-testid": "branch-select" });
  const viewTabs = el("div", { class: "tabs", "data-testid": "view-tabs" });
  const body = el("div", {});
  const chat = el("div", { "data-testid": "conversation" });
  const pendingBox = el("div", { "data-testid": "pending" });
  const more = el("button", { "data-testid": "load-more", onclick: () => loadMore() }, "load more");
  app.replaceChildren(header, traceTabs, traceInfo,
    el("div", { class: "row" }, el("label", {}, "branch ", branchSel)), viewTabs, body);

  const groupKey = ep.group_id || "task:" + ep.task_key;
  const trace = () => ep.traces[st.t];
  const lastNode = () => trace().n_nodes - 1;
  const setHash = () => history.replaceState(null, "",
    `#/episodes/${id}?t=${st.t}&leaf=${st.leaf}&tab=${st.tab}`);

  function renderHeader() {
    const span = (s) => s.end ? fmtSecs(s.end - s.start) : "running";
    header.replaceChildren(
      el("div", {}, el("b", { "data-testid": "episode-id" }, ep.id), " ",
        ep.stale ? el("span", { class: "stale-badge", "data-testid": "stale-badge" },
          "stale: its writer crashed; run `tracewire check --repair` to store it as incomplete")
          : ep.live ? el("span", { class: "live-badge", "data-testid": "live-badge" }, "live") : null),
      el("dl", { class: "kv" },
        el("dt", {}, "env / task"), el("dd", {}, `${ep.env} / ${ep.task_key} `,
          el("a", { href: "#/groups/" + encodeURIComponent(groupKey), "data-testid": "episode-group" },
            `(rollout ${ep.group_index} of its group)`)),
        el("dt", {}, "reward"), el("dd", { "data-testid": "episode-reward" }, fmtNum(ep.reward)),
        el("dt", {}, "ok"), el("dd", {}, String(ep.ok)),
        ...(ep.info && (ep.info.step !== undefined || ep.info.policy_version !== undefined) ? [
          el("dt", {}, "step / policy"), el("dd", { "data-testid": "episode-step" },
            `${ep.info.step ?? "–"} / ${ep.info.policy_version ?? "–"}`)] : []),
        el("dt", {}, "timing"), el("dd", {}, Object.entries(ep.timing).map(([k, s]) => `${k} ${span(s)}`).join(", ") || "–"),
        el("dt", {}, "errors"), el("dd", {}, errorList(ep.errors))));
    traceTabs.replaceChildren(...ep.traces.map((tr, i) => el("button", {
      class: i === st.t ? "on" : "", "data-testid": "trace-tab",
      onclick: () => { st.t = i; st.leaf = null; renderTrace(); } }, `trace ${i} (${tr.n_nodes} nodes)`)));
    const tr = trace();
    traceInfo.replaceChildren(
      el("div", { class: "card" }, el("div", { class: "muted" }, "rewards"), kv(tr.rewards, "rewards")),
      el("div", { class: "card" }, el("div", { class: "muted" }, "metrics"), kv(tr.metrics, "metrics")),
      el("div", { class: "card" }, el("dl", { class: "kv" },
        el("dt", {}, "stop"), el("dd", { "data-testid": "stop" }, tr.stop || "–"),
        el("dt", {}, "completed"), el("dd", {}, String(tr.completed)),
        el("dt", {}, "tokens"), el("dd", { "data-testid": "trace-tokens" }, fmtNum(tr.n_tokens)),
        el("dt", {}, "calls"), el("dd", { "data-testid": "trace-calls" }, fmtNum(tr.n_calls)),
        el("dt", {}, "errors"), el("dd", {}, errorList(tr.errors)))));
    branchSel.replaceChildren(...tr.leaves.map((l) => el("option", { value: l.leaf, selected: l.leaf === st.leaf },
      `leaf ${l.leaf} (${l.depth} nodes, ${l.n_tokens} tokens, ends ${l.role})`)));
    if (!tr.leaves.some((l) => l.leaf === st.leaf) && st.leaf !== null)
      branchSel.append(el("option", { value: st.leaf, selected: true }, `node ${st.leaf}`));
  }

  function renderTabs() {
    viewTabs.replaceChildren(...[["chat", "conversation"], ["tokens", "tokens"], ["timing", "timing"]]
      .map(([k, label]) => el("button", { class: st.tab === k ? "on" : "", "data-testid": "tab-" + k,
        onclick: () => { st.tab = k; renderTrace(); } }, label)));
  }

  async function loadMore() {
    const page = await api(`${base}/traces/${st.t}/branches/${st.leaf}?offset=${st.shown}&limit=${PAGE}`);
    appendPage(page);
  }

  function appendPage(page) {
    for (const n of page.nodes) chat.append(bubble(n.message, { index: n.index, meta: nodeMeta(n) }));
    st.shown += page.nodes.length;
    if (page.nodes.length) st.lastIndex = page.nodes[page.nodes.length - 1].index;
    more.hidden = st.shown >= page.n_nodes;
    more.textContent = `load more (${(page.n_nodes - st.shown).toLocaleString("en-US")} left)`;
    pendingBox.replaceChildren(...(st.shown >= page.n_nodes ? page.pending : [])
      .map((m) => bubble(m, { pending: true })));
  }

  async function renderTrace() {
    if (st.tokens) { st.tokens.destroy(); st.tokens = null; }
    if (st.leaf === null) st.leaf = Number(params.get("leaf") ?? lastNode());
    if (st.leaf > lastNode() || st.leaf < 0) st.leaf = lastNode();
    params.delete("leaf");
    st.follow = ep.live && !ep.stale && st.leaf === lastNode();
    renderHeader(); renderTabs(); setHash();
    if (st.leaf < 0) { body.replaceChildren(el("p", { class: "muted" }, "no messages yet"), pendingBox); return; }
    if (st.tab === "chat") {
      st.shown = 0; st.lastIndex = -1; chat.replaceChildren(); pendingBox.replaceChildren();
      body.replaceChildren(chat, more, pendingBox);
      await loadMore();
    } else if (st.tab === "tokens") {
      const holder = el("div", {});
      body.replaceChildren(holder);
      const leafInfo = trace().leaves.find((l) => l.leaf === st.leaf);
      const [b, vocab] = await Promise.all([
        api(`${base}/traces/${st.t}/branches/${st.leaf}?limit=1`), loadVocab()]);
      st.tokens = new TokenView(holder, `${base}/traces/${st.t}/branches/${st.leaf}/tokens`,
        leafInfo ? leafInfo.n_tokens : b.n_tokens, vocab, trace().extra || []);
    } else {
      const canvas = el("canvas", { class: "waterfall", "data-testid": "waterfall" });
      body.replaceChildren(canvas);
      waterfall(canvas, await api(`${base}/traces/${st.t}/timing`), Date.now() / 1000);
    }
  }

  // Live: a new summary arrived. Extend what is shown when the path only grew.
  async function onLive(summary) {
    const prevLeaf = st.leaf;
    ep = summary;
    if (st.follow) st.leaf = lastNode();
    renderHeader(); setHash();
    if (st.tab === "chat") {
      if (st.leaf !== prevLeaf && st.shown > 0) {
        const page = await api(`${base}/traces/${st.t}/branches/${st.leaf}?offset=${st.shown - 1}&limit=${PAGE}`);
        if (page.nodes.length && page.nodes[0].index === st.lastIndex) {
          page.nodes.shift(); appendPage(page);
        } else { await renderTrace(); }
      } else {
        const page = await api(`${base}/traces/${st.t}/branches/${st.leaf}?offset=${st.shown}&limit=${PAGE}`);
        appendPage(page);
      }
    } else if (st.tab === "tokens") {
      if (st.leaf !== prevLeaf) await renderTrace();
      else if (st.tokens) st.tokens.setTotal(trace().leaves.find((l) => l.leaf === st.leaf)?.n_tokens ?? 0);
    } else { await renderTrace(); }
  }

  async function onGone() {
    for (let i = 0; i < 20; i++) {
      try { ep = await api(base); break; } catch (err) {
        if (!(err instanceof ApiError) || err.status !== 404) throw err;
        await new Promise((r) => setTimeout(r, 250));
      }
    }
    st.follow = false;
    await renderTrace();
  }

  // n / p: the next / previous rollout of this episode's group (best first, as listed there).
  let siblings = null;
  const sibling = async (k) => {
    if (siblings === null) {
      try { siblings = (await api("/api/groups/" + encodeURIComponent(groupKey))).rollouts.map((r) => r.id); }
      catch (err) { siblings = []; }
    }
    const i = siblings.indexOf(id);
    if (i >= 0 && siblings.length > 1) location.hash = "#/episodes/" + siblings[(i + k + siblings.length) % siblings.length];
  };
  const tabKey = (k) => () => { st.tab = k; renderTrace(); };
  setKeys({ n: ["next rollout of the group", () => sibling(1)], p: ["previous rollout of the group", () => sibling(-1)],
    "1": ["conversation", tabKey("chat")], "2": ["tokens", tabKey("tokens")], "3": ["timing", tabKey("timing")],
    u: ["up to the group", () => { location.hash = "#/groups/" + encodeURIComponent(groupKey); }] });
  branchSel.addEventListener("change", () => { st.leaf = Number(branchSel.value); renderTrace(); });
  await renderTrace();


  let events = null, queue = Promise.resolve();
  if (ep.stale) setStatus("needs repair");
  else if (ep.live) {
    setStatus("live");
    events = new EventSource(`/api/events?episode=${id}`);
    // Handle events one at a time, in order, so pages are appended exactly once.
    events.addEventListener("episode", (ev) => {
      const summary = JSON.parse(ev.data);
      queue = queue.then(() => onLive(summary)).catch((err) => setStatus(String(err.message)));
    });
    events.addEventListener("gone", () => {
      events.close(); setStatus("finished");
      queue = queue.then(onGone).catch((err) => setStatus(String(err.message)));
    });
  }
  return () => { if (events) events.close(); if (st.tokens) st.tokens.destroy(); setStatus(""); };
}
