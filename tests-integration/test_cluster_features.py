"""Issue 17 on one machine: several ft_launchers as nodes over a c10d rendezvous on 127.0.0.1.

- group ranks follow SLURM_PROCID, given in reverse of the launchers' start order;
- a node whose health check fails never joins, exits 3 with its reason journalled, and
  the other nodes run the job without it;
- the cycle-info files say what the journal says, and ranks read theirs;
- per-cycle application logs keep every rank's last lines when the launcher is SIGTERMed.

Nothing is left behind (the ``launch`` fixture fails the test otherwise).
"""

from __future__ import annotations

import collections
import os
import pathlib
import re
import signal
import time

import pytest
from conftest import Launch
from itest_harness import HERE, free_port, journal_events, read_jsonl, wait_for_store

from nvrx.ft import read_cycle_info

CYCLE_RANK = HERE / "scripts" / "cycle_rank.py"
AFFINITY_RANK = HERE / "scripts" / "affinity_rank.py"

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def _rdzv(port: int, nnodes: str, run_id: str) -> list[str]:
    return [
        f"--nnodes={nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={run_id}",
        "--rdzv-conf=last_call_timeout=1,join_timeout=120",
        "--max-restarts=0",
    ]


def test_group_ranks_follow_slurm_procid(
    launch: Launch, tmp_path: pathlib.Path, out_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    procids = [2, 0, 1]
    runs = []
    for i, procid in enumerate(procids):
        monkeypatch.setenv("SLURM_PROCID", str(procid))
        runs.append(
            launch(
                ["--seconds", "0.5"],
                [*_rdzv(port, "3", "aligned"), f"--ft-journal={tmp_path / f'j{i}.jsonl'}"],
                script=CYCLE_RANK,
                name=f"node{i}",
                nproc=1,
                standalone=False,
            )
        )
        if i == 0:
            wait_for_store(port)
        time.sleep(0.2)
    monkeypatch.delenv("SLURM_PROCID")
    for run in runs:
        run.expect_exit(0, 180)
    for i, procid in enumerate(procids):
        (started,) = journal_events(tmp_path / f"j{i}.jsonl", "workers_started")
        assert started["group_rank"] == procid
        assert started["ranks"] == {"0": procid}
    said = sorted((r["group_rank"], r["rank"]) for r in read_jsonl(out_dir / "ranks.jsonl"))
    assert said == [(0, 0), (1, 1), (2, 2)]
    # The rendezvous numbered the nodes otherwise (each says so when they differ), so
    # the group ranks above came from the alignment, not from torch's order.
    torch_order = []
    for i, procid in enumerate(procids):
        told = re.findall(
            rf"group rank {procid} \(from SLURM_PROCID; the rendezvous numbered this node "
            r"(\d+)\)",
            runs[i].log(),
        )
        torch_order.append(int(told[0]) if told else procid)
    assert sorted(torch_order) == [0, 1, 2]
    assert torch_order != procids, "the rendezvous order matched SLURM_PROCID: nothing aligned"


def test_an_unhealthy_node_never_joins_and_the_job_goes_on(
    launch: Launch, tmp_path: pathlib.Path, out_dir: pathlib.Path
) -> None:
    port = free_port()
    rdzv = _rdzv(port, "2:3", "health")
    healthy = []
    for i in range(2):
        healthy.append(
            launch(
                ["--seconds", "0.5"],
                [*rdzv, f"--ft-journal={tmp_path / f'ok{i}.jsonl'}"],
                script=CYCLE_RANK,
                name=f"ok{i}",
                nproc=1,
                standalone=False,
            )
        )
        if i == 0:
            wait_for_store(port)
    sick = launch(
        ["--seconds", "0.5"],
        [
            *rdzv,
            f"--ft-journal={tmp_path / 'sick.jsonl'}",
            f"--ft-storage-healthcheck-path={tmp_path / 'scratch-not-mounted'}",
        ],
        script=CYCLE_RANK,
        name="sick",
        nproc=1,
        standalone=False,
    )
    sick.expect_exit(3, 120)
    for run in healthy:
        run.expect_exit(0, 180)
    (unhealthy,) = journal_events(tmp_path / "sick.jsonl", "node_unhealthy")
    assert unhealthy["failures"] == [
        {"check": "storage", "reason": f"{tmp_path / 'scratch-not-mounted'} does not exist"}
    ]
    assert journal_events(tmp_path / "sick.jsonl", "workers_started") == []
    (finished,) = journal_events(tmp_path / "sick.jsonl", "finished")
    assert finished["exit_code"] == 3
    assert "scratch-not-mounted does not exist" in finished["reason"]
    for i in range(2):
        (started,) = journal_events(tmp_path / f"ok{i}.jsonl", "workers_started")
        assert started["group_world_size"] == 2
    assert len(read_jsonl(out_dir / "ranks.jsonl")) == 2


def test_cycle_info_matches_the_journal_and_logs_survive_sigterm(
    launch: Launch, tmp_path: pathlib.Path, out_dir: pathlib.Path
) -> None:
    cycles = tmp_path / "cycles"
    cycles.mkdir()
    prefix = tmp_path / "applogs" / "job.log"
    prefix.parent.mkdir()
    journal = tmp_path / "journal.jsonl"
    run = launch(
        ["--seconds", "120", "--fail-rank", "1", "--fail-cycle", "0", "--fail-after", "2"],
        [
            "--max-restarts=2",
            f"--ft-journal={journal}",
            f"--ft-cycle-info-dir={cycles}",
            "--ft-cycle-info-job-id=job42",
            f"--ft-per-cycle-applog-prefix={prefix}",
        ],
        script=CYCLE_RANK,
        nproc=2,
    )
    run.wait_until(
        lambda: sum(r["cycle"] == 1 for r in read_jsonl(out_dir / "ranks.jsonl")) == 2,
        120,
        "both ranks of cycle 1",
    )
    time.sleep(0.5)
    run.proc.send_signal(signal.SIGTERM)
    run.expect_exit(128 + signal.SIGTERM, 60)

    # The journal's account of the two cycles.
    (decision,) = journal_events(journal, "decision")
    assert decision["action"] == "restart"
    (failed,) = journal_events(journal, "rank_failed")
    assert (failed["rank"], failed["exit_code"]) == (1, 3)
    starts = journal_events(journal, "cycle_start")
    assert [s["cycle"] for s in starts] == [0, 1]

    # The cycle-info files say the same.
    first = read_cycle_info(cycles / "cycle_info.job42.0.0")
    second = read_cycle_info(cycles / "cycle_info.job42.current")
    assert first is not None
    assert second is not None
    assert (first.cycle, first.cause, first.ranks) == (0, None, (0, 1))
    assert first.exit_codes == {1: 3}
    (stopped,) = journal_events(journal, "workers_stopped")
    assert first.ended_at == stopped["workers_stopped"]
    assert first.started_at == starts[0]["t"]
    assert (second.cycle, second.cause) == (1, decision["reason"])
    assert second.ended
    (node,) = second.nodes
    assert node.group_rank == 0
    assert node.node_id == starts[1]["node"]
    assert second.log_file == str(prefix.parent / "job_cycle1_rank0_stdout.log")

    # Each rank read its own cycle's file through NVRX_CURRENT_CYCLE_INFO: the path of
    # that cycle's file (the .current link is for tools outside the job).
    said = read_jsonl(out_dir / "ranks.jsonl")
    assert sorted((r["cycle"], r["cycle_info_env"]) for r in said) == [
        (c, str(cycles / f"cycle_info.job42.0.{c}")) for c in (0, 0, 1, 1)
    ]
    assert sorted((r["cycle"], r["cycle_info_cycle"]) for r in said) == [
        (0, 0),
        (0, 0),
        (1, 1),
        (1, 1),
    ]

    # One set of log files per cycle; the ranks' last lines survived the SIGTERM.
    logs = prefix.parent
    assert "fails on purpose in cycle 0" in (logs / "job_cycle0_rank1_stderr.log").read_text()
    for rank in (0, 1):
        out = (logs / f"job_cycle1_rank{rank}_stdout.log").read_text()
        err = (logs / f"job_cycle1_rank{rank}_stderr.log").read_text()
        assert f"rank {rank} got SIGTERM: last stdout line" in out
        assert f"rank {rank} got SIGTERM: last stderr line" in err
    assert sorted(p.name for p in logs.iterdir()) == sorted(
        f"job_cycle{c}_rank{r}_{s}.log"
        for c in (0, 1)
        for r in (0, 1)
        for s in ("stdout", "stderr")
    )


def _first_full_cycle(ranks_file: pathlib.Path, world_size: int) -> int | None:
    """The first cycle that ``world_size`` ranks have said they ran in, if any yet."""
    counts = collections.Counter(r["cycle"] for r in read_jsonl(ranks_file))
    full = [cycle for cycle, n in counts.items() if n == world_size]
    return min(full) if full else None


def test_a_node_that_turns_unhealthy_leaves_at_the_restart_and_the_others_go_on(
    launch: Launch, tmp_path: pathlib.Path, out_dir: pathlib.Path
) -> None:
    port = free_port()
    rdzv = [*_rdzv(port, "2:3", "restart-health"), "--max-restarts=1"]
    flag = tmp_path / "nic-flapped"
    nodes = []
    for i in range(3):
        extra = [f"--ft-node-health-check-cmd=test ! -e {flag}"] if i == 2 else []
        nodes.append(
            launch(
                # Rank 0 fails in the cycle with all 3 nodes: under load node 2 can start
                # after the first 2 formed cycle 0, and its join then costs a restart.
                [
                    "--seconds",
                    "5",
                    "--fail-rank",
                    "0",
                    "--fail-world-size",
                    "3",
                    "--fail-after",
                    "4",
                ],
                [*rdzv, f"--ft-journal={tmp_path / f'n{i}.jsonl'}", *extra],
                script=CYCLE_RANK,
                name=f"n{i}",
                nproc=1,
                standalone=False,
            )
        )
        if i == 0:
            wait_for_store(port)
    ranks_file = out_dir / "ranks.jsonl"
    nodes[0].wait_until(
        lambda: _first_full_cycle(ranks_file, 3) is not None, 120, "a cycle with all 3 ranks"
    )
    full = _first_full_cycle(ranks_file, 3)
    assert full is not None
    flag.touch()  # node 2's check fails from now on: at the restart rank 0 causes
    nodes[2].expect_exit(3, 120)
    for run in nodes[:2]:
        run.expect_exit(0, 180)
    (unhealthy,) = journal_events(tmp_path / "n2.jsonl", "node_unhealthy")
    assert unhealthy["cycle"] == full + 1
    (failure,) = unhealthy["failures"]
    assert failure["check"] == "command"
    assert "exited 1" in failure["reason"]
    for i in range(2):
        starts = journal_events(tmp_path / f"n{i}.jsonl", "workers_started")
        assert [s["group_world_size"] for s in starts][-2:] == [3, 2]
    after = [r for r in read_jsonl(ranks_file) if r["cycle"] == full + 1]
    assert sorted(r["rank"] for r in after) == [0, 1]


def _without_numactl(path: str) -> str:
    """PATH less any directory holding numactl (the test binds through sched_setaffinity)."""
    return os.pathsep.join(
        d for d in path.split(os.pathsep) if d and not os.path.exists(os.path.join(d, "numactl"))
    )


def test_numa_binding_and_the_gpu_memory_wait_on_a_restart(
    launch: Launch, tmp_path: pathlib.Path, out_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs to tell two NUMA nodes apart")
    # Two fake NUMA nodes over this machine's CPUs (a third node outside them); GPU r
    # shares node r: local rank 0 on node 0's CPU, local rank 1 on node 1's.
    nodes = tmp_path / "numa"
    cpulists = {0: str(allowed[0]), 1: ",".join(map(str, allowed[1:]))}
    for node, cpulist in cpulists.items():
        (nodes / f"node{node}").mkdir(parents=True)
        (nodes / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv("NVRX_GPUS_PER_NUMA", "1")
    monkeypatch.setenv("_NVRX_NUMA_NODE_ROOT", str(nodes))
    monkeypatch.setenv("PATH", _without_numactl(os.environ.get("PATH", "")))
    run = launch(
        ["--seconds", "0.5", "--fail-rank", "0", "--fail-cycle", "0", "--fail-after", "1"],
        ["--max-restarts=1", f"--ft-journal={journal}"],
        script=AFFINITY_RANK,
        nproc=2,
    )
    monkeypatch.delenv("NVRX_GPUS_PER_NUMA")
    monkeypatch.delenv("_NVRX_NUMA_NODE_ROOT")
    run.expect_exit(0, 120)
    bindings = journal_events(journal, "numa_binding")
    assert [b["cycle"] for b in bindings] == [0, 1]
    for binding in bindings:
        assert (binding["method"], binding["nodes"]) == ("sched_setaffinity", {"0": 0, "1": 1})
    # What each rank of each cycle could run on, read by the rank itself.
    seen = sorted(
        (r["cycle"], r["local_rank"], tuple(r["cpus"]))
        for r in read_jsonl(out_dir / "affinity.jsonl")
    )
    assert seen == [
        (0, 0, (allowed[0],)),
        (0, 1, tuple(allowed[1:])),
        (1, 0, (allowed[0],)),
        (1, 1, tuple(allowed[1:])),
    ]
    from nvrx.launcher._gpu_memory import nvml_reader

    if nvml_reader()[0] is None:  # no NVML (a CPU machine): the memory wait says so once
        assert run.log().count("GPU memory reclaim wait skipped") == 1
        assert journal_events(journal, "gpu_memory_reclaim") == []


def test_numa_on_one_node_binds_nothing_and_says_so_once(
    launch: Launch, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = tmp_path / "numa"
    (nodes / "node0").mkdir(parents=True)
    (nodes / "node0" / "cpulist").write_text(f"{min(os.sched_getaffinity(0))}\n")
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv("NVRX_GPUS_PER_NUMA", "1")
    monkeypatch.setenv("_NVRX_NUMA_NODE_ROOT", str(nodes))
    run = launch(
        ["--seconds", "0.5", "--fail-rank", "0", "--fail-cycle", "0", "--fail-after", "1"],
        ["--max-restarts=1", f"--ft-journal={journal}"],
        script=CYCLE_RANK,
        nproc=2,
    )
    monkeypatch.delenv("NVRX_GPUS_PER_NUMA")
    monkeypatch.delenv("_NVRX_NUMA_NODE_ROOT")
    run.expect_exit(0, 120)
    bindings = journal_events(journal, "numa_binding")
    assert [(b["cycle"], b["method"]) for b in bindings] == [(0, "none"), (1, "none")]
    assert bindings[0]["nodes"] == {"0": None, "1": None}
    assert run.log().count("NUMA binding: nothing to bind") == 1
