"""Running totals of an eval and its end-of-run summary (reward ± stderr, pass@k, errors)."""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..store import RunStatus
from ..trace import Episode, InfoKey

__all__ = ["Summary", "Tally", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one group: ``n`` samples, ``c`` of them correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class Summary:
    """What an eval produced, as numbers (``as_dict`` for JSON)."""

    env: str
    model: str
    status: RunStatus
    run_dir: str
    episodes: int
    tasks: int
    wall_s: float
    reward_mean: float | None
    reward_stderr: float | None
    rewards: dict[str, float]
    pass_at: dict[int, float]
    turns_mean: float | None
    tokens_mean: float | None
    completion_tokens_mean: float | None
    tokens_per_s: float
    stops: dict[str, int]
    errors: dict[str, int]
    ok: int
    loop_lag_p99_ms: float | None = None
    skipped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: Share of the eval's wall time the event loop's thread was on the CPU (0..1).
    loop_busy: float | None = None
    #: Token-in/token-out runs: non-benign differences of recorded ids from a canonical
    #: render, summed over episodes (``episode.info["tito_mismatch"]``); None otherwise.
    tito_mismatch: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        d = dict(self.__dict__)
        d["pass_at"] = {str(k): v for k, v in self.pass_at.items()}
        return d


class Tally:
    """Accumulates finished episodes; cheap per episode (a few numbers each)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.rewards: list[float] = []
        self.named: defaultdict[str, list[float]] = defaultdict(list)
        self.groups: defaultdict[str, list[float]] = defaultdict(list)
        self.turns: list[int] = []
        self.tokens: list[int] = []
        self.completion: list[int] = []
        self.stops: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.ok = 0
        self.calls_ok = 0
        self.first_error: str | None = None
        self.tito_mismatch: int | None = None

    @property
    def n(self) -> int:
        """Episodes counted."""
        return len(self.rewards)

    @property
    def n_errors(self) -> int:
        """Episodes that ended with an error."""
        return self.n - self.ok

    def add(self, episode: Episode) -> None:
        """Count one finished episode (its main trace)."""
        trace = episode.traces[0] if episode.traces else None
        reward = episode.reward
        self.rewards.append(reward)
        self.groups[episode.task_key].append(reward)
        tm = episode.info.get(InfoKey.TITO_MISMATCH)
        if isinstance(tm, int) and not isinstance(tm, bool):
            self.tito_mismatch = (self.tito_mismatch or 0) + tm
        if trace is None:
            self.stops["no_trace"] += 1
            return
        for name, r in trace.rewards.items():
            self.named[name].append(r.score)
        self.turns.append(len(trace.calls))
        self.calls_ok += sum(1 for c in trace.calls if c.error is None and c.node is not None)
        self.tokens.append(len(trace.columns))
        self.completion.append(sum(n.end - n.start for n in trace.nodes if n.sampled))
        self.stops[trace.stop or "none"] += 1
        if trace.ok and episode.ok:
            self.ok += 1
        for err in trace.errors:
            key = f"{err.phase}:{err.type}" if err.phase else err.type
            self.errors[key] += 1
            if self.first_error is None:
                self.first_error = f"{err.type}: {err.message}"

    @property
    def mean_reward(self) -> float | None:
        """Mean total reward so far (None before the first episode)."""
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def tokens_per_s(self) -> float:
        """Sampled (completion) tokens per second of wall time so far."""
        dt = time.monotonic() - self.started
        return sum(self.completion) / dt if dt > 0 else 0.0

    def pass_at(self) -> dict[int, float]:
        """pass@k for k = 1, 2, 4, ... up to the smallest group, when rewards are binary."""
        if not self.rewards or any(r not in (0.0, 1.0) for r in self.rewards):
            return {}
        smallest = min(len(g) for g in self.groups.values())
        out: dict[int, float] = {}
        k = 1
        while k <= smallest:
            vals = [pass_at_k(len(g), int(sum(g)), k) for g in self.groups.values()]
            out[k] = sum(vals) / len(vals)
            k *= 2
        if smallest not in out and smallest > 0:
            vals = [pass_at_k(len(g), int(sum(g)), smallest) for g in self.groups.values()]
            out[smallest] = sum(vals) / len(vals)
        return out

    def summary(
        self,
        *,
        env: str,
        model: str,
        status: RunStatus,
        run_dir: str,
        loop_lag_p99_ms: float | None = None,
        loop_busy: float | None = None,
        skipped: int = 0,
    ) -> Summary:
        """The summary so far, headed by what the eval was (env, model, status, run dir)
        and the loop figures measured around it."""
        n = self.n
        mean = self.mean_reward
        stderr = None
        if mean is not None and n > 1:
            var = sum((r - mean) ** 2 for r in self.rewards) / (n - 1)
            stderr = math.sqrt(var / n)

        def avg(xs: list[int]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        return Summary(
            episodes=n,
            tasks=len(self.groups),
            wall_s=time.monotonic() - self.started,
            reward_mean=mean,
            reward_stderr=stderr,
            rewards={k: sum(v) / len(v) for k, v in self.named.items() if v},
            pass_at=self.pass_at(),
            turns_mean=avg(self.turns),
            tokens_mean=avg(self.tokens),
            completion_tokens_mean=avg(self.completion),
            tokens_per_s=self.tokens_per_s(),
            stops=dict(self.stops.most_common()),
            errors=dict(self.errors.most_common()),
            ok=self.ok,
            env=env,
            model=model,
            status=status,
            run_dir=run_dir,
            loop_lag_p99_ms=loop_lag_p99_ms,
            loop_busy=loop_busy,
            skipped=skipped,
            tito_mismatch=self.tito_mismatch,
        )
