"""Served rollouts are journaled as their deltas arrive: an eval process SIGKILLed while a
rollout runs on an env-server worker keeps the turns it received, and ``--resume`` stores
them as an incomplete episode, as it does for local rollouts.

Real parts throughout: an eval in a subprocess (built-in model child process, env server,
worker process, ZMQ client on loopback, run store), killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tracewire.compose import evaluate
from tracewire.store import open_run

SLOW_ENV = str(Path(__file__).with_name("slow_env.py"))
# ``tracewire eval FILE.py --backend process`` hands its workers the environment's name, not
# the file (they cannot load it), so the child calls ``evaluate`` with the path itself.
_EVAL = """
import asyncio, sys
from tracewire.compose import evaluate
asyncio.run(evaluate(sys.argv[1], out=sys.argv[2], backend="process", workers=1,
                     concurrency=1))
"""


def _wait_for(what: str, cond: object, proc: subprocess.Popen[bytes], limit: float = 180.0
              ) -> None:
    deadline = time.monotonic() + limit
    while not cond():  # type: ignore[operator]
        if proc.poll() is not None:
            raise AssertionError(f"the eval exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {limit}s")
        time.sleep(0.1)


@pytest.mark.slow
def test_a_killed_client_keeps_the_served_turns_it_received(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, reached, release = tmp_path / "run", tmp_path / "reached", tmp_path / "release"
    monkeypatch.setenv("TW_SLOW_REACHED", str(reached))  # the workers inherit these
    monkeypatch.setenv("TW_SLOW_RELEASE", str(release))
    proc = subprocess.Popen(
        [sys.executable, "-c", _EVAL, SLOW_ENV, str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    seen: list[tuple[int, np.ndarray]] = []
    try:
        _wait_for("the third turn", reached.exists, proc)

        def journaled() -> bool:
            if not (out / "live").is_dir():
                return False
            with open_run(out) as r:
                live = [e for e in r.live() if e.traces and len(e.traces[0].calls) >= 3]
            seen[:] = [(len(e.traces[0].calls), e.traces[0].columns.ids.copy()) for e in live]
            return bool(live)

        _wait_for("a journal of three turns", journaled, proc)
        os.kill(proc.pid, signal.SIGKILL)  # the client, mid-rollout
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        # Its children (model server, env-server worker) share its session: end them too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    with open_run(out) as r:
        assert len(r) == 0 and r.meta["status"] == "running"
        assert len(r.live()) == 1  # what the killed client received, still on disk
    release.touch()
    res = asyncio.run(evaluate(SLOW_ENV, out=out, resume=True, backend="process", workers=1,
                               concurrency=1))
    assert (res.summary.episodes, res.summary.skipped) == (1, 0)
    with open_run(out) as r:
        rows = r.rows()
        assert [(x.task_key, x.status) for x in rows] == [("slow-000", "incomplete"),
                                                         ("slow-000", "complete")]
        kept = r.read(rows[0].ref)
        done = r.read(rows[1].ref)
        assert not r.live() and r.verify().ok
    [(calls, ids)] = seen
    assert calls == 3 and len(kept.traces[0].calls) == 3
    # The incomplete episode holds exactly the tokens the client had received.
    assert np.array_equal(kept.traces[0].columns.ids, ids)
    assert kept.info["incomplete"] and not done.info.get("incomplete")
    # The resumed run's rollout went the same way and on to its end.
    assert len(done.traces[0].calls) == 3 and done.traces[0].stop == "done"
    assert np.array_equal(done.traces[0].columns.ids[: len(ids)], ids)
