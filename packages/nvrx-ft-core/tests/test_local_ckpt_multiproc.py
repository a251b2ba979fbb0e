"""Local checkpoints across real processes: "nodes" are node directories + GROUP_RANK.

Each job runs W rank processes (gloo on 127.0.0.1); ranks of one node share its node
directory and GROUP_RANK. Every process is killed by PID at the end, even on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
from typing import Any

import pytest

from nvrx.ft.checkpointing.local import _format

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

WORKER = pathlib.Path(__file__).with_name("local_ckpt_worker.py")
JOB_TIMEOUT_S = 150.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def base(node_dir: pathlib.Path) -> pathlib.Path:
    """The job's tmpfs directory (conftest's ``node_dir``); each node's is below it."""
    return node_dir


def run_job(
    base: pathlib.Path,
    nodes: list[pathlib.Path],
    per_node: int,
    tag: str,
    allow_fail: bool = False,
    node_spec: dict[int, dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[int, dict[str, Any]]:
    """Run one job: len(nodes) x per_node ranks; return each rank's result."""
    world = len(nodes) * per_node
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    outs: dict[int, pathlib.Path] = {}
    try:
        for node, node_dir in enumerate(nodes):
            node_dir.mkdir(parents=True, exist_ok=True)
            for local in range(per_node):
                rank = node * per_node + local
                out = base / f"{tag}-rank{rank}.json"
                outs[rank] = out
                env = {
                    **os.environ,
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world),
                    "LOCAL_RANK": str(local),
                    "GROUP_RANK": str(node),
                }
                extra = (node_spec or {}).get(node, {})
                args = json.dumps({**spec, **extra, "node_dir": str(node_dir), "out": str(out)})
                log = (base / f"{tag}-rank{rank}.log").open("wb")
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(WORKER), args],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
                log.close()
        for p in procs:
            p.wait(timeout=JOB_TIMEOUT_S)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
    results: dict[int, dict[str, Any]] = {}
    for rank, out in outs.items():
        if out.exists():
            results[rank] = json.loads(out.read_text())
        elif not allow_fail:
            text = (base / f"{tag}-rank{rank}.log").read_text(errors="replace")
            raise AssertionError(f"rank {rank} of {tag} left no result:\n{text}")
    return results


def expected(rank: int, iteration: int, size: int = 1000) -> list[Any]:
    v = float(rank * 1000 + iteration)
    return [v, v, size, list(range(rank + 3)), f"r{rank}", rank, iteration]


def test_two_nodes_replicate_and_a_lost_node_restores_from_peers(base: pathlib.Path) -> None:
    nodes = [base / "node0", base / "node1"]
    first = run_job(base, nodes, 2, "a", saves=[1, 2, 3])
    assert all(r["source"] == "none" and r["saved"] == [1, 2, 3] for r in first.values())
    # Each node holds its own ranks' snapshots and the other node's replicas.
    for node_dir, own, peers in ((nodes[0], (0, 1), (2, 3)), (nodes[1], (2, 3), (0, 1))):
        names = {p.name for p in node_dir.rglob("*.snap")}
        for owner in (*own, *peers):
            assert f"{owner}.0.snap" in names or f"{owner}.1.snap" in names, (node_dir, names)

    # Node 1 is lost with its memory; its replacement starts with an empty directory.
    shutil.rmtree(nodes[1])
    replaced = [nodes[0], base / "node1-new"]
    second = run_job(base, replaced, 2, "b", global_iteration=1)
    for rank, r in second.items():
        assert r["iteration"] == 3
        assert r["source"] == ("own" if rank < 2 else "peer")
        assert r["digest"] == expected(rank, 3)


def test_corrupt_and_missing_snapshots_fall_back_together(base: pathlib.Path) -> None:
    nodes = [base / "node0", base / "node1"]
    run_job(base, nodes, 1, "a", saves=[1, 2], replicas=0)
    # Rank 1's newest snapshot is damaged: iteration 1 is the newest complete one.
    for snap in (nodes[1] / "local0").glob("1.*.snap"):
        data = bytearray(snap.read_bytes())
        pre = _format.parse_preamble(bytes(data[: _format.PREAMBLE_SIZE]))
        if pre.iteration == 2:
            data[_format.PREAMBLE_SIZE + 10] ^= 0xFF
            snap.write_bytes(bytes(data))
    second = run_job(base, nodes, 1, "b", replicas=0)
    assert {r["iteration"] for r in second.values()} == {1}
    assert second[1]["digest"] == expected(1, 1)
    # Now truncate rank 1's other slot too: nothing is complete everywhere -> global.
    for snap in (nodes[1] / "local0").glob("1.*.snap"):
        with snap.open("r+b") as f:
            f.truncate(_format.PREAMBLE_SIZE + 100)
    third = run_job(base, nodes, 1, "c", replicas=0, global_iteration=0)
    assert all(r["source"] == "global" and r["iteration"] == 0 for r in third.values())


def test_world_size_change_falls_back_without_a_hang(base: pathlib.Path) -> None:
    nodes = [base / "node0", base / "node1"]
    run_job(base, nodes, 2, "a", saves=[1])
    second = run_job(base, nodes, 1, "b", global_iteration=None)
    assert all(r["source"] == "none" for r in second.values())


def test_other_job_snapshots_are_not_loaded(base: pathlib.Path) -> None:
    nodes = [base / "node0", base / "node1"]
    run_job(base, nodes, 1, "a", saves=[1], job="job-one")
    second = run_job(base, nodes, 1, "b", job="job-two", global_iteration=0)
    assert all(r["source"] == "global" for r in second.values())


def test_rank_killed_during_a_save_keeps_the_previous(base: pathlib.Path) -> None:
    nodes = [base / "node0", base / "node1"]
    run_job(base, nodes, 1, "a", saves=[1, 2], kill_in_finish=2, barrier=False, allow_fail=True)
    second = run_job(base, nodes, 1, "b")
    # Rank 0 (killed inside iteration 2's write) still has 1; rank 1 has 2 and its replica
    # of 0 is at 1 at most: every rank restores 1.
    for rank, r in second.items():
        assert r["iteration"] == 1
        assert r["digest"] == expected(rank, 1)


def test_replica_that_never_arrived_means_global(base: pathlib.Path) -> None:
    nodes = [base / "node0", base / "node1"]
    run_job(base, nodes, 1, "a", saves=[1])
    # Node 1 is lost and node 0 never got its replica.
    shutil.rmtree(nodes[1])
    for snap in (nodes[0] / "local0").glob("1.*.snap"):
        snap.unlink()
    second = run_job(base, [nodes[0], base / "node1-new"], 1, "b", global_iteration=0)
    assert all(r["source"] == "global" for r in second.values())


def test_holder_without_room_refuses_and_owner_keeps_training(base: pathlib.Path) -> None:
    nodes = [base / "node0", base / "node1"]
    # Node 1's share is so small that nothing fits there: its own saves are skipped and
    # it refuses node 0's replicas; node 0 keeps saving its own. Nobody hangs.
    first = run_job(base, nodes, 1, "a", saves=[1, 2, 3], node_spec={1: {"max_share": 1e-9}})
    assert first[0]["saved"] == [1, 2, 3]
    assert first[1]["saved"] == []
    assert not list(nodes[1].rglob("0.*.snap"))  # the replica was refused
    second = run_job(base, nodes, 1, "b", global_iteration=0)
    assert all(r["source"] == "global" for r in second.values())


def test_every_s_saves_at_the_same_iterations(base: pathlib.Path) -> None:
    nodes = [base / "node0", base / "node1"]
    first = run_job(base, nodes, 1, "a", saves=list(range(1, 16)), every_s=0.2, step_s=0.05)
    saved = [r["saved"] for r in first.values()]
    assert saved[0], saved
    assert all(s == saved[0] for s in saved)


def test_two_jobs_of_one_user_on_one_node(base: pathlib.Path) -> None:
    import threading

    from nvrx.ft.checkpointing.local._contract import create_node_dir, remove_dead_node_dirs

    # Two launchers of the same user on this node, running at the same time.
    dir_a = create_node_dir(base, "job-A")
    dir_b = create_node_dir(base, "job-B")
    try:
        results: dict[str, dict[int, dict[str, Any]]] = {}

        def job(name: str, node: pathlib.Path, saves: list[int]) -> None:
            results[name] = run_job(base, [node], 2, name, saves=saves, job=name)

        threads = [
            threading.Thread(target=job, args=("job-A", dir_a.path, [1, 2])),
            threading.Thread(target=job, args=("job-B", dir_b.path, [5])),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOB_TIMEOUT_S + 30)
        assert set(results) == {"job-A", "job-B"}
        assert remove_dead_node_dirs(base) == []  # both launchers are alive
        again_a = run_job(base, [dir_a.path], 2, "job-A-2", job="job-A")
        again_b = run_job(base, [dir_b.path], 2, "job-B-2", job="job-B")
        assert {r["iteration"] for r in again_a.values()} == {2}
        assert {r["iteration"] for r in again_b.values()} == {5}
        dir_a.release()  # job A's launcher is gone: only its directory goes
        assert remove_dead_node_dirs(base) == [dir_a.path]
        assert dir_b.path.is_dir()
    finally:
        dir_a.remove()
        dir_b.remove()
