"""The cycle-info file derived from journal records (synthetic records; real runs elsewhere)."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import jsonschema  # type: ignore[import-untyped]

from nvrx.ft import CYCLE_INFO_ENV, CycleGoodput, CycleNode, cycle_info_schema_path, read_cycle_info
from nvrx.launcher._cycle_info_writer import (
    CycleInfoWriter,
    cycle_info_attempt,
    cycle_info_job_id,
)

NODES = [{"node_id": "a:1:x", "group_rank": 0}, {"node_id": "b:2:y", "group_rank": 1}]


def _start(cycle: int, t: float, group_rank: int = 0) -> dict[str, Any]:
    return {
        "event": "cycle_start",
        "t": t,
        "cycle": cycle,
        "restart_count": cycle,
        "group_rank": group_rank,
        "world_size": 4,
        "local_ranks": {"0": 0, "1": 1},
        "nodes": NODES,
    }


def _valid(path: pathlib.Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    jsonschema.validate(document, json.loads(cycle_info_schema_path().read_text()))
    return document


def test_job_id_and_attempt_follow_nvrx_order() -> None:
    env = {"SLURM_ARRAY_JOB_ID": "77", "SLURM_JOB_ID": "78", "SLURM_RESTART_CNT": "2"}
    assert cycle_info_job_id("mine", env) == "mine"
    assert cycle_info_job_id(None, env) == "77"
    assert cycle_info_job_id(None, {"SLURM_JOB_ID": "78"}) == "78"
    assert cycle_info_job_id(None, {}) == ""
    assert cycle_info_attempt(env) == 2
    assert cycle_info_attempt({"SLURM_RESTART_CNT": "-1"}) == 0


def test_a_crash_and_a_restart_give_two_files_and_the_link_follows(tmp_path: pathlib.Path) -> None:
    sink = CycleInfoWriter(
        str(tmp_path),
        "1234",
        0,
        file_job="1234",
        log_file=lambda cycle, rank: f"/logs/job_cycle{cycle}_rank{rank}_stdout.log",
        goodput=lambda: CycleGoodput(productive_s=5.0, wall_s=10.0, ettr=0.5),
    )
    environ: dict[str, str] = {}
    sink.export(environ)
    assert environ[CYCLE_INFO_ENV] == str(tmp_path / "cycle_info.1234.current")
    sink.feed(_start(0, 100.0))
    started = read_cycle_info(environ[CYCLE_INFO_ENV])
    assert started is not None
    assert (started.cycle, started.started_at, started.ended_at, started.cause) == (
        0,
        100.0,
        None,
        None,
    )
    assert started.nodes == (CycleNode("a:1:x", 0), CycleNode("b:2:y", 1))
    assert started.ranks == (0, 1, 2, 3)
    assert started.log_file == "/logs/job_cycle0_rank0_stdout.log"
    sink.feed({"event": "rank_failed", "t": 105.0, "rank": 1, "exit_code": 1})
    sink.feed({"event": "decision", "t": 105.1, "action": "restart", "reason": "rank 1 exited 1"})
    sink.feed({"event": "workers_stopped", "t": 105.3, "workers_stopped": 105.2})
    ended = read_cycle_info(tmp_path / "cycle_info.1234.0.0")
    assert ended is not None
    assert ended.ended_at == 105.2
    assert ended.exit_codes == {1: 1}
    assert ended.goodput == CycleGoodput(5.0, 10.0, 0.5)
    _valid(tmp_path / "cycle_info.1234.0.0")
    sink.feed(_start(1, 106.0))
    assert os.readlink(tmp_path / "cycle_info.1234.current") == "cycle_info.1234.0.1"
    sink.feed({"event": "all_nodes_finished", "t": 110.0, "cycle": 1})
    sink.feed({"event": "finished", "t": 110.5, "exit_code": 0})  # the end was written already
    last = read_cycle_info(environ[CYCLE_INFO_ENV])
    assert last is not None
    assert (last.cycle, last.cause, last.ended_at) == (1, "rank 1 exited 1", 110.0)
    assert last.exit_codes == {0: 0, 1: 0}
    _valid(tmp_path / "cycle_info.1234.0.1")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cycle_info.1234.0.0",
        "cycle_info.1234.0.1",
        "cycle_info.1234.current",
    ]


def test_only_group_rank_zero_writes(tmp_path: pathlib.Path) -> None:
    sink = CycleInfoWriter(str(tmp_path), "", 0, file_job="run-x")
    sink.feed(_start(0, 100.0, group_rank=1))
    sink.feed({"event": "finished", "t": 101.0, "exit_code": 0})
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_directory_warns_once_and_carries_on(
    tmp_path: pathlib.Path, caplog: Any
) -> None:
    sink = CycleInfoWriter(str(tmp_path / "absent"), "", 0, file_job="run-x")
    with caplog.at_level("WARNING", logger="nvrx.launcher"):
        sink.feed(_start(0, 100.0))
        sink.feed({"event": "finished", "t": 101.0, "exit_code": 143})
    assert len([r for r in caplog.records if "cycle info" in r.getMessage()]) == 1


def test_a_hostile_job_id_stays_inside_the_directory(tmp_path: pathlib.Path) -> None:
    sink = CycleInfoWriter(str(tmp_path), "../../x", 0, file_job="../../x")
    sink.feed(_start(0, 100.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cycle_info..._.._x.0.0",
        "cycle_info..._.._x.current",
    ]
