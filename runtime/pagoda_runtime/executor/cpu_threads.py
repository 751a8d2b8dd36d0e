"""How many threads the CPU path runs: the cores this process may use, capped by its cgroup's CPU quota.

A pod limited to 2 CPUs on a 64-core node still sees 64 cores (os.cpu_count, sched_getaffinity),
and torch starts one OpenMP thread per core. The kernel then grants the pod 2 CPUs' worth of time
per quota period: 64 threads use it up in a fraction of the period and every parallel region waits
for the throttled stragglers. One thread per CPU of quota avoids that, as Go's automaxprocs does.

An explicit OMP_NUM_THREADS wins: whoever set it knows the machine.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup(proc_cgroup: Path, controller: str) -> str:
    """This process's path in the hierarchy of `controller` ("" for cgroup v2's unified one)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return "/"


def _candidates(root: Path, path: str) -> list[Path]:
    """The process's own cgroup folder first, then the mount's root (a container sees its own there)."""
    own = root / path.lstrip("/")
    return [own, root] if own != root else [root]


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota in CPUs (quota / period), or None where no quota applies."""
    for folder in _candidates(root, _own_cgroup(proc_cgroup, "")):
        try:  # cgroup v2: "max 100000" or "200000 100000"
            quota, period = (folder / "cpu.max").read_text().split()
        except (OSError, ValueError):
            continue
        return None if quota == "max" else int(quota) / int(period)
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for folder in _candidates(root / name, _own_cgroup(proc_cgroup, "cpu")):
            try:  # cgroup v1: a quota of -1 means none
                quota = int((folder / "cpu.cfs_quota_us").read_text())
                period = int((folder / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                continue
            return None if quota <= 0 or period <= 0 else quota / period
    return None


def cpu_thread_count(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup"), cores: int | None = None
) -> int:
    """One thread per core we may run on, and no more than the whole CPUs of the quota (at least 1)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit(root, proc_cgroup)
    if limit is None:
        return cores
    return max(1, min(cores, math.floor(limit)))


def configure_torch_threads() -> int:
    """Set torch's intra-op threads for the CPU path; returns the count in use."""
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(cpu_thread_count())
    return torch.get_num_threads()
