"""Segments on one machine: 4 ft_launchers over a c10d rendezvous on 127.0.0.1.

``--nnodes=2:4 --ft-standby-nodes --ft-segment=2``, segments named through
NVRX_SEGMENT_ID (A: nodes 0 and 1, B: nodes 2 and 3), one gloo DDP rank per node that
checkpoints. The first round runs on one whole segment; the other waits outside every
round. One node of the active segment is SIGKILLed: its segment-mate leaves the job
(exit 3, its journal names the segment and why), the standby segment's two nodes take
both places at the restart, and training goes on from the checkpoint with the same
world size, every step once. Node 0 hosts the rendezvous store: when its segment
breaks it stays, running nothing, until the job ends. Nothing is left behind (the
``launch`` fixture fails the test otherwise).
"""

from __future__ import annotations

import os
import pathlib
import signal

import pytest
from conftest import Launch
from itest_harness import (
    DDP_STEPS,
    LauncherRun,
    assert_every_step_once,
    free_port,
    journal_events,
    wait_for,
    wait_for_store,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

STEPS = 24
SEGMENTS = "AABB"


def test_a_lost_node_takes_its_segment_out_and_the_standby_segment_takes_over(
    launch: Launch,
    tmp_path: pathlib.Path,
    out_dir: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    rdzv = [
        "--nnodes=2:4",
        "--ft-standby-nodes",
        "--ft-segment=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=segments",
        # last_call: the gate's settle window; a dead node leaves torch's round after
        # 3 missed 1 s keep-alives (torch: 15 s).
        "--rdzv-conf=last_call_timeout=2,join_timeout=120,keep_alive_interval=1,"
        "keep_alive_max_attempt=3",
        "--max-restarts=1",
    ]
    journals = [tmp_path / f"j{i}.jsonl" for i in range(4)]
    runs: list[LauncherRun] = []
    for i in range(4):
        monkeypatch.setenv("NVRX_SEGMENT_ID", SEGMENTS[i])
        monkeypatch.setenv("GROUP_RANK", str(i))  # the scheduler's order
        runs.append(
            launch(
                [f"--steps={STEPS}", "--step-time=0.2", "--checkpoint-every=2"],
                [*rdzv, f"--ft-journal={journals[i]}"],
                script=DDP_STEPS,
                name=f"node{i}",
                nproc=1,
                standalone=False,
            )
        )
        if i == 0:
            wait_for_store(port)

    def active() -> list[int]:
        return [i for i in range(4) if journal_events(journals[i], "workers_started")]

    wait_for(lambda: len(active()) == 2, 120, "two nodes started ranks")
    first = active()
    # One whole segment runs; the other's nodes run nothing and are in no round.
    assert first in ([0, 1], [2, 3]), f"the first round is not one whole segment: {first}"
    standbys = [i for i in range(4) if i not in first]
    # Kill the active segment's node that does not host the store (node 0 hosts it).
    victim = first[1]
    survivor = first[0]
    killed_node = journal_events(journals[victim], "workers_started")[0]["node"]
    ranks_before = {
        i: journal_events(journals[i], "workers_started")[0]["group_rank"] for i in first
    }
    assert sorted(ranks_before.values()) == [0, 1]
    wait_for(
        lambda: runs[0].at_a_checkpoint_step(rank=ranks_before[victim], at_least=4, every=2),
        120,
        "training ran some steps",
    )
    assert active() == first, "a standby segment's node started ranks"
    os.kill(runs[victim].pid, signal.SIGKILL)
    assert runs[victim].wait(30) == -signal.SIGKILL

    for i in standbys:
        runs[i].expect_exit(0, 180)
    runs[survivor].expect_exit(3, 60)

    # The survivor left with its segment, saying which and why, and ran no more ranks.
    (finished,) = journal_events(journals[survivor], "finished")
    segment = f"{SEGMENTS[survivor]}#0"
    assert finished["exit_code"] == 3
    assert f"segment {segment} broke" in finished["reason"]
    assert "1 of its 2 nodes did not come back" in finished["reason"]
    (left,) = journal_events(journals[survivor], "segment_left")
    assert left["segment"] == segment
    assert left["nodes"] == [finished["node"]]
    assert left["reason"] in finished["reason"]
    assert len(journal_events(journals[survivor], "workers_started")) == 1
    # Both standbys started in cycle 1, in the two places of the broken segment.
    started = [journal_events(journals[i], "workers_started") for i in standbys]
    assert [len(s) for s in started] == [1, 1]
    assert [s[0]["cycle"] for s in started] == [1, 1]
    assert sorted(s[0]["group_rank"] for s in started) == [0, 1]
    assert [s[0]["group_rank"] for s in started] == [0, 1]  # scheduler order in the segment
    # Each node of the new segment journals whose places the segment took.
    nodes_before = {i: journal_events(journals[i], "workers_started")[0]["node"] for i in first}
    assert nodes_before[victim] == killed_node
    by_rank = {s[0]["group_rank"]: s[0]["node"] for s in started}
    for i in standbys:
        replaced = journal_events(journals[i], "node_replaced")
        assert {r["group_rank"]: r["replaced_node"] for r in replaced} == {
            ranks_before[j]: nodes_before[j] for j in first
        }
        assert {r["group_rank"]: r["by_node"] for r in replaced} == by_rank
        assert [r["cycle"] for r in replaced] == [1, 1]
    # Same world size after the replacement, and every step ran once.
    journal = runs[standbys[0]].journal()
    worlds = {e["attempt"]: e["world"] for e in journal if e["event"] == "start"}
    assert worlds == {0: 2, 1: 2}
    assert_every_step_once(journal, STEPS, ranks=(0, 1))


def test_a_job_that_ends_with_a_standby_segment_waiting_exits_0_everywhere(
    launch: Launch,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No failure: segment A runs the job to its end while B waits. B's nodes never
    joined one of torch's rounds; they end as standbys do (exit 0), not with exit 5."""
    port = free_port()
    rdzv = [
        "--nnodes=2:4",
        "--ft-segment=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=segments-end",
        "--rdzv-conf=last_call_timeout=2,join_timeout=120,keep_alive_interval=1,"
        "keep_alive_max_attempt=3",
        "--max-restarts=0",
    ]
    journals = [tmp_path / f"j{i}.jsonl" for i in range(4)]
    runs: list[LauncherRun] = []
    for i in range(4):
        monkeypatch.setenv("NVRX_SEGMENT_ID", SEGMENTS[i])
        monkeypatch.setenv("GROUP_RANK", str(i))
        runs.append(
            launch(
                ["--steps=6", "--step-time=0.2", "--checkpoint-every=100"],
                [*rdzv, f"--ft-journal={journals[i]}"],
                script=DDP_STEPS,
                name=f"end{i}",
                nproc=1,
                standalone=False,
            )
        )
        if i == 0:
            wait_for_store(port)
    for run in runs:
        run.expect_exit(0, 180)
    started = [i for i in range(4) if journal_events(journals[i], "workers_started")]
    assert started in ([0, 1], [2, 3]), started
    for i in range(4):
        if i in started:
            continue
        (finished,) = journal_events(journals[i], "finished")
        assert finished["exit_code"] == 0
        assert finished["reason"] == "the job ended while this node waited as a standby"
