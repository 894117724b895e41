"""Episodes for the viewer's tests, written into real runs with the store's writer."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

import numpy as np

from tracewire.store import COLUMNS, ROW_CRC, Run, row_crc
from tracewire.trace import Call, Episode, Message, Span, ToolCall, Trace

ENVS = ("arith", "tools")


def _turn(trace: Trace, parent: int | None, text: str, rng: np.random.Generator,
          n_out: int = 6, t0: float = 0.0) -> int:
    """A user prompt and a sampled answer under ``parent``; returns the answer's node."""
    u = trace.add_node(Message(role="user", content=text), parent=parent,
                       ids=rng.integers(0, 500, 4))
    a = trace.add_node(
        Message(role="assistant", content=f"answer to {text}"), parent=u, sampled=True,
        ids=rng.integers(0, 500, n_out), logprobs=-rng.random(n_out).astype(np.float32),
    )
    trace.add_call(Call(model="m", endpoint="chat", finish_reason="stop", node=a, prompt_node=u,
                        span=Span(start=t0, end=t0 + 0.5), usage={"completion_tokens": n_out}))
    return a


def tool_episode(i: int, *, reward: float, env: str, errors: bool = False) -> Episode:
    """A linear episode with a system prompt, a tool call and its result, then an answer."""
    rng = np.random.default_rng(i)
    t0 = 1_700_000_000.0 + i
    ep = Episode(env=env, task_key=f"task-{i:03d}", group_index=i % 2, run="fixture")
    tr = ep.new_trace()
    s = tr.add_node(Message(role="system", content="You are terse."), ids=[1, 2, 3])
    u = tr.add_node(Message(role="user", content=f"What is {i} + {i}?"), parent=s,
                    ids=rng.integers(0, 500, 5))
    call = ToolCall(id=f"call_{i}", name="add", arguments=f'{{"a": {i}, "b": {i}}}')
    a = tr.add_node(Message(role="assistant", content=None, tool_calls=[call]), parent=u,
                    sampled=True, ids=rng.integers(0, 500, 7),
                    logprobs=-rng.random(7).astype(np.float32))
    tr.add_call(Call(model="m", endpoint="chat", finish_reason="tool_calls", node=a,
                     prompt_node=u, span=Span(start=t0 + 0.1, end=t0 + 0.6)))
    r = tr.add_node(Message(role="tool", content=str(2 * i), tool_call_id=f"call_{i}"),
                    parent=a, ids=rng.integers(0, 500, 3))
    f = tr.add_node(Message(role="assistant", content=f"The sum is {2 * i}."), parent=r,
                    sampled=True, ids=rng.integers(0, 500, 5),
                    logprobs=-rng.random(5).astype(np.float32))
    tr.add_call(Call(model="m", endpoint="chat", finish_reason="stop", node=f, prompt_node=r,
                     span=Span(start=t0 + 0.7, end=t0 + 1.0)))
    tr.set_reward("correct", reward)
    tr.metrics["turns"] = 2.0
    tr.stop = "max_turns" if errors else "done"
    tr.completed = True
    tr.timing = {"agent": Span(start=t0 + 0.05, end=t0 + 1.05)}
    ep.timing = {"setup": Span(start=t0, end=t0 + 0.05), "scoring": Span(start=t0 + 1.05,
                                                                         end=t0 + 1.1)}
    if errors:
        tr.add_error("ToolError", "the tool crashed", phase="agent")
    return ep


def branched_episode() -> Episode:
    """One trace with two leaves: a retry of the second turn with a different answer."""
    rng = np.random.default_rng(7)
    ep = Episode(env="guess", task_key="branchy", run="fixture")
    tr = ep.new_trace()
    s = tr.add_node(Message(role="system", content="Guess the number."), ids=[9, 9])
    a1 = _turn(tr, s, "first guess", rng, t0=1_700_000_100.0)
    _turn(tr, a1, "left branch", rng, t0=1_700_000_101.0)
    _turn(tr, a1, "right branch", rng, t0=1_700_000_102.0)
    tr.set_reward("found", 0.5)
    tr.stop = "done"
    return ep


def long_episode(turns: int, tokens_per_turn: int = 4) -> Episode:
    """A linear episode of ``turns`` user/assistant turns."""
    rng = np.random.default_rng(1)
    ep = Episode(env="long", task_key=f"long-{turns}", run="fixture")
    tr = ep.new_trace()
    parent: int | None = tr.add_node(Message(role="system", content="long"), ids=[5])
    for k in range(turns):
        parent = _turn(tr, parent, f"turn {k}", rng, n_out=tokens_per_turn, t0=1.7e9 + k)
    tr.stop = "done"
    return ep


def big_tokens_episode(n_tokens: int) -> Episode:
    """One answer node holding ``n_tokens`` sampled tokens (ids = position mod 50,000)."""
    ep = Episode(env="big", task_key="million", run="fixture")
    tr = ep.new_trace()
    u = tr.add_node(Message(role="user", content="write a lot"), ids=[1, 2, 3, 4])
    ids = (np.arange(n_tokens) % 50_000).astype(np.int32)
    lp = np.linspace(-5.0, 0.0, n_tokens, dtype=np.float32)
    tr.add_node(Message(role="assistant", content="(very long)"), parent=u, sampled=True,
                ids=ids, logprobs=lp)
    tr.stop = "length"
    return ep


async def write_run(path: Path, episodes: list[Episode], meta: dict[str, str] | None = None
                    ) -> None:
    """Create a run at ``path`` holding ``episodes`` (appended in order), then close it."""
    run = await Run.create(path, meta=meta or {"name": "fixture"}, fsync="never")
    for ep in episodes:
        await run.append(ep)
    await run.close()


def fixture_episodes() -> list[Episode]:
    """The standard small run: 30 tool episodes over two envs, a branched one."""
    eps = [
        tool_episode(i, reward=round((i * 37 % 30) / 30, 3), env=ENVS[i % 2], errors=i % 7 == 3)
        for i in range(30)
    ]
    eps.append(branched_episode())
    return eps


def make_fixture_run(path: Path, *, big: int = 0) -> dict[str, Episode]:
    """Write the standard run (plus a ``big``-token episode if asked); returns id -> episode."""
    eps = fixture_episodes()
    if big:
        eps.append(big_tokens_episode(big))
    # In a thread of its own: Playwright's sync API keeps an event loop on the test thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, write_run(path, eps)).result()
    return {ep.id: ep for ep in eps}


def insert_sql() -> str:
    """Upsert of one index row with the store's public column list (the index table is
    ``episodes``): a test shortcut that fills a big index without writing records."""
    cols = [*COLUMNS, ROW_CRC]
    names = ", ".join(f'"{n}"' for n in cols)
    return f"INSERT OR REPLACE INTO episodes ({names}) VALUES ({', '.join('?' for _ in cols)})"


def padded(row: tuple[object, ...]) -> tuple[object, ...]:
    """An index row written for the columns known when the test was written, with any
    column the store added since left null, and its checksum (readers check it)."""
    values = row + (None,) * (len(COLUMNS) - len(row))
    return (*values, row_crc(values))
