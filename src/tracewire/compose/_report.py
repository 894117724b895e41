"""Terminal output of an eval: a live ``rich`` progress bar and the summary table."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from ..store import RunStatus
from ._summary import Summary, Tally

__all__ = ["EvalProgress", "render_summary"]


class EvalProgress:
    """Progress bar: episodes done, mean reward so far, errors, sampled tokens per second."""

    def __init__(self, console: Console, total: int | None, label: str) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("errors {task.fields[errors]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task = self._progress.add_task(label, total=total, reward="-", errors=0, tps="0")

    def __enter__(self) -> EvalProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, tally: Tally) -> None:
        """Show the tally's current numbers."""
        mean = tally.mean_reward
        self._progress.update(
            self._task,
            completed=tally.n,
            reward="-" if mean is None else f"{mean:.3f}",
            errors=tally.n_errors,
            tps=f"{tally.tokens_per_s():.0f}",
        )


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def render_summary(console: Console, s: Summary) -> None:
    """Print the end-of-run table."""
    t = Table(title=f"tracewire eval · {s.env} · {s.model}", show_header=False, box=None)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    status = s.status if s.status == RunStatus.COMPLETE else f"[yellow]{s.status}[/yellow]"
    t.add_row("status", status)
    extra = f" ({s.skipped} already done)" if s.skipped else ""
    t.add_row("episodes", f"{s.episodes} over {s.tasks} tasks, {s.ok} without error{extra}")
    reward = _num(s.reward_mean)
    if s.reward_stderr is not None:
        reward += f" ± {s.reward_stderr:.3f}"
    t.add_row("reward", reward)
    for name, value in s.rewards.items():
        t.add_row(f"  {name}", _num(value))
    if s.pass_at:
        t.add_row("pass@k", "  ".join(f"@{k} {v:.3f}" for k, v in s.pass_at.items()))
    t.add_row("turns", _num(s.turns_mean, 2))
    tokens = f"{_num(s.tokens_mean, 1)} per episode ({_num(s.completion_tokens_mean, 1)} sampled)"
    t.add_row("tokens", tokens)
    t.add_row("throughput", f"{s.tokens_per_s:.0f} sampled tok/s over {s.wall_s:.1f} s")
    t.add_row("stops", ", ".join(f"{k} {v}" for k, v in s.stops.items()) or "-")
    t.add_row("errors", ", ".join(f"{k} {v}" for k, v in s.errors.items()) or "none")
    if s.tito_mismatch is not None:
        # Token-in/token-out only: differences from a canonical re-render that point at a
        # template or bridge bug (0 when the recorded ids are what the model saw).
        t.add_row("tito mismatch", str(s.tito_mismatch))
    if s.loop_lag_p99_ms is not None:
        lag = f"{s.loop_lag_p99_ms:.1f} ms"
        if s.loop_busy is not None:
            # Lag from a saturated loop is queueing, not a stall: say which it is.
            lag += f" (loop busy {s.loop_busy:.0%})"
        t.add_row("loop lag p99", lag)
    console.print(t)
    # On its own unwrapped line, so the path can be copied whatever the terminal width.
    console.print(f"run directory: {s.run_dir}", soft_wrap=True, highlight=False)

