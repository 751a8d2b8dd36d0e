"""The CPU path runs one thread per CPU of the pod's quota, read from cgroup v1 or v2."""

from pathlib import Path

import pytest
from pagoda_runtime.executor.cpu_threads import cgroup_cpu_limit, cpu_thread_count


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def proc_cgroup(tmp_path):
    path = tmp_path / "proc-self-cgroup"
    write(path, "0::/\n")
    return path


@pytest.mark.parametrize(
    ("cpu_max", "cores", "threads"),
    [
        ("200000 100000\n", 64, 2),  # limits.cpu: 2 on a 64-core node
        ("150000 100000\n", 64, 1),  # 1.5 CPUs: a second thread would be throttled half the time
        ("50000 100000\n", 64, 1),  # below one CPU still runs one thread
        ("800000 100000\n", 4, 4),  # a quota above the cores this process may use
        ("max 100000\n", 16, 16),  # no quota
    ],
)
def test_cgroup_v2_quota_caps_threads(tmp_path, proc_cgroup, cpu_max, cores, threads):
    write(tmp_path / "cg" / "cpu.max", cpu_max)
    assert cpu_thread_count(tmp_path / "cg", proc_cgroup, cores=cores) == threads


def test_cgroup_v2_reads_the_process_own_group(tmp_path):
    write(tmp_path / "cg" / "cpu.max", "max 100000\n")
    write(tmp_path / "cg" / "kubepods" / "pod1" / "cpu.max", "300000 100000\n")
    proc = tmp_path / "proc"
    write(proc, "0::/kubepods/pod1\n")
    assert cgroup_cpu_limit(tmp_path / "cg", proc) == 3.0


@pytest.mark.parametrize("controller_dir", ["cpu", "cpu,cpuacct"])
def test_cgroup_v1_quota(tmp_path, controller_dir):
    proc = tmp_path / "proc"
    # Without a cgroup namespace the process's path is the host's; the container mounts its own
    # group at the controller's root.
    write(proc, "4:memory:/kubepods/x\n3:cpu,cpuacct:/kubepods/burstable/pod9/abc\n0::/\n")
    write(tmp_path / "cg" / controller_dir / "cpu.cfs_quota_us", "250000\n")
    write(tmp_path / "cg" / controller_dir / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path / "cg", proc) == 2.5
    assert cpu_thread_count(tmp_path / "cg", proc, cores=8) == 2


def test_cgroup_v1_without_quota_uses_every_core(tmp_path, proc_cgroup):
    write(tmp_path / "cg" / "cpu" / "cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "cg" / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path / "cg", proc_cgroup) is None
    assert cpu_thread_count(tmp_path / "cg", proc_cgroup, cores=6) == 6


def test_no_cgroup_files_uses_every_core(tmp_path, proc_cgroup):
    assert cpu_thread_count(tmp_path / "missing", proc_cgroup, cores=3) == 3
