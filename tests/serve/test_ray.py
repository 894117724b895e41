"""Runs the Ray suite (tests/serve/ray) inside a private network namespace holding only lo.

Ray listens on, and resolves its node address from, every interface it can see; inside a
namespace made here with ``unshare --net`` it sees only loopback. Each launcher runs one
child pytest there and passes only if every child test ran and passed (none skipped).
Skipped, with the reason, where Ray is not installed or the namespace cannot be made.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _netns_ok() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed (pip install -e '.[dev,ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip not found: cannot make a private network namespace for Ray"
    probe = subprocess.run(["unshare", "--net", "--", "ip", "link", "set", "lo", "up"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode:
        return f"cannot make a network namespace (needs root): {probe.stderr.strip()}"
    return None


def run_in_netns(tmp_path: Path, *targets: str, limit: float = 240) -> None:
    why = _netns_ok()
    if why:
        pytest.skip(why)
    report = tmp_path / "junit.xml"
    # Short: Ray's unix socket paths under it must fit in 107 bytes.
    short = Path(tempfile.mkdtemp(prefix="twray-", dir="/tmp"))
    try:
        _run(report, short, targets, limit)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _run(report: Path, short: Path, targets: tuple[str, ...], limit: float) -> None:
    env = {**os.environ, "TRACEWIRE_NETNS": "1", "HOME": str(short),
           "RAY_TMPDIR": str(short), "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "pytest", *targets, "-q", "-p", "no:randomly",
           "-p", "no:cacheprovider", f"--junitxml={report}", "-o", "junit_family=xunit2"]
    script = 'ip link set lo up && exec "$@"'
    proc = subprocess.run(["unshare", "--net", "--", "sh", "-c", script, "sh", *cmd],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
    out = proc.stdout[-8000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, out
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] > 0 and counts["failures"] == counts["errors"] == 0, out
    assert counts["skipped"] == 0, f"skipped inside the namespace:\n{out}"


@pytest.mark.slow
def test_backend_contract_actor_faults_and_impostor_in_a_private_namespace(tmp_path: Path) -> None:
    run_in_netns(tmp_path, "tests/serve/ray/test_contract.py", "tests/serve/ray/test_faults.py",
                 "tests/serve/ray/test_trust.py", limit=300)


@pytest.mark.slow
def test_node_loss_on_a_two_node_cluster_in_a_private_namespace(tmp_path: Path) -> None:
    run_in_netns(tmp_path, "tests/serve/ray/test_cluster.py")


def test_ray_backend_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracewire import ServeError
    from tracewire.serve import RayPool

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ServeError, match=r"tracewire\[ray\]"):
        RayPool().prepare()
