"""The job timeline as Chrome trace-event JSON: tracks, phases and the named rank."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from test_goodput import crash_then_finish, rec  # type: ignore[import-not-found]

from nvrx.launcher import _goodput_cli
from nvrx.launcher._trace import job_trace, slices

pytestmark = pytest.mark.timeout(30)


def names(trace: dict[str, Any], track: str) -> list[str]:
    return [e["name"] for e in slices(trace, track)]


def test_cycles_phases_and_lost_work_follow_the_account() -> None:
    trace = job_trace(crash_then_finish(), job="job")
    assert names(trace, "cycles") == ["cycle 0", "cycle 1"]
    # Cycle 1's start-up is the restart's spawn and first step, so it has no slice.
    assert names(trace, "phases") == [
        "start-up",
        "training",
        "detection",
        "stop",
        "rendezvous",
        "spawn",
        "first step",
        "training",
    ]
    by_name = {e["name"]: e for e in slices(trace, "phases")[:7]}
    # Microseconds from the job's start: the crash at 80 s, stop 80->81, spawn 82->83.
    assert by_name["training"]["ts"] == 10_000_000
    assert by_name["training"]["dur"] == 70_000_000
    assert (by_name["stop"]["ts"], by_name["stop"]["dur"]) == (80_000_000, 1_000_000)
    assert (by_name["spawn"]["ts"], by_name["spawn"]["dur"]) == (82_000_000, 1_000_000)
    [lost] = slices(trace, "recomputed")
    assert (lost["ts"], lost["dur"]) == (50_000_000, 30_000_000)  # checkpoint at 50
    assert lost["args"]["cause"] == "crash"


def test_events_name_the_failed_hung_and_culprit_ranks() -> None:
    records = crash_then_finish()
    records.insert(
        4,
        rec(
            "rank_terminated_by_monitor",
            79.0,
            cycle=0,
            rank=3,
            local_rank=1,
            pid=9,
            cause="hang",
            section=None,
            observed_s=12.0,
            limit_s=10.0,
            message=None,
        ),
    )
    records.insert(
        5,
        rec(
            "hang_attributed",
            79.5,
            cycle=0,
            culprit=3,
            victims=[0, 1, 2],
            basis=["stack"],
            reason="r",
            sentence="rank 3 hung",
        ),
    )
    trace = job_trace(records)
    events = names(trace, "events")
    # The fault is the hang's earliest sign: 79 s less the 12 s the monitor observed.
    assert events == [
        "hang (cycle 0)",
        "rank 3 hang",
        "hang: culprit rank 3",
        "rank 1 failed (exit code None)",
    ]
    assert slices(trace, "events")[0]["ts"] == 67_000_000
    hang = slices(trace, "events")[1]
    assert hang["args"]["observed_s"] == 12.0
    assert hang["args"]["node"] == "a"


def test_every_event_is_well_formed_trace_json() -> None:
    trace = json.loads(json.dumps(job_trace(crash_then_finish())))
    assert trace["displayTimeUnit"] == "ms"
    for event in trace["traceEvents"]:
        assert event["ph"] in ("X", "i", "M"), event
        assert isinstance(event["pid"], int)
        if event["ph"] != "M":
            assert isinstance(event["ts"], int), event
            assert event["ts"] >= 0, event
        if event["ph"] == "X":
            assert isinstance(event["dur"], int), event
            assert event["dur"] >= 0, event


def test_cli_writes_the_trace_beside_the_summary(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "journal.jsonl"
    journal.write_text("".join(json.dumps(r) + "\n" for r in crash_then_finish()))
    out = tmp_path / "trace.json"
    assert _goodput_cli.main([str(journal), "--trace", str(out)]) == 0
    assert "goodput: ETTR" in capsys.readouterr().out
    trace = json.loads(out.read_text())
    assert trace["otherData"]["job"] == "journal.jsonl"
    assert "cycle 1" in names(trace, "cycles")
    assert out.stat().st_mode & 0o777 == 0o600
    with pytest.raises(SystemExit) as exc:
        _goodput_cli.main([str(journal), "--trace", str(tmp_path / "missing" / "t.json")])
    assert exc.value.code == 2
