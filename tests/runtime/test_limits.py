"""Where sandbox cgroups go, computed from ``/proc/self/cgroup`` and the mount table: the
texts of a hybrid host (this one's shape), a container whose hierarchies are mounted at
its own cgroup, and a pure cgroup v2 host (its files simulated in a temp dir, since this
machine's v2 hierarchy has no controllers to test with)."""

from __future__ import annotations

from pathlib import Path

from tracewire.runtime._limits import own_cgroups

HYBRID_CG = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n0::/\n"
HYBRID_MI = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")


def test_hybrid_takes_each_controller_from_its_v1_hierarchy() -> None:
    got = own_cgroups(["pids", "memory"], proc_cgroup=HYBRID_CG, mountinfo=HYBRID_MI)
    assert got == {"pids": (Path("/sys/fs/cgroup/pids"), False),
                   "memory": (Path("/sys/fs/cgroup/memory/process_api/abc"), False)}


def test_a_container_mount_rooted_at_its_own_cgroup() -> None:
    # Without a cgroup namespace the process sees its full path, and the hierarchy is
    # mounted at /docker/c1: the directory is the mount point plus the rest of the path.
    cg = "5:pids:/docker/c1/job\n3:cpu,memory:/docker/c1\n"
    mi = ("40 31 0:36 /docker/c1 /sys/fs/cgroup/pids ro - cgroup cgroup rw,pids\n"
          "41 31 0:37 /docker/c1 /sys/fs/cgroup/cpu,memory ro - cgroup cgroup rw,cpu,memory\n")
    got = own_cgroups(["pids", "memory"], proc_cgroup=cg, mountinfo=mi)
    assert got == {"pids": (Path("/sys/fs/cgroup/pids/job"), False),
                   "memory": (Path("/sys/fs/cgroup/cpu,memory"), False)}


def test_a_path_outside_the_namespace_is_not_guessed() -> None:
    cg = "5:pids:/../../elsewhere\n"
    mi = "40 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    assert own_cgroups(["pids"], proc_cgroup=cg, mountinfo=mi) == {}


def test_pure_v2_nests_under_the_own_cgroup_when_delegated(tmp_path: Path) -> None:
    own = tmp_path / "user.slice" / "job"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("memory pids\n")
    mi = f"30 1 0:27 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    got = own_cgroups(["pids", "memory"], proc_cgroup="0::/user.slice/job\n", mountinfo=mi)
    assert got == {"pids": (own, True), "memory": (own, True)}


def test_pure_v2_without_the_controller_is_refused(tmp_path: Path) -> None:
    own = tmp_path / "job"
    own.mkdir()
    (own / "cgroup.controllers").write_text("cpu\n")  # pids not offered by the parent
    (own / "cgroup.subtree_control").write_text("")
    mi = f"30 1 0:27 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    assert own_cgroups(["pids"], proc_cgroup="0::/job\n", mountinfo=mi) == {}
