"""NUMA binding: the mapping over a fake /sys/devices/system/node, and a real bound rank."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from nvrx.launcher._numa import (
    NumaPlan,
    numa_plan,
    parse_cpulist,
    parse_gpus_per_numa,
    read_numa_nodes,
    wrap_command,
)


def _fake_nodes(root: pathlib.Path, cpulists: dict[int, str]) -> pathlib.Path:
    for node, cpulist in cpulists.items():
        (root / f"node{node}").mkdir(parents=True)
        (root / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    (root / "possible").write_text("0-1\n")  # not a node directory
    return root


def test_cpulist_format() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("") == frozenset()


def test_two_sockets_four_gpus_each(tmp_path: pathlib.Path) -> None:
    nodes = read_numa_nodes(_fake_nodes(tmp_path, {0: "0-31,64-95", 1: "32-63,96-127"}))
    assert sorted(nodes) == [0, 1]
    assert len(nodes[1]) == 64
    plan = numa_plan(8, 4, nodes, strict=True, numactl=True)
    assert plan.nodes == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    assert plan.method == "numactl"
    assert plan.binds
    assert plan.reason is None


def test_one_node_machine_has_nothing_to_bind(tmp_path: pathlib.Path) -> None:
    plan = numa_plan(2, 1, read_numa_nodes(_fake_nodes(tmp_path, {0: "0-1"})))
    assert not plan.binds
    assert plan.method == "none"
    assert plan.reason == "this machine has 1 NUMA node(s) with CPUs"
    assert wrap_command(plan, ["python", "train.py"]) == ["python", "train.py"]


def test_ranks_beyond_the_machine_nodes_stay_unbound(tmp_path: pathlib.Path) -> None:
    nodes = read_numa_nodes(_fake_nodes(tmp_path, {0: "0-3", 1: "4-7", 2: ""}))
    plan = numa_plan(3, 1, nodes)  # node2 has no CPUs: not a target
    assert plan.nodes == {0: 0, 1: 1, 2: None}
    assert plan.reason is not None
    assert "[2]" in plan.reason


@pytest.mark.parametrize("text", ["0", "-1", "two", "", "4096"])
def test_the_variable_is_validated(text: str) -> None:
    with pytest.raises(ValueError, match="NVRX_GPUS_PER_NUMA"):
        parse_gpus_per_numa(text)
    assert parse_gpus_per_numa(" 4 ") == 4


def test_a_rank_runs_on_its_node_cpus_through_the_exec_wrapper() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to tell a binding from none")
    # Two fake nodes over this machine's CPUs; local rank 1 goes to the second.
    nodes = {0: frozenset(allowed[:1]), 1: frozenset(allowed[1:])}
    plan = numa_plan(2, 1, nodes, numactl=False)
    command = wrap_command(
        plan, [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    )
    for local_rank, cpus in ((0, allowed[:1]), (1, allowed[1:])):
        argv = [word.replace("${local_rank}", str(local_rank)) for word in command]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        assert out.stdout.strip() == str(cpus)


def test_plan_encoding_leaves_unbound_ranks_out() -> None:
    plan = NumaPlan({0: 1, 1: None}, {1: frozenset({4, 5})}, "numactl", False)
    assert plan.encode() == "numactl;0;0=1:4,5"
