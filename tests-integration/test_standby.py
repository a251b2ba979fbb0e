"""Standby nodes on one machine: 3 ft_launchers over a c10d rendezvous on 127.0.0.1.

With ``--nnodes=2:3 --ft-standby-nodes`` two nodes run the job (real gloo DDP ranks that
checkpoint) and the third waits with no ranks. One active node is SIGKILLed: its ranks
die with it, the survivor's ranks fail, and at the restart the standby takes the killed
node's place and group rank; training resumes from the checkpoint with the same world
size and every step runs once. The survivor journals ``node_replaced``. The same with
``--warm-spares`` (process-level spares on the active nodes at the same time). Nothing is left
behind (the ``launch`` fixture fails the test otherwise).

A node whose health check fails at the restart leaves (exit 3) and the standby takes
its place the same way.
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
    read_jsonl,
    wait_for,
    wait_for_store,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

STEPS = 30


def _rdzv(port: int) -> list[str]:
    return [
        "--nnodes=2:3",
        "--ft-standby-nodes",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=standby",
        # A dead node leaves the rendezvous after 3 missed 1 s keep-alives (torch: 15 s).
        "--rdzv-conf=last_call_timeout=1,join_timeout=120,keep_alive_interval=1,"
        "keep_alive_max_attempt=3",
        "--max-restarts=1",
    ]


def _rendezvous_nodes(port: int, run_id: str) -> int:
    """How many nodes torch's rendezvous state lists (read through torch, joining nothing)."""
    import datetime

    from torch._C._distributed_c10d import TCPStore
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )

    from nvrx.launcher._torch_compat import rendezvous_nodes

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    handler = dynamic_rendezvous.DynamicRendezvousHandler.from_backend(
        run_id, store, C10dRendezvousBackend(store, run_id), min_nodes=1, max_nodes=1
    )
    found = rendezvous_nodes(handler)
    return -1 if found is None else found[0]


@pytest.mark.parametrize("spares", [[], ["--warm-spares"]], ids=["cold", "warm-spares"])
def test_a_standby_replaces_a_killed_node_and_training_goes_on(
    launch: Launch, tmp_path: pathlib.Path, out_dir: pathlib.Path, spares: list[str]
) -> None:
    port = free_port()
    rdzv = [*_rdzv(port), *spares]
    runs: list[LauncherRun] = []
    for i in range(3):
        runs.append(
            launch(
                [f"--steps={STEPS}", "--step-time=0.2", "--checkpoint-every=2"],
                [*rdzv, f"--ft-journal={tmp_path / f'j{i}.jsonl'}"],
                script=DDP_STEPS,
                name=f"node{i}",
                nproc=1,
                standalone=False,
            )
        )
        if i == 0:
            wait_for_store(port)
    journals = [tmp_path / f"j{i}.jsonl" for i in range(3)]

    def active() -> list[int]:
        return [i for i in range(3) if journal_events(journals[i], "workers_started")]

    wait_for(lambda: len(active()) == 2, 120, "two nodes started ranks")
    assert 0 in active(), "the store's host (started first) should be an active node"
    (victim,) = [i for i in active() if i != 0]
    (standby,) = [i for i in range(3) if i not in active()]
    killed_rank = journal_events(journals[victim], "workers_started")[0]["group_rank"]
    killed_node = read_jsonl(journals[victim])[0]["node"]
    # With spares, later: the survivor's spare should have imported torch by the restart.
    before_kill = 10 if spares else 4
    wait_for(
        lambda: runs[0].at_a_checkpoint_step(rank=killed_rank, at_least=before_kill, every=2),
        120,
        "training ran some steps",
    )
    assert active() == sorted([0, victim]), "the standby started ranks"
    assert journal_events(journals[0], "decision") == [], "the standby must not restart the job"
    os.kill(runs[victim].pid, signal.SIGKILL)
    assert runs[victim].wait(30) == -signal.SIGKILL

    runs[0].expect_exit(0, 180)
    runs[standby].expect_exit(0, 60)

    # The standby ran nothing in cycle 0, then took the killed node's group rank.
    (started,) = journal_events(journals[standby], "workers_started")
    assert started["cycle"] == 1
    assert started["group_rank"] == killed_rank
    standby_node = started["node"]
    # The survivor kept its group rank and journalled the replacement.
    ranks0 = [e["group_rank"] for e in journal_events(journals[0], "workers_started")]
    assert ranks0 == [1 - killed_rank] * 2
    (replaced,) = journal_events(journals[0], "node_replaced")
    assert replaced["cycle"] == 1
    assert replaced["group_rank"] == killed_rank
    assert replaced["replaced_node"] == killed_node
    assert replaced["by_node"] == standby_node
    (decision,) = journal_events(journals[0], "decision")
    # Two true facts race: the survivor's rank fails on the dead peer ("failure"), and the
    # killed node's keep-alive lapses so the standby counts as waiting ("nodes_waiting");
    # under load either is seen first. Both restart once, onto the standby.
    assert decision["trigger"] in ("failure", "nodes_waiting")
    # Same world size after the replacement, and every step ran once.
    journal = runs[0].journal()
    worlds = {e["attempt"]: e["world"] for e in journal if e["event"] == "start"}
    assert worlds == {0: 2, 1: 2}
    assert_every_step_once(journal, STEPS, ranks=(0, 1))
    if spares:  # the survivor's restarted rank came from its warm spare
        assert journal_events(journals[0], "workers_started")[1]["warm_local_ranks"] == [0]


def test_a_standby_replaces_a_node_unhealthy_at_the_restart(
    launch: Launch, tmp_path: pathlib.Path, out_dir: pathlib.Path
) -> None:
    port = free_port()
    flags = [tmp_path / f"unhealthy-{i}" for i in range(3)]
    runs: list[LauncherRun] = []
    for i in range(3):
        # Nodes 1 and 2 check a flag file before each rendezvous; the test raises the
        # active one's flag during cycle 0. Node 0 hosts the store and stays.
        check = [f"--ft-node-health-check-cmd=test ! -e {flags[i]}"] if i else []
        runs.append(
            launch(
                [f"--steps={STEPS}", "--step-time=0.2", "--fault=exit:0:12:0"],
                [*_rdzv(port), *check, f"--ft-journal={tmp_path / f'j{i}.jsonl'}"],
                script=DDP_STEPS,
                name=f"node{i}",
                nproc=1,
                standalone=False,
            )
        )
        if i == 0:
            wait_for_store(port)
    journals = [tmp_path / f"j{i}.jsonl" for i in range(3)]

    def active() -> list[int]:
        return [i for i in range(3) if journal_events(journals[i], "workers_started")]

    wait_for(lambda: len(active()) == 2, 120, "two nodes started ranks")
    assert 0 in active(), "the store's host (started first) should be an active node"
    (sick,) = [i for i in active() if i != 0]
    (standby,) = [i for i in range(3) if i not in active()]
    flags[sick].write_text("")
    sick_rank = journal_events(journals[sick], "workers_started")[0]["group_rank"]
    sick_node = read_jsonl(journals[sick])[0]["node"]

    runs[sick].expect_exit(3, 120)
    runs[0].expect_exit(0, 180)
    runs[standby].expect_exit(0, 60)
    (unhealthy,) = journal_events(journals[sick], "node_unhealthy")
    assert unhealthy["cycle"] == 1
    assert unhealthy["failures"][0]["check"] == "command"
    (started,) = journal_events(journals[standby], "workers_started")
    assert (started["cycle"], started["group_rank"]) == (1, sick_rank)
    (replaced,) = journal_events(journals[0], "node_replaced")
    assert (replaced["replaced_node"], replaced["by_node"]) == (sick_node, started["node"])
    journal = runs[0].journal()
    worlds = {e["attempt"]: e["world"] for e in journal if e["event"] == "start"}
    assert worlds == {0: 2, 1: 2}
    assert_every_step_once(journal, STEPS, ranks=(0, 1))


def test_a_launcher_beyond_max_is_refused(
    launch: Launch, tmp_path: pathlib.Path, out_dir: pathlib.Path
) -> None:
    """Torch would keep it in its redundancy list, unseen, until the job ends."""
    port = free_port()
    rdzv = [
        "--nnodes=1:2",
        "--ft-standby-nodes",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=beyond-max",
        "--rdzv-conf=join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=3",
    ]
    journals = [tmp_path / f"j{i}.jsonl" for i in range(3)]
    runs: list[LauncherRun] = []
    for i in range(2):
        runs.append(
            launch(
                # 30 s: the extra launcher starts (torch's import, 3-8 s under load) and
                # waits a keep-alive window (4 s) before it is refused, all while it runs
                ["--steps=120", "--step-time=0.25", "--checkpoint-every=10"],
                [*rdzv, f"--ft-journal={journals[i]}"],
                script=DDP_STEPS,
                name=f"node{i}",
                nproc=1,
                standalone=False,
            )
        )
        if i == 0:
            wait_for_store(port)
    wait_for(lambda: journal_events(journals[0], "workers_started") != [], 120, "node 0 runs")
    wait_for(lambda: _rendezvous_nodes(port, "beyond-max") == 2, 60, "node 1 waits as standby")
    extra = launch(
        ["--steps=60"],
        [*rdzv, f"--ft-journal={journals[2]}"],
        script=DDP_STEPS,
        name="node2",
        nproc=1,
        standalone=False,
    )
    extra.expect_exit(2, 90)
    (finished,) = journal_events(journals[2], "finished")
    assert "2 nodes are in the job already" in finished["reason"]
    assert "this launcher is one too many" in finished["reason"]
    assert journal_events(journals[2], "workers_started") == []
    runs[0].expect_exit(0, 120)
    runs[1].expect_exit(0, 60)  # the standby, never needed
    assert journal_events(journals[1], "workers_started") == []
