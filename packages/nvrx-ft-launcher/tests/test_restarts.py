"""Real ft_launcher jobs (gloo, CPU, loopback): crashes, hangs, budgets, progress, control."""

from __future__ import annotations

import json
import pathlib
import re
import signal
from collections.abc import Callable
from typing import Any

import psutil
import pytest
from launcher_testkit import Launcher, free_port, read_events, wait_for  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]


def _events(launcher: Launcher, event: str, **match: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in read_events(launcher.out)
        if e["event"] == event and all(e.get(k) == v for k, v in match.items())
    ]


def _assert_resumed_and_finished(launcher: Launcher, steps: int, world: int) -> None:
    resumed = _events(launcher, "resume", cycle=1)
    assert len(resumed) == world
    # Training continued from its last checkpoint, not from scratch.
    assert all(e["step"] >= 1 for e in resumed), resumed
    for rank in range(world):
        assert _events(launcher, "done", rank=rank, cycle=1)
        done_steps = {e["step"] for e in _events(launcher, "step", rank=rank)}
        assert done_steps == set(range(1, steps + 1))


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("fault", "described"),
    [
        ("sigkill", "was killed by signal SIGKILL"),
        ("raise", "exited with code 1"),
        ("exit", "exited with code 3"),
    ],
)
def test_crashed_rank_is_restarted_and_resumes(
    start_launcher: Start, fault: str, described: str, tmp_path: pathlib.Path
) -> None:
    log_dir = tmp_path / "logs"
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "2", "--log-dir", str(log_dir), "-t", "3"],
        ["--steps", "6", "--fault", f"{fault}:1:3"],
    )
    assert launcher.wait() == ExitCode.SUCCESS, launcher.log()
    _assert_resumed_and_finished(launcher, steps=6, world=2)
    log = launcher.log()
    assert "restart 1/2" in log
    assert "rank 1 (local rank 1, pid" in log
    assert described in log
    assert "restarted in" in log
    # Ranks keep their global rank; the restart count tells them which attempt they are.
    starts = _events(launcher, "start", cycle=1)
    assert sorted(e["rank"] for e in starts) == [0, 1]
    # Per-rank logs as torchrun writes them, one attempt directory per cycle.
    for attempt in (0, 1):
        for local_rank in (0, 1):
            assert list(log_dir.glob(f"*/attempt_{attempt}/{local_rank}/stdout.log"))
    if fault == "raise":
        stderr = next(log_dir.glob("*/attempt_0/1/stderr.log")).read_text()
        assert "injected failure at step 3" in stderr
    # The journal (default: in --log-dir) tells the whole story in JSON.
    journal = [json.loads(line) for line in (log_dir / "ft_launcher_events.jsonl").open()]
    kinds = [e["event"] for e in journal]
    assert kinds[0] == "run_start"
    assert kinds[-1] == "finished"
    assert journal[-1]["exit_code"] == 0
    assert kinds.count("workers_started") == 2
    failed = next(e for e in journal if e["event"] == "rank_failed")
    assert (failed["rank"], failed["local_rank"]) == (1, 1)
    if fault == "sigkill":
        assert failed["signal"] == "SIGKILL"
    else:
        assert failed["exit_code"] == (1 if fault == "raise" else 3)
    decision = next(e for e in journal if e["event"] == "decision")
    assert (decision["action"], decision["charged"], decision["restart_count"]) == (
        "restart",
        True,
        1,
    )
    restart = next(e for e in journal if e["event"] == "restart")
    assert restart["cycle"] == 1
    for phase in ("stop_s", "rendezvous_s", "spawn_s"):
        assert restart[phase] >= 0


@pytest.mark.timeout(150)
@pytest.mark.parametrize("exit0_on_sigterm", [False, True])
def test_hung_rank_is_killed_by_its_monitor_and_job_restarts(
    start_launcher: Start, tmp_path: Any, exit0_on_sigterm: bool
) -> None:
    # With exit0_on_sigterm the ranks exit 0 when their monitor terminates them
    # (as Lightning does): that is still a failure, never "finished successfully".
    cycle_log = tmp_path / "cycles.jsonl"
    launcher = start_launcher(
        [
            "--nproc-per-node", "2", "--max-restarts", "1",
            "--ft-rank-heartbeat-timeout", "2", "--ft-cycle-log", str(cycle_log),
        ],
        ["--steps", "6", "--fault", "hang:1:3"]
        + (["--exit0-on-sigterm"] if exit0_on_sigterm else []),
    )  # fmt: skip
    assert launcher.wait() == ExitCode.SUCCESS, launcher.log()
    _assert_resumed_and_finished(launcher, steps=6, world=2)
    log = launcher.log()
    assert "heartbeat_timeout" in log
    records = [json.loads(line) for line in cycle_log.read_text().splitlines()]
    restart = next(r for r in records if r["action"] == "restart")
    assert re.search(
        r"rank 1 \(local rank 1, pid \d+\) "
        r"(exited with code 0|was killed by signal SIGTERM|is being stopped); "
        r"its monitor terminated it: heartbeat_timeout",
        restart["reason"],
    ), restart["reason"]
    assert restart["charged"] is True
    assert restart["workers_started"] >= restart["rendezvous_done"] >= restart["workers_stopped"]


@pytest.mark.timeout(150)
def test_restart_budget_exhausted_gives_its_exit_code(start_launcher: Start) -> None:
    launcher = start_launcher(
        ["--nproc-per-node", "1", "--max-restarts", "1"],
        ["--steps", "6", "--fault", "exit:0:2:*", "--no-checkpoint"],
    )
    assert launcher.wait() == ExitCode.RESTARTS_EXHAUSTED, launcher.log()
    assert {e["cycle"] for e in _events(launcher, "start")} == {0, 1}
    assert "no restarts left (1/1 used)" in launcher.log()


@pytest.mark.timeout(150)
def test_crash_loop_is_stopped_by_the_progress_rule(start_launcher: Start) -> None:
    launcher = start_launcher(
        [
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "10",
            "--ft-max-no-progress-restarts",
            "1",
            "--ft-progress-file",
            "{out}/progress",
        ],
        ["--steps", "6", "--fault", "exit:0:3:*"],
    )
    # The first cycle reaches step 2 (progress); the next ones fail at step 3 without moving it.
    assert launcher.wait() == ExitCode.NO_PROGRESS, launcher.log()
    assert {e["cycle"] for e in _events(launcher, "start")} == {0, 1, 2}
    assert "no progress in" in launcher.log()


@pytest.mark.timeout(150)
def test_exclusion_request_acts_at_once_and_names_the_rank(start_launcher: Start) -> None:
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "3"],
        ["--steps", "400", "--fault", "exclude:1:2"],
    )
    assert launcher.wait() == ExitCode.NODE_EXCLUDED, launcher.log()
    log = launcher.log()
    assert "rank 1 (local rank 1, pid" in log
    assert "requests ExcludeThisNode" in log
    # Acted on while training was still running, not at the next restart.
    assert max(e["step"] for e in _events(launcher, "step")) < 400
    assert not _events(launcher, "start", cycle=1)


@pytest.mark.timeout(150)
def test_shutdown_request_stops_the_workload(start_launcher: Start) -> None:
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "3"],
        ["--steps", "400", "--fault", "shutdown:0:2"],
    )
    assert launcher.wait() == ExitCode.WORKLOAD_SHUTDOWN, launcher.log()
    assert "rank 0 (local rank 0, pid" in launcher.log()
    assert "requests ShutdownWorkload" in launcher.log()
    assert max(e["step"] for e in _events(launcher, "step")) < 400


@pytest.mark.timeout(150)
def test_killed_monitor_is_replaced_and_its_rank_restarted(start_launcher: Start) -> None:
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "2"],
        ["--steps", "60", "--step-time", "0.1"],
    )
    wait_for(lambda: len(_events(launcher, "step")) >= 4, what="training steps")
    old = launcher.monitor_pids()
    assert len(old) == 2
    psutil.Process(old[0]).send_signal(signal.SIGKILL)
    assert launcher.wait() == ExitCode.SUCCESS, launcher.log()
    assert "died" in launcher.log()
    assert _events(launcher, "resume", cycle=1)


@pytest.mark.timeout(180)
def test_two_launchers_as_two_nodes_restart_together(start_launcher: Start) -> None:
    port = free_port()
    common = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "two-nodes",
        "--local-addr",
        "127.0.0.1",
    ]
    first = start_launcher(
        [*common, "--rdzv-conf", "is_host=1"],
        ["--steps", "8", "--fault", "sigkill:1:3"],
        name="node0",
    )
    second = start_launcher(
        [*common, "--rdzv-conf", "is_host=0"],
        ["--steps", "8", "--fault", "sigkill:1:3"],
        name="node1",
    )
    assert first.wait() == ExitCode.SUCCESS, first.log() + second.log()
    assert second.wait() == ExitCode.SUCCESS, first.log() + second.log()
    _assert_resumed_and_finished(first, steps=8, world=2)
    starts = {(e["cycle"], e["rank"]): e["group_rank"] for e in _events(first, "start")}
    # Both nodes restarted, and each kept its node rank and global rank.
    assert starts[(0, 0)] == starts[(1, 0)]
    assert starts[(0, 1)] == starts[(1, 1)]
    logs = first.log() + second.log()
    assert "decided here" in logs
    assert "decided by" in logs


@pytest.mark.timeout(180)
def test_excluded_node_leaves_and_the_other_carries_on(start_launcher: Start) -> None:
    port = free_port()
    common = [
        "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", "exclusion", "--local-addr", "127.0.0.1",
    ]  # fmt: skip
    # Cycle 0: the first node alone; cycle 1: both (the second joined); rank 1, on the
    # second node, then asks to exclude its node. Cycle 0 trains long enough (10 s) for
    # the second launcher to start and join on a loaded machine: a first node that
    # finished before would close the store the second is connecting to.
    script = [
        "--steps",
        "200",
        "--step-time",
        "0.05",
        "--fault",
        "exclude:1:3:1",
        "--no-checkpoint",
    ]
    conf = "last_call_timeout=1,is_host="
    first = start_launcher([*common, "--rdzv-conf", conf + "1"], script, name="node0")
    wait_for(lambda: "starting 1 worker" in first.log(), what="the first node to start")
    second = start_launcher([*common, "--rdzv-conf", conf + "0"], script, name="node1")
    assert second.wait() == ExitCode.NODE_EXCLUDED, second.log()
    assert first.wait() == ExitCode.SUCCESS, first.log() + second.log()
    assert "requests ExcludeThisNode" in second.log()
    # The remaining node restarted alone (world size 1) and finished the training.
    assert [e["world"] for e in _events(first, "start", cycle=1)] == [2, 2]
    assert [e["world"] for e in _events(first, "start", cycle=2)] == [1]
    assert _events(first, "done", cycle=2)


@pytest.mark.timeout(120)
def test_rendezvous_timeout_is_a_launcher_error_with_a_final_record(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    cycle_log = tmp_path / "cycles.jsonl"
    launcher = start_launcher(
        [
            "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "--rdzv-id", "alone", "--rdzv-conf", "join_timeout=2",
            "--ft-cycle-log", str(cycle_log),
        ],
        ["--steps", "3"],
    )  # fmt: skip
    assert launcher.wait() == ExitCode.LAUNCHER_ERROR, launcher.log()
    records = [json.loads(line) for line in cycle_log.read_text().splitlines()]
    assert len(records) == 1
    assert records[0]["action"] == "stop"
    assert records[0]["exit_code"] == ExitCode.LAUNCHER_ERROR
    assert records[0]["reason"] == "the rendezvous timed out after 2 s waiting for 2 node(s)"
    assert launcher.monitor_pids() == []
