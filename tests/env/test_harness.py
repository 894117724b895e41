"""The Harness base class: declared hooks run in their phases, ``uses_sdk`` decides the
shared HTTP client, a non-harness is refused; stop reasons are a StrEnum that stores as
its string."""

from __future__ import annotations

import pytest

from tracewire import EnvError
from tracewire.codec import decode_json, decode_record, encode_json, record_bytes
from tracewire.env import (
    PHASES,
    Environment,
    Harness,
    Rollout,
    Task,
    run_rollout,
)
from tracewire.model import MODEL_NAME
from tracewire.proxy import Proxy
from tracewire.trace import Episode, StopReason, Trace

TASK = Task("t0", {"prompt": "hi"})


class Recording(Harness):
    """Calls no model: records which hook ran, in which phase, with what."""

    kind = "recording"

    def __init__(self, uses_sdk: bool) -> None:
        self.uses_sdk = uses_sdk
        self.calls: list[tuple[str, str | None]] = []
        self.http: list[object] = []

    async def boot(self, rollout: Rollout) -> None:
        self.calls.append(("boot", rollout.trace.info.get("phase")))

    async def run(self, rollout: Rollout) -> None:
        self.calls.append(("run", rollout.trace.info.get("phase")))
        self.http.append(rollout.http)
        rollout.stop(StopReason.MAX_TURNS)

    async def cleanup(self, rollout: Rollout) -> None:
        self.calls.append(("cleanup", rollout.trace.info.get("phase")))


@pytest.mark.parametrize("uses_sdk", [True, False])
async def test_hooks_run_in_their_phases(proxy: Proxy, uses_sdk: bool) -> None:
    harness = Recording(uses_sdk)
    env = Environment("h", tasks=[TASK], harness=harness)
    ep = Episode()
    await run_rollout(env, TASK, proxy=proxy, episode=ep, model=MODEL_NAME)
    (trace,) = ep.traces
    # cleanup runs after the last phase, once the rollout is over.
    assert harness.calls == [("boot", "boot"), ("run", "agent"), ("cleanup", "scoring")]
    assert (harness.http[0] is not None) is uses_sdk
    assert trace.agent["harness"] == "recording" and list(trace.timing) == list(PHASES)
    assert trace.stop == StopReason.MAX_TURNS == "max_turns"
    assert trace.info["session"] not in proxy.registry


async def test_a_base_harness_needs_only_run(proxy: Proxy) -> None:
    class Minimal(Harness):
        async def run(self, rollout: Rollout) -> None:
            return None

    env = Environment("m", tasks=[TASK], harness=Minimal())
    ep = Episode()
    await run_rollout(env, TASK, proxy=proxy, episode=ep, model=MODEL_NAME)
    (trace,) = ep.traces
    assert trace.ok and trace.stop is StopReason.DONE and trace.agent["harness"] == "custom"


def test_an_object_that_is_not_a_harness_is_refused() -> None:
    class DuckTyped:
        kind = "duck"

        async def run(self, rollout: Rollout) -> None:
            return None

    with pytest.raises(EnvError, match=r"not a tracewire\.env\.Harness"):
        Environment("d", harness=DuckTyped())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Harness()  # type: ignore[abstract]


def test_stop_reasons_are_their_strings() -> None:
    for phase in PHASES:
        assert StopReason.failed(phase, timed_out=True) == f"{phase}_timeout"
        assert StopReason.failed(phase, timed_out=False) == f"{phase}_error"
    with pytest.raises(ValueError):
        StopReason.failed("lunch", timed_out=False)
    # Stored as the plain string (JSON and binary), read back equal to the member.
    trace = Trace()
    trace.stop = StopReason.AGENT_TIMEOUT
    assert b'"stop":"agent_timeout"' in encode_json(trace)
    back = decode_json(encode_json(trace))
    assert isinstance(back, Trace) and back.stop == StopReason.AGENT_TIMEOUT
    again = decode_record(record_bytes(trace))
    assert isinstance(again, Trace) and type(again.stop) is str
    assert again.stop == "agent_timeout" == StopReason.AGENT_TIMEOUT
