"""A real ft_launcher job with one crash: the agent journals the restart's cost and the
job's goodput summary (ETTR in [0, 1], phases adding up to the wall time)."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable

import jsonschema  # type: ignore[import-untyped]
import pytest
from launcher_testkit import Launcher, free_port  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode, goodput
from nvrx.launcher.journal import schema_path

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]


@pytest.mark.timeout(150)
def test_a_crash_is_costed_and_the_job_summarised(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--ft-journal", str(journal)],
        ["--steps", "6", "--fault", "raise:1:3"],
    )
    assert launcher.wait() == ExitCode.SUCCESS, launcher.log()
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(schema_path("journal").read_text()))
    for record in records:
        validator.validate(record)

    costs = [r for r in records if r["event"] == "restart_cost"]
    assert len(costs) == 1, costs
    cost = costs[0]
    assert (cost["from_cycle"], cost["cycle"], cost["cause"]) == (0, 1, "crash"), cost
    parts = ("detection_s", "stop_s", "rendezvous_s", "spawn_s")
    assert all(cost[p] >= 0 for p in parts), cost
    restart = next(r for r in records if r["event"] == "restart")
    assert cost["stop_s"] == pytest.approx(restart["stop_s"], abs=0.05), (cost, restart)

    # Every cycle's first step came from the monitors (rank_first_step), so the cost has
    # its first-step phase and ETTR is exact, not an upper bound.
    first_steps = [r for r in records if r["event"] == "first_step"]
    assert [r["cycle"] for r in first_steps] == [0, 1], first_steps
    assert all(r["local_ranks"] == [0, 1] for r in first_steps), first_steps
    started = {r["cycle"]: r["t"] for r in records if r["event"] == "workers_started"}
    assert all(r["first_step"] > started[r["cycle"]] for r in first_steps), (first_steps, started)
    assert cost["first_step_s"] is not None, cost
    assert cost["first_step_s"] > 0, cost

    summaries = [r for r in records if r["event"] == "job_goodput"]
    assert len(summaries) == 1, summaries
    summary = summaries[0]["summary"]
    assert 0.0 <= summary["ettr"] <= 1.0, summary
    assert summary["ettr"] > 0.0, summary
    assert sum(summary["seconds"].values()) == pytest.approx(summary["total_s"], abs=1e-6)
    assert summary["by_cause"]["crash"] > 0, summary
    assert len(summary["restarts"]) == 1
    assert not any("first step" in u for u in summary["unknown"]), summary
    # The job summary comes before launch.py's last record, and its span is the run's.
    finished = records[-1]
    assert finished["event"] == "finished", finished
    run_start = next(r for r in records if r["event"] == "run_start")
    assert summary["start"] <= run_start["t"] + 1.0
    assert summary["end"] <= finished["t"]
    log = launcher.log()
    assert "goodput: ETTR " in log, log
    assert "restart 0->1 (crash) cost " in log, log

    # The same journal as a Perfetto timeline: both cycles, the restart's phases, the crash.
    from nvrx.launcher._trace import job_trace, slices

    trace = job_trace(records)
    assert [e["name"] for e in slices(trace, "cycles")] == ["cycle 0", "cycle 1"]
    phases = [e["name"] for e in slices(trace, "phases")]
    assert phases[phases.index("detection") :][:5] == [
        "detection",
        "stop",
        "rendezvous",
        "spawn",
        "first step",
    ], phases
    assert any(e["name"] == "rank 1 failed (exit code 1)" for e in slices(trace, "events"))


@pytest.mark.timeout(180)
def test_two_nodes_agree_and_group_rank_0_writes_the_job_summary(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    port = free_port()
    common = [
        "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", "goodput2", "--local-addr", "127.0.0.1",
    ]  # fmt: skip
    script = ["--steps", "6", "--fault", "raise:1:3"]
    journals = [tmp_path / "node0.jsonl", tmp_path / "node1.jsonl"]
    launchers = [
        start_launcher(
            [*common, "--rdzv-conf", f"is_host={1 - i}", "--ft-journal", str(journals[i])],
            script,
            name=f"node{i}",
        )
        for i in range(2)
    ]

    def logs() -> str:
        return "".join(str(launcher.log()) for launcher in launchers)

    for launcher in launchers:
        assert launcher.wait() == ExitCode.SUCCESS, logs()
    # Two nodes and no job key: each launcher warns (another machine reaches the store).
    assert all("WARNING: no job key" in str(launcher.log()) for launcher in launchers), logs()
    records = [json.loads(line) for path in journals for line in path.read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(schema_path("journal").read_text()))
    for record in records:
        validator.validate(record)
    # Each node journals its own view; exactly one, group rank 0, the job's.
    assert len([r for r in records if r["event"] == "node_goodput"]) == 2, logs()
    [job] = [r for r in records if r["event"] == "job_goodput"]
    rank0 = {r["node"] for r in records if r["event"] == "workers_started" and r["group_rank"] == 0}
    assert {job["node"]} == rank0
    summary = job["summary"]
    assert summary["nodes"] == 2, summary
    assert 0.0 < summary["ettr"] <= 1.0, summary
    assert len(summary["restarts"]) == 1, summary
    # It agrees with the account of both journals read offline (up to the writer's
    # clock at the end, which is before the last 'finished' record).
    offline = goodput.account(records)
    assert offline.nodes == 2
    assert summary["start"] == pytest.approx(offline.start)
    assert [r["cause"] for r in summary["restarts"]] == [r.cause.value for r in offline.restarts]
    assert summary["restarts"][0]["detection_s"] == pytest.approx(
        offline.restarts[0].detection_s, abs=1e-6
    )


def test_a_two_node_stop_keeps_the_job_summary(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    """No restarts left: both nodes stop (exit 1), and the job summary covers both.

    The store lives in one launcher; the stop path waits at the leave barrier, as a
    finished job does, so the summary writer still reaches the other node's timeline.
    """
    port = free_port()
    common = [
        "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "0",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", "goodput-stop", "--local-addr", "127.0.0.1",
    ]  # fmt: skip
    journals = [tmp_path / "node0.jsonl", tmp_path / "node1.jsonl"]
    launchers = [
        start_launcher(
            [*common, "--rdzv-conf", f"is_host={1 - i}", "--ft-journal", str(journals[i])],
            ["--steps", "6", "--fault", "raise:1:3"],
            name=f"node{i}",
        )
        for i in range(2)
    ]
    for launcher in launchers:
        assert launcher.wait() == 1, "".join(str(item.log()) for item in launchers)
    records = [json.loads(line) for path in journals for line in path.read_text().splitlines()]
    [job] = [r for r in records if r["event"] == "job_goodput"]
    assert job["summary"]["nodes"] == 2, job


@pytest.mark.timeout(150)
def test_each_cycles_first_step_counts_with_warm_spares(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    """A rank started from a warm spare is the spare's process: its events are the new
    cycle's (not dropped as an earlier cycle's pid), and cycle 1's first step is its own."""
    journal = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--warm-spares",
            "--ft-journal",
            str(journal),
        ],
        ["--steps", "6", "--fault", "raise:1:3"],
    )
    assert launcher.wait() == ExitCode.SUCCESS, launcher.log()
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    started = {r["cycle"]: r for r in records if r["event"] == "workers_started"}
    assert started[1]["warm_local_ranks"] == [0, 1], started[1]
    first_steps = [r for r in records if r["event"] == "first_step"]
    assert [r["cycle"] for r in first_steps] == [0, 1], first_steps
    assert all(r["first_step"] > started[r["cycle"]]["t"] for r in first_steps), first_steps
