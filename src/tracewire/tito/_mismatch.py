"""How a branch's recorded ids differ from a canonical render of its final conversation.

Token-in/token-out keeps the sampled ids, so differences from a full re-render are expected;
what matters is where they are. Each differing stretch is classified:

- ``special``: special tokens differ in count or type (a lost or doubled close token, a
  missing BOS) — a template or bridge bug;
- ``prompt_text``: text the model did not sample differs (a junction, a role header, a tool
  result) — a template or bridge bug;
- ``assistant_text``: text the model sampled renders differently (re-serialized tool-call
  arguments, stripped ``<think>``, trimmed whitespace) — benign;
- ``retokenized``: the same text as other ids (a non-canonical sampled tokenization) —
  benign.

:func:`mismatch_report` is linear in the branch length: equal runs are found with numpy
(a memcmp), and after each differing stretch the two sequences are re-synchronised at the
nearest shared run of :data:`ANCHOR` ids, searched in windows that grow from 64 to
:data:`MAX_WINDOW` ids (a stretch that does not re-synchronise within that is one
difference to the end); a long stretch is cut at the special ids (turn delimiters) both
sides hold in the same order, and a short one split at the equal runs inside it by an exact
diff of that stretch alone, within a work budget linear in the branch. Large texts
are encoded and decoded through the tokenizer's batch calls, which release the GIL. Still
CPU work: run it in a thread, never on the event loop (the interpreter hands the GIL to the
loop's thread every switch interval; explicit ``sleep(0)`` yields were tried and cost 3 ms
each on a loaded machine for no gain). A 200k-id branch: ~0.5-1 s on a loaded 2-core
machine.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..tokens import chat_messages
from ._render import PromptBuilder

__all__ = ["Difference", "DifferenceKind", "MismatchReport", "mismatch_report"]


class DifferenceKind(StrEnum):
    """The class of one differing stretch (see module docstring)."""

    SPECIAL = "special"
    PROMPT_TEXT = "prompt_text"
    ASSISTANT_TEXT = "assistant_text"
    RETOKENIZED = "retokenized"


BENIGN = frozenset({DifferenceKind.ASSISTANT_TEXT, DifferenceKind.RETOKENIZED})


@dataclass(slots=True)
class Difference:
    """One differing stretch: ``recorded[r0:r1]`` versus ``canonical[c0:c1]``."""

    kind: DifferenceKind
    r0: int
    r1: int
    c0: int
    c1: int
    recorded_text: str
    canonical_text: str
    special_delta: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class MismatchReport:
    """All differences of one branch; :attr:`mismatch` counts the non-benign ones (the
    figure reported as ``tito_mismatch``)."""

    recorded_tokens: int
    canonical_tokens: int
    differences: list[Difference] = field(default_factory=list)  # the first max_examples
    by_kind: Counter[str] = field(default_factory=Counter)  # all of them

    @property
    def mismatch(self) -> int:
        """Differences that point at a template or bridge bug."""
        return sum(n for k, n in self.by_kind.items() if DifferenceKind(k) not in BENIGN)

    def counts(self) -> dict[str, int]:
        """Differences by kind."""
        return dict(self.by_kind)

    def summary(self) -> dict[str, Any]:
        """A JSON-able summary for session and eval reports."""
        return {"mismatch": self.mismatch, "by_kind": self.counts(),
                "recorded_tokens": self.recorded_tokens,
                "canonical_tokens": self.canonical_tokens}


#: Ids two sequences must share in a row to count as re-synchronised after a difference.
ANCHOR = 8
#: Candidate runs are compared up to this many ids.
RUN_CAP = 64
#: The widest window searched for that run; beyond it the rest is one difference.
MAX_WINDOW = 16384
#: A stretch at most this many ids a side is split further by an exact diff ...
REFINE_SPAN = 256
#: ... while the exact diffs' work (the product of the sides) stays within this many
#: times the two sequences' length: linear however hostile the input.
REFINE_BUDGET = 64
_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)


def _equal_run(r: NDArray[np.int64], i: int, c: NDArray[np.int64], j: int) -> int:
    """How many ids ``r[i:]`` and ``c[j:]`` share from the start (numpy, in growing chunks,
    so a long equal run costs a few memcmps and a near difference costs little)."""
    n = min(len(r) - i, len(c) - j)
    done, step = 0, 256
    while done < n:
        k = min(step, n - done)
        neq = np.flatnonzero(r[i + done:i + done + k] != c[j + done:j + done + k])
        if len(neq):
            return done + int(neq[0])
        done += k
        step *= 4
    return n


def _anchors(x: NDArray[np.int64]) -> NDArray[np.uint64]:
    """A hash of every run of ANCHOR ids of ``x`` (position p hashes x[p:p+ANCHOR])."""
    m = len(x) - ANCHOR + 1
    h = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(ANCHOR):
            h = h * _HASH_MUL + x[k:k + m].astype(np.uint64)
    return h


def _runs(r: NDArray[np.int64], a: NDArray[np.intp], c: NDArray[np.int64],
          b: NDArray[np.intp]) -> NDArray[np.intp]:
    """For each candidate pair (a[k], b[k]): how many ids ``r`` and ``c`` share from there,
    up to RUN_CAP (one vectorized comparison of all the candidates)."""
    steps = np.arange(RUN_CAP)
    ra, cb = a[:, None] + steps, b[:, None] + steps
    ok = (ra < len(r)) & (cb < len(c))
    eq = ok & (r[np.minimum(ra, len(r) - 1)] == c[np.minimum(cb, len(c) - 1)])
    first_ne = np.argmin(eq, axis=1)
    return np.where(eq.all(axis=1), RUN_CAP, first_ne)


def _resync(r: NDArray[np.int64], i: int, c: NDArray[np.int64], j: int
            ) -> tuple[int, int] | None:
    """Where ``r`` (from ``i``) and ``c`` (from ``j``) meet again: among the pairs (a, b)
    that share at least ANCHOR ids, the one sharing the longest run (up to RUN_CAP; the
    nearest, least a - i + b - j, among equals). The nearest alone is fooled by repetitive
    text (turn 2 of a loop matching turn 1 a few ids on); the longest run is what stays in
    step. Searched in growing windows; None beyond MAX_WINDOW."""
    w = 64
    while True:
        rw, cw = r[i:i + w + ANCHOR], c[j:j + w + ANCHOR]
        if len(rw) >= ANCHOR and len(cw) >= ANCHOR:
            hr, hc = _anchors(rw), _anchors(cw)
            uc, first = np.unique(hc, return_index=True)  # the first b of each hash
            at = np.searchsorted(uc, hr)
            at[at == len(uc)] = 0
            hit = np.flatnonzero(uc[at] == hr)
            if len(hit):
                bs = first[at[hit]]
                runs = _runs(r, hit + i, c, bs + j)  # hash collisions come out short
                good = runs >= ANCHOR
                if good.any():
                    hit, bs, runs = hit[good], bs[good], runs[good]
                    best = np.lexsort((hit + bs, -runs))[0]
                    return i + int(hit[best]), j + int(bs[best])
        if w >= MAX_WINDOW or (i + w >= len(r) and j + w >= len(c)):
            return None
        w *= 4


def align(recorded: NDArray[np.int64], canon: NDArray[np.int64],
          special: NDArray[np.bool_] | None = None) -> list[tuple[int, int, int, int]]:
    """The differing stretches ``(r0, r1, c0, c1)`` of two id sequences, in order; linear in
    their length (see module docstring). ``special`` (indexed by id) marks the ids a long
    stretch is cut at where both sides hold the same ones in the same order (turn
    delimiters: a lost junction after a long retokenized answer is its own difference)."""
    n, m = len(recorded), len(canon)
    head = _equal_run(recorded, 0, canon, 0)
    # The common tail, found from the end, never overlapping the common head.
    lim = min(n, m) - head
    tail = _equal_run(recorded[::-1][:lim].copy(), 0, canon[::-1][:lim].copy(), 0)
    r, c = recorded[:n - tail], canon[:m - tail]
    out: list[tuple[int, int, int, int]] = []
    budget = [REFINE_BUDGET * (n + m + 1)]
    i = j = head
    while i < len(r) or j < len(c):
        hit = _resync(r, i, c, j)
        a, b = hit if hit is not None else (len(r), len(c))
        for piece in _split_at(r, i, a, c, j, b, special):
            out += _refine(r, *piece[:2], c, *piece[2:], budget)
        if hit is None:
            break
        k = _equal_run(r, a, c, b)
        i, j = a + k, b + k
    return out


def _split_at(r: NDArray[np.int64], r0: int, r1: int, c: NDArray[np.int64], c0: int, c1: int,
              special: NDArray[np.bool_] | None) -> list[tuple[int, int, int, int]]:
    """A stretch cut at its shared delimiters: where both sides hold the same special ids in
    the same order, each pair of them is an equal id between two smaller stretches."""
    whole = [(r0, r1, c0, c1)]
    if special is None or (r1 - r0 <= REFINE_SPAN and c1 - c0 <= REFINE_SPAN):
        return whole

    def marks(x: NDArray[np.int64], lo: int, hi: int) -> NDArray[np.intp]:
        seg = x[lo:hi]
        ok = (seg >= 0) & (seg < len(special))
        return lo + np.flatnonzero(ok & special[np.where(ok, seg, 0)])

    pr, pc = marks(r, r0, r1), marks(c, c0, c1)
    if not len(pr) or len(pr) != len(pc) or not np.array_equal(r[pr], c[pc]):
        return whole  # a special id lost or added: one (special) difference
    out = []
    a, b = r0, c0
    for x, y in zip(pr.tolist(), pc.tolist(), strict=True):
        if x > a or y > b:
            out.append((a, x, b, y))
        a, b = x + 1, y + 1
    if r1 > a or c1 > b:
        out.append((a, r1, b, c1))
    return out


def _refine(r: NDArray[np.int64], r0: int, r1: int, c: NDArray[np.int64], c0: int, c1: int,
            budget: list[int]) -> list[tuple[int, int, int, int]]:
    """Split one stretch at the shorter equal runs inside it (a retokenized word next to a
    lost junction are two differences, not one): an exact diff of the stretch when both
    sides are at most REFINE_SPAN ids and the work budget allows."""
    cost = (r1 - r0) * (c1 - c0)
    if r1 - r0 > REFINE_SPAN or c1 - c0 > REFINE_SPAN or cost > budget[0] or not cost:
        return [(r0, r1, c0, c1)]
    budget[0] -= cost
    sm = difflib.SequenceMatcher(a=r[r0:r1].tolist(), b=c[c0:c1].tolist(), autojunk=False)
    return [(r0 + a0, r0 + a1, c0 + b0, c0 + b1)
            for op, a0, a1, b0, b1 in sm.get_opcodes() if op != "equal"]


def mismatch_report(builder: PromptBuilder, recorded: Sequence[int] | NDArray[Any],
                    sampled: Sequence[bool] | NDArray[Any],
                    messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None,
                    *, max_examples: int = 1000, cut: bool = False) -> MismatchReport:
    """Compare ``recorded`` ids (``sampled[i]`` true where the model sampled id ``i``) with a
    canonical render of ``messages`` (the branch's whole conversation, no generation
    prompt). ``cut``: the branch's last turn stopped by length (no close token sampled)."""
    if len(sampled) != len(recorded):
        raise ValueError("sampled mask and recorded ids differ in length")
    tok = builder.tok
    rec = np.asarray(recorded, dtype=np.int64)
    mask = np.asarray(sampled, dtype=bool)
    canon = np.asarray(tok.encode(tok.render(chat_messages(messages), tools)), dtype=np.int64)
    junction = np.asarray(tok.encode(builder.family.junction) if builder.family.junction
                          else [], dtype=np.int64)
    nj = len(junction)
    stop_ids = np.asarray(builder.family.stop_ids, dtype=np.int64)
    if len(rec) and mask[-1]:
        # The branch ends on a sampled id, where the template closes the last turn with its
        # close token and junction: neither is a difference.
        if cut and not np.isin(rec[-1], stop_ids):
            # Cut by length: the model sampled neither (a last sampled id that happens to
            # equal the junction, a newline, is the model's text, not the junction). A later
            # turn that extends it gets them as prompt tokens, compared as usual.
            if nj and np.array_equal(canon[-nj:], junction):
                canon = canon[:-nj]
            if len(canon) and np.isin(canon[-1], stop_ids):
                canon = canon[:-1]
        elif nj and np.array_equal(canon[-nj:], junction) \
                and not np.array_equal(rec[-nj:], junction):
            # A branch ends at the sampled close token, before the junction.
            canon = canon[:-nj]
    special_ids = {v: k for k, v in tok.special.items()}
    is_special = np.zeros(max(tok.vocab_size, *special_ids, 0) + 1, dtype=bool)
    is_special[list(special_ids)] = True

    def specials(seg: NDArray[np.int64]) -> Counter[str]:
        # Ids outside the vocabulary (a bad reply's) are not special: mask them first.
        seg = seg[(seg >= 0) & (seg < len(is_special))]
        return Counter(special_ids[int(i)] for i in seg[is_special[seg]])

    stops = set(builder.family.stop_ids)
    rep = MismatchReport(len(rec), len(canon))
    for r0, r1, c0, c1 in align(rec, canon, is_special):
        rseg, cseg = rec[r0:r1], canon[c0:c1]
        rs, cs = specials(rseg), specials(cseg)
        rt, ct = tok.decode(rseg[(rseg >= 0) & (rseg < tok.vocab_size)].tolist()), \
            tok.decode(cseg.tolist())
        # Text only the canonical render has belongs to the assistant turn when it sits
        # before or inside the sampled text; right after a sampled stop id it is the
        # template's (a lost junction), not the model's.
        in_sampled = bool(mask[r0:r1].any()) if r1 > r0 else bool(
            (r0 < len(mask) and mask[r0])
            or (r0 > 0 and mask[r0 - 1] and int(rec[r0 - 1]) not in stops))
        delta = {k: rs[k] - cs[k] for k in set(rs) | set(cs) if rs[k] != cs[k]}
        if delta:
            kind = DifferenceKind.SPECIAL
        elif rt == ct:
            kind = DifferenceKind.RETOKENIZED
        elif in_sampled:
            kind = DifferenceKind.ASSISTANT_TEXT
        else:
            kind = DifferenceKind.PROMPT_TEXT
        rep.by_kind[kind.value] += 1
        if len(rep.differences) < max_examples:
            rep.differences.append(Difference(kind, r0, r1, c0, c1, rt, ct, delta))
    return rep
