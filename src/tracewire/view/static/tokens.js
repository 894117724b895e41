// Token view: a virtualized grid over a branch's tokens. Only the rows in sight exist in the
// DOM; tokens arrive in windows of CHUNK as raw little-endian arrays (ids int32, logprobs
// float32, mask uint8) and a bounded number of windows is kept, so a 1 M-token branch costs
// what a screenful costs.
// When the run's tokenizer is known, each id shows its text piece (from a vocabulary table
// fetched once per page load; special tokens marked), else the id.
// Heat: sampled, trained tokens are coloured by logprob (or by an extra per-token column such
// as entropy, scaled to its range over the branch); prompt tokens are grey, junction tokens
// (template text between turns) hatched blue, sampled tokens left out of the loss hatched grey.
import { api, el, heatHue } from "./util.js";

const CHUNK = 4096, KEEP_CHUNKS = 64, ROW_H = 18, CELL_W = 57, POS_W = 72, OVERSCAN = 6;
const MAX_H = 8_000_000;  // stay well under the browsers' element height limits

let vocabPromise = null;

// The run's vocabulary: {known, pieces, special:Set}; fetched at most once per page load.
export function loadVocab() {
  if (!vocabPromise) {
    vocabPromise = api("/api/vocab").then((v) => ({ ...v, special: new Set(v.special || []) }))
      .catch(() => ({ known: false, pieces: [], special: new Set() }));
  }
  return vocabPromise;
}

// Whitespace and control characters made visible, so a token's extent can be seen.
export function showPiece(text) {
  return text.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "→").replace(/\r/g, "␍")
    .replace(/[\u0000-\u001f]/g, (c) => "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0"));
}

// Token kinds as the server codes them (see the viewer's _heat module).
export const KIND_NAMES = ["prompt", "sampled", "sampled, masked out", "junction", "prompt, trained"];
const KIND_BG = ["#eceff3", null, "#d5d8dc", "#c9dafc", "#f6e7c8"];

// Background and hue (null when the token is not on the heat scale) of one token.
function colour(mode, t, scale) {
  if (mode === "mask") return [t.mask ? "#bfe6bf" : KIND_BG[t.kind] || "#eceff3", null];
  if (t.kind !== 1) return [KIND_BG[t.kind] || "#eceff3", null];
  if (mode === "logprob") {
    if (Number.isNaN(t.lp)) return ["#dfe3ea", null];
    const h = heatHue(t.lp);
    return [`hsl(${h}, 70%, 78%)`, h];
  }
  // An extra column: low values green, high values red (entropy: sure .. unsure).
  if (t.extra === null || Number.isNaN(t.extra) || !scale) return ["#dfe3ea", null];
  const span = scale.hi > scale.lo ? scale.hi - scale.lo : 1;
  const h = Math.round((1 - Math.max(0, Math.min(1, (t.extra - scale.lo) / span))) * 120);
  return [`hsl(${h}, 70%, 78%)`, h];
}

export class TokenView {
  constructor(root, url, total, vocab, extras = []) {
    this.url = url; this.total = total; this.mode = "logprob"; this.scale = null;
    this.vocab = vocab && vocab.known ? vocab : null;
    this.showText = this.vocab !== null;
    this.chunks = new Map(); this.inflight = new Map();
    this.info = el("div", { id: "token-info", "data-testid": "token-info" }, "hover a token");
    this.spacer = el("div", { class: "spacer" });
    this.box = el("div", { class: "tokview", "data-testid": "token-view" }, this.spacer);
    this.jump = el("input", { type: "number", min: 0, placeholder: "go to position",
      "data-testid": "token-jump" });
    const modeSel = el("select", { "data-testid": "token-colour" },
      el("option", { value: "logprob" }, "colour by logprob"), el("option", { value: "mask" }, "colour by mask"),
      ...extras.map((x) => el("option", { value: "extra:" + x }, "colour by " + x)));
    modeSel.addEventListener("change", () => {
      const was = this.extraName();
      this.mode = modeSel.value;
      if (this.extraName() !== was) { this.chunks.clear(); this.scale = null; }
      this.render();
    });
    this.jump.addEventListener("change", () => this.scrollTo(Number(this.jump.value)));
    this.count = el("span", { "data-testid": "token-count" });
    const textSel = this.vocab ? el("select", { "data-testid": "token-show" },
      el("option", { value: "text" }, "show text"), el("option", { value: "ids" }, "show ids")) : null;
    if (textSel) textSel.addEventListener("change", () => { this.showText = textSel.value === "text"; this.render(); });
    const tokName = el("span", { class: "muted", "data-testid": "token-tokenizer" },
      this.vocab ? `tokenizer: ${this.vocab.name}` : "ids only (tokenizer unknown)");
    root.replaceChildren(
      el("div", { class: "legend" }, this.count, modeSel, textSel, this.jump, tokName,
        el("span", {}, el("span", { class: "swatch", style: "background:hsl(0,70%,78%)" }), " p≈0"),
        el("span", {}, el("span", { class: "swatch", style: "background:hsl(120,70%,78%)" }), " p≈1 (trained)"),
        el("span", {}, el("span", { class: "swatch", style: "background:#eceff3" }), " prompt"),
        el("span", {}, el("span", { class: "swatch k3", style: "background-color:#c9dafc" }), " junction"),
        el("span", {}, el("span", { class: "swatch k2", style: "background-color:#d5d8dc" }), " sampled, not trained")),
      this.box, this.info);
    this.box.addEventListener("scroll", () => this.schedule());
    this.box.addEventListener("mouseover", (ev) => this.hover(ev.target));
    this.resize = new ResizeObserver(() => this.layout());
    this.resize.observe(this.box);
    this.layout();
  }

  destroy() { this.resize.disconnect(); }

  extraName() { return this.mode.startsWith("extra:") ? this.mode.slice(6) : null; }

  setTotal(total) {
    if (total === this.total) return;
    // The last window may have been partial: drop it so it is fetched again.
    this.chunks.delete(Math.floor(this.total / CHUNK));
    this.total = total; this.layout();
  }

  layout() {
    this.perRow = Math.max(1, Math.floor((this.box.clientWidth - POS_W - 16) / CELL_W));
    this.rows = Math.ceil(this.total / this.perRow);
    this.fullH = this.rows * ROW_H;
    this.spacer.style.height = Math.min(this.fullH, MAX_H) + "px";
    this.count.textContent = `${this.total.toLocaleString("en-US")} tokens`;
    this.render();
  }

  schedule() {
    if (this.pending) return;
    this.pending = requestAnimationFrame(() => { this.pending = 0; this.render(); });
  }

  // Map the scrollbar onto the full row range even when the spacer is capped at MAX_H.
  virtualTop() {
    const viewH = this.box.clientHeight, shownH = Math.min(this.fullH, MAX_H);
    const maxScroll = Math.max(shownH - viewH, 1), maxTop = Math.max(this.fullH - viewH, 0);
    return Math.min(this.box.scrollTop / maxScroll, 1) * maxTop;
  }

  scrollTo(pos) {
    if (!Number.isFinite(pos)) return;
    pos = Math.max(0, Math.min(pos, this.total - 1));
    const rowTop = Math.floor(pos / this.perRow) * ROW_H;
    const viewH = this.box.clientHeight, shownH = Math.min(this.fullH, MAX_H);
    const maxTop = Math.max(this.fullH - viewH, 1);
    this.box.scrollTop = Math.min(rowTop / maxTop, 1) * Math.max(shownH - viewH, 0);
    this.render();
  }

  chunk(c) {
    const have = this.chunks.get(c);
    if (have) { this.chunks.delete(c); this.chunks.set(c, have); return have; }
    if (!this.inflight.has(c)) {
      const start = c * CHUNK, end = Math.min(start + CHUNK, this.total), extra = this.extraName();
      const more = extra === null ? "" : "&extra=" + encodeURIComponent(extra);
      const p = fetch(`${this.url}?start=${start}&end=${end}&format=bin&kinds=1${more}`).then(async (resp) => {
        if (!resp.ok) throw new Error(`tokens ${start}-${end}: ${resp.status}`);
        const buf = await resp.arrayBuffer();
        if (extra !== this.extraName()) return;  // the colour mode changed meanwhile
        const n = Number(resp.headers.get("X-Token-End")) - Number(resp.headers.get("X-Token-Start"));
        // The extra column starts at byte 10n, not 4-aligned: copy it out.
        this.chunks.set(c, { start, n, ids: new Int32Array(buf, 0, n),
          lp: new Float32Array(buf, 4 * n, n), mask: new Uint8Array(buf, 8 * n, n),
          kind: new Uint8Array(buf, 9 * n, n),
          extra: extra === null ? null : new Float32Array(buf.slice(10 * n, 14 * n)) });
        if (extra !== null && resp.headers.get("X-Extra-Min") !== null)
          this.scale = { lo: Number(resp.headers.get("X-Extra-Min")), hi: Number(resp.headers.get("X-Extra-Max")) };
        while (this.chunks.size > KEEP_CHUNKS) this.chunks.delete(this.chunks.keys().next().value);
        this.schedule();
      }).catch((err) => { this.info.textContent = String(err.message || err); })
        .finally(() => this.inflight.delete(c));
      this.inflight.set(c, p);
    }
    return null;
  }

  token(pos) {
    const ch = this.chunk(Math.floor(pos / CHUNK));
    if (!ch || pos - ch.start >= ch.n) return null;
    const k = pos - ch.start;
    return { id: ch.ids[k], lp: ch.lp[k], mask: ch.mask[k], kind: ch.kind[k],
      extra: ch.extra ? ch.extra[k] : null };
  }

  render() {
    const top = this.virtualTop(), viewH = this.box.clientHeight;
    const first = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const last = Math.min(this.rows, Math.ceil((top + viewH) / ROW_H) + OVERSCAN);
    const shift = this.box.scrollTop - top;  // spacer px minus virtual px
    const frag = document.createDocumentFragment();
    for (let r = first; r < last; r++) {
      const row = el("div", { class: "tokrow", style: `top:${r * ROW_H + shift}px` },
        el("span", { class: "pos" }, (r * this.perRow).toLocaleString("en-US")));
      const end = Math.min((r + 1) * this.perRow, this.total);
      for (let pos = r * this.perRow; pos < end; pos++) {
        const t = this.token(pos);
        if (!t) { row.append(el("span", { class: "tok", "data-pos": pos }, "…")); continue; }
        const piece = this.piece(t.id);
        const special = this.vocab && this.vocab.special.has(t.id);
        const [bg, hue] = colour(this.mode, t, this.scale);
        row.append(el("span", { class: `tok k${t.kind}${special ? " special" : ""}`, "data-pos": pos, "data-id": t.id,
          "data-mask": t.mask, "data-kind": t.kind, "data-hue": hue, style: `background-color:${bg}` },
        this.showText && piece !== null ? showPiece(piece) : String(t.id)));
      }
      frag.append(row);
    }
    this.spacer.replaceChildren(frag);
  }

  piece(id) {
    if (!this.vocab || id < 0 || id >= this.vocab.pieces.length) return null;
    return this.vocab.pieces[id];
  }

  hover(target) {
    if (!target.classList || !target.classList.contains("tok")) return;
    const pos = Number(target.dataset.pos), t = this.token(pos);
    if (!t) return;
    const lp = Number.isNaN(t.lp) ? "–" : `${t.lp.toFixed(4)} (p=${Math.exp(t.lp).toFixed(3)})`;
    const piece = this.piece(t.id);
    const text = piece === null ? "" : ` · text ${JSON.stringify(piece)}${this.vocab.special.has(t.id) ? " (special)" : ""}`;
    const extra = t.extra === null ? "" : ` · ${this.extraName()} ${Number.isNaN(t.extra) ? "–" : t.extra.toFixed(4)}`;
    this.info.textContent = `pos ${pos} · id ${t.id}${text} · logprob ${lp}${extra} · ` +
      `${t.mask ? "trained" : "not trained"} · ${KIND_NAMES[t.kind] || "?"}`;
  }
}
