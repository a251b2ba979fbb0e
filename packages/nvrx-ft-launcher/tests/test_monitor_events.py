"""The monitors' events as the launcher reads them: one type per kind, parsed once.

A datagram a monitor sends is parsed by ``nvrx.ft._events.parse_event`` into its kind's
type; the agent's reports dispatch on the type and build the journal records from it
field by field (no field copied by hand).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from nvrx.ft import StackSummary
from nvrx.ft._events import (
    RankConnected,
    RankDisconnected,
    RankEvent,
    RankFirstStep,
    RankTerminated,
    WorkloadRequest,
    encode_event,
    parse_event,
)
from nvrx.launcher._cycle_state import CycleState
from nvrx.launcher._events import (
    RankTerminatedByMonitor,
    Recorder,
    WorkloadControl,
    from_monitor_event,
)
from nvrx.launcher._rank_reports import RankReports
from nvrx.launcher.journal import JsonLines


def test_every_journal_field_of_a_monitor_report_is_its_monitor_types_field() -> None:
    for journal_kind, monitor_kind in (
        (RankTerminatedByMonitor, RankTerminated),
        (WorkloadControl, WorkloadRequest),
    ):
        own = {f.name for f in dataclasses.fields(monitor_kind)}
        journalled = {f.name for f in dataclasses.fields(journal_kind)} - {"cycle"}
        assert journalled <= own, (journal_kind, journalled - own)


def _reports(tmp_path: pathlib.Path) -> tuple[RankReports, CycleState, pathlib.Path]:
    journal = tmp_path / "journal.jsonl"
    recorder = Recorder(JsonLines(journal, node="n"), JsonLines(None))
    cycle = CycleState(number=2, started=0.0, progress=None)
    return RankReports(recorder, lambda: cycle, lambda: 2), cycle, journal


def test_datagrams_become_the_cycle_state_and_journal_records(tmp_path: pathlib.Path) -> None:
    reports, cycle, journal = _reports(tmp_path)
    sent: list[RankEvent] = [
        RankConnected(local_rank=0, rank=4, pid=100),
        RankConnected(local_rank=1, rank=5, pid=101),
        RankDisconnected(local_rank=1, rank=5, pid=101),
        RankFirstStep(
            local_rank=0, rank=4, pid=100, step_wall=10.0, since_init_s=2.0, via="section"
        ),
        RankFirstStep(
            local_rank=1, rank=5, pid=101, step_wall=11.0, since_init_s=3.0, via="heartbeat"
        ),
        RankTerminated(
            local_rank=0,
            rank=4,
            pid=100,
            cause="heartbeat_timeout",
            message="no heartbeat",
            open_sections=("step",),
            stack=StackSummary(collective="all_reduce", location="t.py:3", function="main"),
        ),
        WorkloadRequest(
            local_rank=1, rank=5, pid=101, action="ShutdownWorkload", description="done"
        ),
    ]
    events = [parse_event(encode_event(e)) for e in sent]
    assert events == sent  # parsed into the same types, field for field
    reports.handle(events, noticed=12.0)
    assert cycle.connected == {0}
    assert cycle.terminated[0] is events[5]
    assert cycle.first_report == 12.0
    assert cycle.shutdown_request is events[6]
    assert cycle.first_step_recorded
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [r["event"] for r in records] == [
        "first_step",
        "rank_terminated_by_monitor",
        "workload_control",
    ]
    first, terminated, control = records
    assert (first["first_step"], first["since_init_s"], first["local_ranks"]) == (11.0, 3.0, [0, 1])
    assert terminated["open_sections"] == ["step"]
    assert terminated["stack"] == {
        "collective": "all_reduce",
        "location": "t.py:3",
        "function": "main",
    }
    assert (terminated["cause"], terminated["rank"], terminated["pid"]) == (
        "heartbeat_timeout",
        4,
        100,
    )
    assert (control["action"], control["description"], control["rank"]) == (
        "ShutdownWorkload",
        "done",
        5,
    )
    built = from_monitor_event(WorkloadControl, 2, events[6])
    assert built == WorkloadControl(2, 5, 1, 101, "ShutdownWorkload", "done")


def test_an_earlier_cycles_rank_is_dropped_whatever_its_kind(tmp_path: pathlib.Path) -> None:
    reports, cycle, journal = _reports(tmp_path)
    reports.rank_pids.new_cycle([100])
    reports.rank_pids.new_cycle([200])
    reports.handle(
        [
            RankConnected(local_rank=0, rank=0, pid=100),
            RankTerminated(local_rank=0, rank=0, pid=100, cause="heartbeat_timeout", message="m"),
        ],
        noticed=1.0,
    )
    assert (cycle.connected, cycle.terminated) == (set(), {})
    assert not journal.exists() or journal.read_text() == ""
