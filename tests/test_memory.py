"""Processes that move episodes keep freed token memory in the heap for the next one."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import ctypes, sys
import numpy as np
from tracewire._memory import tune_allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
if sys.argv[1] == "tune":
    assert tune_allocator() and tune_allocator()  # idempotent
elif sys.argv[1] == "client-default":
    from tracewire.serve import EnvClient
    EnvClient("tcp://127.0.0.1:9")
elif sys.argv[1] == "client-untuned":
    from tracewire.serve import EnvClient
    EnvClient("tcp://127.0.0.1:9", tune_memory=False)
elif sys.argv[1].startswith("proxy-"):
    import asyncio
    from tracewire.proxy import Proxy, ProxyConfig

    async def start_stop():
        cfg = ProxyConfig(tune_memory=sys.argv[1] == "proxy-default")
        async with Proxy("http://127.0.0.1:9", config=cfg, session_api=False):
            pass
    asyncio.run(start_stop())
big = np.ones(40 << 20, np.uint8)  # above glibc's largest dynamic mmap threshold (32 MiB)
print(mallinfo2().hblkhd >= big.nbytes)
"""


def _mmapped(mode: str) -> bool:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.strip() == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc allocator only")
def test_tuned_process_serves_large_blocks_from_the_reusable_heap() -> None:
    # Untuned, a 40 MiB block is a fresh mmap (page faults on every episode); tuned, it
    # comes from the heap, where a freed block is reused without faults.
    assert _mmapped("default") is True
    assert _mmapped("tune") is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc allocator only")
def test_client_tunes_its_process_unless_told_not_to() -> None:
    assert _mmapped("client-default") is False
    assert _mmapped("client-untuned") is True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc allocator only")
def test_proxy_tunes_its_process_unless_configured_not_to() -> None:
    assert _mmapped("proxy-default") is False
    assert _mmapped("proxy-untuned") is True
