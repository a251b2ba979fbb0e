"""The journal and the cycle log match the JSON Schemas shipped with the package."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from launcher_testkit import Launcher  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode
from nvrx.launcher._events import (
    CycleLogDeriver,
    DecisionTaken,
    Finished,
    Recorder,
    RestartFailed,
    WorkersStopped,
)
from nvrx.launcher.journal import SCHEMA_VERSION, JsonLines, schema_path

Start = Callable[..., Launcher]


def _validator(name: str) -> Any:
    schema = json.loads(schema_path(name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _lines(path: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_schemas_are_valid_and_strict_enough(tmp_path: pathlib.Path) -> None:
    journal = _validator("journal")
    path = tmp_path / "j.jsonl"
    JsonLines(path, node="n").write({"event": "finished", "exit_code": 0, "reason": "ok"})
    [record] = _lines(path)
    assert record["schema_version"] == SCHEMA_VERSION
    journal.validate(record)
    for broken in [
        {k: v for k, v in record.items() if k != "schema_version"},
        {**record, "schema_version": 2},
        {**record, "event": "no_such_event"},
        {k: v for k, v in record.items() if k != "exit_code"},
        {**record, "exit_code": "0"},
    ]:
        assert not journal.is_valid(broken), broken
    cycle = _validator("cycle")
    assert not cycle.is_valid({"schema_version": 1, "t": 1.0, "action": "restart"})
    with pytest.raises(ValueError, match="no schema"):
        schema_path("other")


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_run_with_a_restart_and_a_stop_matches_the_schemas(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    journal_path = tmp_path / "journal.jsonl"
    cycle_path = tmp_path / "cycles.jsonl"
    launcher = start_launcher(
        [
            *("--nproc-per-node", "2", "--max-restarts", "1"),
            *(f"--ft-journal={journal_path}", f"--ft-cycle-log={cycle_path}"),
            "--ft-progress-file={out}/progress",
        ],
        ["--steps", "6", "--fault", "raise:1:3:*", "--step-time", "0.6"],
    )
    assert launcher.wait() == ExitCode.RESTARTS_EXHAUSTED, launcher.log()
    journal, cycle = _validator("journal"), _validator("cycle")
    records = _lines(journal_path)
    for record in records:
        journal.validate(record)
    kinds = {r["event"] for r in records}
    assert {"run_start", "workers_started", "rank_failed", "decision", "restart"} <= kinds
    # Rank 0 checkpoints steps 1 and 2 before rank 1 fails at step 3 (0.6 s per step).
    progress = [(r["cycle"], r["value"]) for r in records if r["event"] == "progress"]
    assert progress, records
    assert all(isinstance(r["saved"], float) for r in records if r["event"] == "progress")
    assert records[-1]["event"] == "finished"
    cycles = _lines(cycle_path)
    for record in cycles:
        cycle.validate(record)
    assert [c["action"] for c in cycles] == ["restart", "stop"]
    # The cycle log is derived from the journal: replaying the journal gives it exactly.
    replay = CycleLogDeriver()
    assert [c for c in map(replay.feed, records) if c is not None] == cycles


def test_a_failed_restart_ends_its_cycle_record(tmp_path: pathlib.Path) -> None:
    journal, cycles = JsonLines(tmp_path / "j", node="n"), JsonLines(tmp_path / "c", node="n")
    recorder = Recorder(journal, cycles)
    recorder.record(DecisionTaken(4, "restart", "why", "m", True, 5, 2, None, 10.0, "failure"))
    recorder.record(WorkersStopped(4, 11.0))
    recorder.record(RestartFailed(4, "RendezvousTimeoutError"))
    [record] = _lines(tmp_path / "c")
    _validator("cycle").validate(record)
    assert record["failed"] == "RendezvousTimeoutError"
    assert (record["cycle"], record["workers_stopped"], record["node"]) == (4, 11.0, "n")
    for line in _lines(tmp_path / "j"):
        _validator("journal").validate(line)


def test_the_final_stop_record_comes_from_finished_only_when_no_cycle_ended(
    tmp_path: pathlib.Path,
) -> None:
    """A launcher ending outside any cycle (signal, rendezvous timeout) gets a "stop"."""
    outside = JsonLines(tmp_path / "c1", node="n")
    recorder = Recorder(JsonLines(tmp_path / "j1", node="n"), outside)
    recorder.record(DecisionTaken(4, "restart", "why", "m", True, 5, 2, None, 10.0, "failure"))
    recorder.record(WorkersStopped(4, 11.0))
    recorder.record(RestartFailed(4, "RendezvousTimeoutError"))
    recorder.record(Finished(exit_code=1, reason="rendezvous failed"))
    failed, stop = _lines(tmp_path / "c1")
    assert failed["action"] == "restart"
    assert (stop["action"], stop["exit_code"], stop["reason"]) == ("stop", 1, "rendezvous failed")
    _validator("cycle").validate(stop)
    ended = JsonLines(tmp_path / "c2", node="n")
    recorder = Recorder(JsonLines(tmp_path / "j2", node="n"), ended)
    recorder.record(DecisionTaken(0, "stop", "why", "m", False, 0, 0, 1, 10.0, "failure"))
    recorder.record(WorkersStopped(0, 11.0))
    recorder.record(Finished(exit_code=1, reason="why"))
    assert [c["action"] for c in _lines(tmp_path / "c2")] == ["stop"]
    for line in _lines(tmp_path / "j1") + _lines(tmp_path / "j2"):
        _validator("journal").validate(line)


def test_every_event_type_is_in_the_schema_and_its_records_validate(
    tmp_path: pathlib.Path,
) -> None:
    from nvrx.launcher import _events

    kinds = {
        cls.EVENT
        for cls in vars(_events).values()
        if isinstance(cls, type) and issubclass(cls, _events.Event) and cls is not _events.Event
    }
    schema = json.loads(schema_path("journal").read_text())
    assert kinds <= set(schema["properties"]["event"]["enum"])
    recorder = Recorder(JsonLines(tmp_path / "j", node="n"), JsonLines(None))
    recorder.record(_events.FirstStep(2, 10.5, 3.0, [0, 1]))
    recorder.record(
        _events.CycleStarted(1, 1, 0, 4, {0: 0, 1: 1}, [{"node_id": "n", "group_rank": 0}])
    )
    recorder.record(_events.NodeUnhealthy(0, [{"check": "nic", "reason": "mlx5_0 DOWN"}], []))
    recorder.record(_events.GpuMemoryReclaim(1, False, 50.0, {0: 900.0}, {0: 0.0}, []))
    recorder.record(_events.NumaBinding(0, "none", False, {0: None}, "one NUMA node"))
    recorder.record(_events.SegmentLeft("nvl-7", "1 of its 2 nodes did not come back", ["n"]))
    validator = _validator("journal")
    for line in _lines(tmp_path / "j"):
        validator.validate(line)
    assert [r["event"] for r in _lines(tmp_path / "j")] == [
        "first_step",
        "cycle_start",
        "node_unhealthy",
        "gpu_memory_reclaim",
        "numa_binding",
        "segment_left",
    ]
