"""A user's script sees real types through ``import tracewire`` (mypy strict, in a subprocess).

The lazy loader of ``tracewire/__init__.py`` resolves names at run time; without typed
imports behind it every public name would be ``Any`` to mypy users. Each ``reveal_type``
below must name the real class or function, and the deliberately wrong lines must be
reported — with ``Any`` they would pass silently.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    '''
    import asyncio

    import tracewire


    async def main() -> None:
        result = await tracewire.evaluate("guess", n=1)
        reveal_type(result.run)
        async with tracewire.Proxy("http://127.0.0.1:1") as proxy:
            reveal_type(proxy)
            session = proxy.create_session()
            reveal_type(session.trace)
        stored = tracewire.open_run("runs/x")
        reveal_type(stored)
        wrong: int = tracewire.open_run("runs/x")  # must be an error
        writer = await tracewire.Run.create("runs/y")
        reveal_type(writer)
        tracewire.Proxy(upstream=42)  # must be an error


    asyncio.run(main())
    '''
)


def test_mypy_sees_real_types(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--cache-dir", str(tmp_path / "cache"), str(script)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    ).stdout
    notes = [ln for ln in out.splitlines() if "Revealed type" in ln]
    assert len(notes) == 5, out
    assert "tracewire.store." in notes[0] and "RunReader" in notes[0], out
    assert "tracewire.proxy." in notes[1] and "Proxy" in notes[1], out
    assert "tracewire.trace." in notes[2] and "Trace" in notes[2], out
    assert "tracewire.store." in notes[3] and "RunReader" in notes[3], out
    assert "tracewire.store." in notes[4] and "RunWriter" in notes[4], out
    errors = [ln for ln in out.splitlines() if ": error:" in ln]
    assert any("Incompatible types in assignment" in e and '"RunReader"' in e for e in errors), out
    assert any('"Proxy"' in e and "incompatible type" in e for e in errors), out
    assert len(errors) == 2, out
