"""Local checkpoints end to end: two ft_launchers ("nodes") x 2 ranks, DDP with AdamW.

Each node is an ft_launcher over a c10d rendezvous on 127.0.0.1 with its own base
directory (its "tmpfs"); every rank snapshots its state at every step
(``scripts/local_ckpt_ddp.py``, ``nvrx.ft.checkpointing.local.LocalCheckpoints``), one
replica of each on the other node. The per-step losses of an unfaulted run are the
reference (deterministic CPU ops, data drawn from the step and the rank):

- a rank SIGKILLed before step k: the job resumes at step k or k-1 (the newest snapshot
  every rank has) and every later step's loss equals the reference's; the journal says
  each node restored from its own memory; the same with ``--warm-spares`` (the new ranks
  are the spares, given the settings at the hand-over);
- a whole node lost (its launcher and ranks SIGKILLed, its directory deleted) and a new
  launcher started in its place: the new node's ranks fetch their snapshots from the
  peer's replicas, the journal says ``peer`` there and ``own`` on the survivor, and the
  losses again follow the reference; the same with a standby node
  (``--ft-standby-nodes``) taking the lost node's place.

Nothing is left behind: the ``launch`` fixture fails the test otherwise, and a job that
succeeds leaves nothing in the base directories.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Launch
from itest_harness import (
    HERE,
    LauncherRun,
    free_port,
    journal_events,
    wait_for,
    wait_for_store,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(400)]

SCRIPT = HERE / "scripts" / "local_ckpt_ddp.py"
STEPS = 16
FAULT_STEP = 8


@pytest.fixture
def bases(tmp_path: pathlib.Path) -> Iterator[list[pathlib.Path]]:
    """One base directory per node, on tmpfs where there is one (as in production)."""
    root = pathlib.Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else tmp_path
    made = [
        pathlib.Path(os.path.join(root, f"nvrx-itest-{os.getpid()}-{tmp_path.name}-{i}"))
        for i in range(3)
    ]
    for path in made:
        path.mkdir(mode=0o700)
    yield made
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _nodes(
    launch: Launch,
    tmp_path: pathlib.Path,
    bases: list[pathlib.Path],
    monkeypatch: pytest.MonkeyPatch,
    run_id: str,
    script_args: list[str],
    *,
    port: int,
    which: tuple[int, ...] = (0, 1),
    name: str = "node",
    extra: list[str] | None = None,
) -> list[LauncherRun]:
    """Start the launchers of nodes ``which`` (group rank = node index, via GROUP_RANK)."""
    runs = []
    for i in which:
        monkeypatch.setenv("GROUP_RANK", str(i))  # the launcher copies its environment now
        runs.append(
            launch(
                script_args,
                [
                    "--nnodes=2",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}",
                    f"--rdzv-id={run_id}",
                    "--rdzv-conf=join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=3",
                    "--max-restarts=2",
                    f"--ft-journal={tmp_path / f'{name}{i}.jsonl'}",
                    f"--local-ckpt-dir={bases[i]}",
                    "--local-ckpt-every-n-steps=1",
                    # A loaded 2-core machine: DDP's first use imports torch._dynamo before
                    # the first heartbeat (once over 30 s in CI, with other work running).
                    "--ft-initial-rank-heartbeat-timeout=120",
                    "--ft-rank-heartbeat-timeout=30",
                    *(extra or []),
                ],
                script=SCRIPT,
                name=f"{name}{i}",
                nproc=2,
                standalone=False,
            )
        )
        if i == which[0] and i == 0:
            wait_for_store(port)
    monkeypatch.delenv("GROUP_RANK")
    return runs


def _losses(journal: list[dict[str, Any]]) -> dict[tuple[int, int], dict[int, float]]:
    """(attempt, rank) -> {step: loss}."""
    out: dict[tuple[int, int], dict[int, float]] = {}
    for e in journal:
        if e["event"] == "step":
            out.setdefault((e["attempt"], e["rank"]), {})[e["step"]] = e["loss"]
    return out


def _node_dir(run: LauncherRun) -> pathlib.Path:
    found = re.search(r"local checkpoints of this node in (\S+)", run.log())
    assert found, f"{run.name} made no node directory; log:\n{run.log()[-3000:]}"
    return pathlib.Path(found.group(1))


def _restored(path: pathlib.Path) -> dict[int, str]:
    return {r["cycle"]: r["source"] for r in journal_events(path, "checkpoint_restored")}


@pytest.fixture(scope="module")
def reference() -> dict[int, dict[int, float]]:
    """Filled by the first test: rank -> {step: loss} of an unfaulted run."""
    return {}


def _reference_run(
    launch: Launch,
    tmp_path: pathlib.Path,
    out_dir: pathlib.Path,
    bases: list[pathlib.Path],
    monkeypatch: pytest.MonkeyPatch,
) -> dict[int, dict[int, float]]:
    runs = _nodes(
        launch,
        tmp_path,
        bases,
        monkeypatch,
        "ref",
        [f"--steps={STEPS}", "--step-time=0.05"],
        port=free_port(),
        name="ref",
    )
    for run in runs:
        run.expect_exit(0, 240)
    losses = _losses(runs[0].journal())
    assert {a for a, _ in losses} == {0}, "the reference run restarted"
    for path in bases[:2]:  # the job succeeded: nothing of it is left
        assert list(path.rglob("*")) == [path / f"nvrx-ckpt-{os.getuid()}"]
    for run in runs:
        journal = tmp_path / f"ref{runs.index(run)}.jsonl"
        assert _restored(journal) == {0: "none"}
    (out_dir / "journal.jsonl").unlink()
    return {rank: losses[(0, rank)] for rank in range(4)}


@pytest.mark.parametrize("spares", [[], ["--warm-spares"]], ids=["cold", "warm-spares"])
def test_a_killed_rank_resumes_at_its_step_with_the_same_losses(
    spares: list[str],
    launch: Launch,
    tmp_path: pathlib.Path,
    out_dir: pathlib.Path,
    bases: list[pathlib.Path],
    monkeypatch: pytest.MonkeyPatch,
    reference: dict[int, dict[int, float]],
) -> None:
    if not reference:
        reference.update(_reference_run(launch, tmp_path, out_dir, bases, monkeypatch))
    runs = _nodes(
        launch,
        tmp_path,
        bases,
        monkeypatch,
        "rankkill",
        [f"--steps={STEPS}", "--step-time=0.05", f"--fault=sigkill:3:{FAULT_STEP}:0"],
        port=free_port(),
        extra=spares,
    )
    for run in runs:
        run.expect_exit(0, 300)
    journal = runs[0].journal()
    resumed = {e["rank"]: e for e in journal if e["event"] == "restored" and e["attempt"] == 1}
    assert set(resumed) == {0, 1, 2, 3}, resumed
    steps = {e["step"] for e in resumed.values()}
    assert len(steps) == 1, f"ranks resumed at different steps: {resumed}"
    (step,) = steps
    assert step in (FAULT_STEP - 1, FAULT_STEP - 2), f"resumed after step {step}"
    assert {e["source"] for e in resumed.values()} == {"own"}
    losses = _losses(journal)
    for rank in range(4):
        assert losses[(1, rank)] == {s: reference[rank][s] for s in range(step + 1, STEPS + 1)}
        before = losses[(0, rank)]
        assert before == {s: reference[rank][s] for s in before}
    for i in (0, 1):
        assert _restored(tmp_path / f"node{i}.jsonl") == {0: "none", 1: "own"}
    (cost,) = journal_events(tmp_path / "node0.jsonl", "restart_cost")
    assert cost["restored_from"] == "own"
    assert cost["restored_iteration"] == step
    if spares:  # the restarted ranks were warm spares, which restored like the others
        started = [journal_events(tmp_path / f"node{i}.jsonl", "workers_started") for i in (0, 1)]
        assert [s[1]["warm_local_ranks"] for s in started] == [[0, 1], [0, 1]]


def test_a_lost_node_is_replaced_and_restores_from_its_peer(
    launch: Launch,
    tmp_path: pathlib.Path,
    out_dir: pathlib.Path,
    bases: list[pathlib.Path],
    monkeypatch: pytest.MonkeyPatch,
    reference: dict[int, dict[int, float]],
) -> None:
    if not reference:
        reference.update(_reference_run(launch, tmp_path, out_dir, bases, monkeypatch))
    port = free_port()
    args = [f"--steps={STEPS}", "--step-time=0.2"]
    node0, node1 = _nodes(launch, tmp_path, bases, monkeypatch, "nodekill", args, port=port)
    node1.wait_until(lambda: node1.steps_done(rank=2) >= 6, 240, "node 1 trained 6 steps")
    lost = _node_dir(node1)
    os.killpg(node1.pid, signal.SIGKILL)  # the launcher and everything in its session
    assert node1.wait(30) == -signal.SIGKILL
    shutil.rmtree(lost)  # its memory is gone with it
    (node1b,) = _nodes(
        launch, tmp_path, bases, monkeypatch, "nodekill", args, port=port, which=(1,), name="new"
    )
    node0.expect_exit(0, 300)
    node1b.expect_exit(0, 120)
    journal = node0.journal()
    final = max(e["attempt"] for e in journal if e["event"] == "start")
    resumed = {e["rank"]: e for e in journal if e["event"] == "restored" and e["attempt"] == final}
    assert {r: e["source"] for r, e in resumed.items()} == {
        0: "own",
        1: "own",
        2: "peer",
        3: "peer",
    }, resumed
    (step,) = {e["step"] for e in resumed.values()}
    assert step >= 5, f"resumed after step {step}: the snapshots were lost"
    losses = _losses(journal)
    for rank in range(4):
        assert losses[(final, rank)] == {s: reference[rank][s] for s in range(step + 1, STEPS + 1)}
    assert _restored(tmp_path / "node0.jsonl")[final] == "own"
    assert _restored(tmp_path / "new1.jsonl") == {final: "peer"}
    assert not lost.exists()


def test_a_standby_takes_a_lost_nodes_place_and_restores_from_its_peer(
    launch: Launch,
    tmp_path: pathlib.Path,
    out_dir: pathlib.Path,
    bases: list[pathlib.Path],
    monkeypatch: pytest.MonkeyPatch,
    reference: dict[int, dict[int, float]],
) -> None:
    if not reference:
        reference.update(_reference_run(launch, tmp_path, out_dir, bases, monkeypatch))
    port = free_port()
    standby = [
        "--nnodes=2:3",
        "--ft-standby-nodes",
        "--rdzv-conf=last_call_timeout=1,join_timeout=120,keep_alive_interval=1,"
        "keep_alive_max_attempt=3",
    ]
    args = [f"--steps={STEPS}", "--step-time=0.2"]
    runs = _nodes(
        launch, tmp_path, bases, monkeypatch, "sb", args, port=port, which=(0, 1, 2), name="sb",
        extra=standby,
    )  # fmt: skip
    journals = [tmp_path / f"sb{i}.jsonl" for i in range(3)]

    def active() -> list[int]:
        return [i for i in range(3) if journal_events(journals[i], "workers_started")]

    wait_for(lambda: len(active()) == 2, 240, "two nodes started ranks")
    assert 0 in active(), "the store's host (started first) should be an active node"
    (victim,) = [i for i in active() if i != 0]
    (spare,) = [i for i in range(3) if i not in active()]
    lost_ranks = set(journal_events(journals[victim], "workers_started")[0]["ranks"].values())
    first = min(lost_ranks)
    runs[0].wait_until(lambda: runs[0].steps_done(rank=first) >= 6, 240, "6 steps trained")
    lost = _node_dir(runs[victim])
    os.killpg(runs[victim].pid, signal.SIGKILL)
    assert runs[victim].wait(30) == -signal.SIGKILL
    shutil.rmtree(lost)
    runs[0].expect_exit(0, 300)
    runs[spare].expect_exit(0, 120)
    (started,) = journal_events(journals[spare], "workers_started")
    final = started["cycle"]
    assert set(started["ranks"].values()) == lost_ranks, "the standby took the lost node's ranks"
    journal = runs[0].journal()
    resumed = {e["rank"]: e for e in journal if e["event"] == "restored" and e["attempt"] == final}
    expected = {r: "peer" if r in lost_ranks else "own" for r in range(4)}
    assert {r: e["source"] for r, e in resumed.items()} == expected, resumed
    (step,) = {e["step"] for e in resumed.values()}
    assert step >= 5, f"resumed after step {step}: the snapshots were lost"
    losses = _losses(journal)
    for rank in range(4):
        assert losses[(final, rank)] == {s: reference[rank][s] for s in range(step + 1, STEPS + 1)}
    assert _restored(journals[0])[final] == "own"
    assert _restored(journals[spare]) == {final: "peer"}
