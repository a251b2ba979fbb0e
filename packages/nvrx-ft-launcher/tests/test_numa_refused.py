"""A NUMA binding the machine refuses never crashes every rank of every cycle."""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

import pytest

from nvrx.ft import FaultToleranceConfig
from nvrx.launcher._cluster import cluster_options
from nvrx.launcher._numa import (
    NODE_ROOT_ENV,
    NumaPlan,
    machine_plan,
    numa_plan,
    numactl_refusal,
    wrap_command,
)

PRINT_CPUS = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]


def _fake_nodes(root: pathlib.Path, cpulists: dict[int, str]) -> pathlib.Path:
    for node, cpulist in cpulists.items():
        (root / f"node{node}").mkdir(parents=True)
        (root / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    return root


def _run_rank(plan: NumaPlan, local_rank: int) -> subprocess.CompletedProcess[str]:
    argv = [w.replace("${local_rank}", str(local_rank)) for w in wrap_command(plan, PRINT_CPUS)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_a_node_outside_this_process_cpus_binds_no_rank() -> None:
    allowed = frozenset({0, 1})
    nodes = {0: frozenset({0, 1, 2, 3}), 1: frozenset({4, 5, 6, 7})}
    plan = numa_plan(2, 1, nodes, allowed=allowed)
    assert plan.nodes == {0: 0, 1: None}
    assert plan.cpus[0] == {0, 1}  # trimmed to what the cpuset allows
    assert plan.reason is not None
    assert "[1]" in plan.reason
    assert "node(s) [1]" in plan.reason


def test_the_machine_plan_uses_this_process_affinity(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    outside = max(allowed) + 64
    _fake_nodes(tmp_path, {0: ",".join(map(str, allowed)), 1: f"{outside}-{outside + 3}"})
    monkeypatch.setenv(NODE_ROOT_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no numactl
    plan = machine_plan(2, 1, strict=False)
    assert plan.method == "sched_setaffinity"
    assert plan.nodes == {0: 0, 1: None}
    done = _run_rank(plan, 1)  # unbound, and it runs
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(allowed)


def _refused_plan(strict: bool) -> NumaPlan:
    outside = max(os.sched_getaffinity(0)) + 64  # a CPU this process may not use
    return NumaPlan({0: 1}, {1: frozenset({outside})}, "sched_setaffinity", strict)


def test_a_refused_affinity_runs_the_rank_unbound_when_not_strict() -> None:
    done = _run_rank(_refused_plan(strict=False), 0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted(os.sched_getaffinity(0)))
    assert "running unbound" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_refused_affinity_stops_the_rank_when_strict() -> None:
    done = _run_rank(_refused_plan(strict=True), 0)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "refused" in done.stderr
    assert "Traceback" not in done.stderr


def _fake_numactl(bin_dir: pathlib.Path, code: int) -> None:
    """A numactl that refuses like one in a container without set_mempolicy."""
    bin_dir.mkdir()
    script = bin_dir / "numactl"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {bin_dir}/calls\n'
        f"[ {code} -eq 0 ] || "
        f'{{ echo "set_mempolicy: Operation not permitted" >&2; exit {code}; }}\n'
        'while [ "${1#--}" != "$1" ]; do shift; done; exec "$@"\n'
    )
    script.chmod(0o755)


@pytest.mark.parametrize("code", [0, 1])
def test_numactl_is_tried_once_per_node_at_start_up(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    _fake_nodes(tmp_path / "nodes", {0: str(allowed[0]), 1: str(allowed[-1])})
    _fake_numactl(tmp_path / "bin", code)
    monkeypatch.setenv(NODE_ROOT_ENV, str(tmp_path / "nodes"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NVRX_GPUS_PER_NUMA", "1")
    plan = machine_plan(2, 1, strict=True)
    assert plan.method == "numactl"
    refused = numactl_refusal(plan)
    args = argparse.Namespace(nproc_per_node="2", ft_node_health_check_cmd=None)
    args.ft_cycle_info_job_id = None
    args.ft_per_cycle_applog_prefix = None
    if code == 0:
        assert refused is None
        cluster_options(args, FaultToleranceConfig())
    else:
        assert refused is not None
        assert "--cpunodebind=0 --membind=0" in refused
        with pytest.raises(ValueError, match="NVRX_GPUS_PER_NUMA=1") as caught:
            cluster_options(args, FaultToleranceConfig())
        assert "Operation not permitted" in str(caught.value)
    calls = (tmp_path / "bin" / "calls").read_text().splitlines()
    assert calls[0] == "--cpunodebind=0 --membind=0 true"


def test_a_rank_runs_through_numactl_with_the_checked_options(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_numactl(tmp_path / "bin", 0)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    plan = NumaPlan({0: 1}, {1: frozenset({0})}, "numactl", strict=False)
    assert numactl_refusal(plan) is None
    done = _run_rank(plan, 0)
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "bin" / "calls").read_text().splitlines()
    assert calls[0] == "--cpunodebind=1 --localalloc true"  # the start-up check
    assert calls[1].startswith(f"--cpunodebind=1 --localalloc {sys.executable} -c ")
