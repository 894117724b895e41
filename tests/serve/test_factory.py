"""Runner factories reach worker processes by reference; serve names none of a part above it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tracewire._errors import EnvError, ServeError
from tracewire.compose import env_factory
from tracewire.serve import EnvServer, Runner, factory_ref, load_factory, standin_factory


def test_a_module_level_factory_round_trips_through_its_reference() -> None:
    for factory in (standin_factory, env_factory):
        ref = factory_ref(factory)
        assert ref.count(":") == 1 and load_factory(ref) is factory
    assert factory_ref(env_factory) == "tracewire.compose._envrunner:env_factory"
    assert factory_ref("pkg.mod:attr") == "pkg.mod:attr"  # a user's spec is kept as given


def test_a_factory_without_an_importable_name_fails_before_any_worker_starts() -> None:
    @contextlib.asynccontextmanager
    async def local(env: str, options: dict[str, Any]) -> AsyncIterator[Runner]:
        yield standin_factory  # type: ignore[misc]  # never entered

    with pytest.raises(EnvError, match="importable"):
        factory_ref(local)
    with pytest.raises(EnvError, match="module:attribute"):
        factory_ref("no_colon")
    with pytest.raises(EnvError, match="module:attribute"):
        EnvServer("standin", factory=local.__name__)


async def test_a_real_environment_needs_a_factory_and_the_standin_does_not() -> None:
    with pytest.raises(ServeError, match="runner factory"):
        EnvServer("arithmetic")
    for server, factory in ((EnvServer("standin"), standin_factory),
                            (EnvServer("arithmetic", factory=env_factory), env_factory)):
        # What its workers are told to load: the function's own name.
        assert server.factory == factory_ref(factory)
        await server.stop(drain=False, timeout=0)
