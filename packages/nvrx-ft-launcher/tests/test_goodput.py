"""Goodput accounting on synthetic journals whose answers are worked out by hand."""

from __future__ import annotations

import itertools
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from launcher_testkit import Launcher, read_events  # type: ignore[import-not-found]

from nvrx.launcher._goodput_cli import main
from nvrx.launcher.goodput import (
    SCHEMA_VERSION,
    Cause,
    CheckpointMark,
    Goodput,
    IterationSample,
    Ledger,
    Phase,
    StragglerWait,
    Timeline,
    account,
    records_of_run,
    restart_costs,
    writes_job_summary,
)

pytestmark = pytest.mark.timeout(30)

Record = dict[str, Any]


def rec(event: str, t: float, node: str = "a", **fields: Any) -> Record:
    return {"event": event, "t": t, "node": node, "schema_version": 1, **fields}


def decision(t: float, cycle: int, action: str = "restart", node: str = "a", **kw: Any) -> Record:
    return rec("decision", t, node, cycle=cycle, action=action, failure_noticed=t, **kw)


def restart(node: str, from_cycle: int, stopped: float, rdzv: float, started: float) -> Record:
    return rec(
        "restart",
        started,
        node,
        from_cycle=from_cycle,
        cycle=from_cycle + 1,
        workers_stopped=stopped,
        rendezvous_done=rdzv,
        workers_started=started,
    )


def crash_then_finish() -> list[Record]:
    """One node: a crash at 80 in cycle 0 (checkpoint seen at 50), the job ends at 191."""
    return [
        rec("run_start", 0.0, run_id="job"),
        rec("workers_started", 2.0, cycle=0, group_rank=0),
        rec("first_step", 10.0, cycle=0),
        rec("progress", 50.0, cycle=0, value=100),
        rec("rank_failed", 80.0, cycle=0, rank=1, monitor_cause=None, observed_s=None),
        decision(80.0, 0),
        rec("workers_stopped", 81.0, cycle=0, workers_stopped=81.0),
        restart("a", 0, 81.0, 82.0, 83.0),
        rec("workers_started", 83.0, cycle=1, group_rank=0),
        rec("first_step", 90.0, cycle=1),
        rec("all_nodes_finished", 190.0, cycle=1),
        rec("finished", 191.0, exit_code=0),
    ]


def split(g: Goodput) -> dict[str, float]:
    return {p.value: round(s, 6) for p, s in g.seconds.items() if s}


def test_one_crash_every_phase_known() -> None:
    g = account(crash_then_finish())
    assert g.total_s == 191.0
    assert split(g) == {
        "startup": 10.0,
        "productive": 40.0 + 100.0,
        "recomputed": 30.0,  # trained 50..80 after the checkpoint
        "stop": 1.0,
        "rendezvous": 1.0,
        "spawn": 1.0,
        "first_step": 7.0,
        "exit": 1.0,
    }
    assert sum(g.seconds.values()) == pytest.approx(g.total_s)
    assert g.ettr == pytest.approx(140.0 / 191.0)
    assert g.by_cause == {Cause.CRASH: pytest.approx(40.0)}
    [cost] = g.restarts
    assert (cost.from_cycle, cost.cycle, cost.cause, cost.fault) == (0, 1, Cause.CRASH, 80.0)
    assert (cost.detection_s, cost.stop_s, cost.rendezvous_s, cost.spawn_s) == (0, 1, 1, 1)
    assert (cost.first_step_s, cost.recomputed_s, cost.total_s) == (7.0, 30.0, 40.0)
    assert cost.recovery_s == 10.0
    assert g.unknown == ()


def test_last_step_ends_training_before_the_ranks_teardown() -> None:
    g = account([*crash_then_finish(), rec("last_step", 185.0, cycle=1)])
    assert g.seconds[Phase.PRODUCTIVE] == pytest.approx(135.0)
    assert g.seconds[Phase.EXIT] == pytest.approx(6.0)  # 185 to the launcher's end at 191


def test_summary_json_and_text() -> None:
    g = account(crash_then_finish())
    data = json.loads(g.dumps())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["ettr"] == pytest.approx(140.0 / 191.0)
    assert set(data["seconds"]) == {p.value for p in Phase}
    assert data["by_cause"] == {"crash": pytest.approx(40.0)}
    [cost] = data["restarts"]
    assert cost["event"] == "restart_cost"
    assert cost["cause"] == "crash"
    assert cost["total_s"] == 40.0
    text = g.format()
    assert text.splitlines()[0].startswith("goodput: ETTR 73.3% of 191.0 s wall time on 1 node(s)")
    assert "recomputed" in text
    assert "restart 0->1 (crash) cost 40.00 s" in text


def two_nodes() -> tuple[list[Record], list[Record]]:
    """A hangs in cycle 0 (last heartbeat at 60) while B's rank crashes at 65 on it;
    B's rank crashes again in cycle 1 at 100 with the budget spent: stop."""
    a = [
        rec("run_start", 0.0, "a", run_id="job"),
        rec("workers_started", 3.0, "a", cycle=0, group_rank=0),
        rec("first_step", 12.0, "a", cycle=0),
        rec(
            "rank_terminated_by_monitor",
            70.0,
            "a",
            cycle=0,
            rank=0,
            cause="heartbeat_timeout",
            observed_s=10.0,
        ),
        decision(70.05, 0, node="a"),
        rec("workers_stopped", 72.0, "a", cycle=0, workers_stopped=72.0),
        restart("a", 0, 72.0, 74.0, 75.0),
        rec("workers_started", 75.0, "a", cycle=1, group_rank=0),
        rec("first_step", 80.0, "a", cycle=1),
        decision(100.1, 1, "stop", node="a"),
        rec("workers_stopped", 101.0, "a", cycle=1, workers_stopped=101.0),
        rec("finished", 102.0, "a", exit_code=1),
    ]
    b = [
        rec("run_start", 1.0, "b", run_id="job"),
        rec("workers_started", 4.0, "b", cycle=0, group_rank=1),
        rec("first_step", 11.0, "b", cycle=0),
        rec("rank_failed", 65.0, "b", cycle=0, rank=1, monitor_cause=None),
        decision(65.0, 0, node="b"),
        rec("workers_stopped", 66.0, "b", cycle=0, workers_stopped=66.0),
        restart("b", 0, 66.0, 73.5, 76.0),
        rec("workers_started", 76.0, "b", cycle=1, group_rank=1),
        rec("first_step", 81.0, "b", cycle=1),
        rec("rank_failed", 100.0, "b", cycle=1, rank=1, monitor_cause=None),
        decision(100.0, 1, "stop", node="b"),
        rec("workers_stopped", 100.5, "b", cycle=1, workers_stopped=100.5),
        rec("finished", 101.5, "b", exit_code=1),
    ]
    return a, b


def test_multi_node_overlapping_faults_known_answer() -> None:
    a, b = two_nodes()
    g = account(a + b)
    assert g.nodes == 2
    assert g.total_s == 102.0
    assert split(g) == {
        "startup": 12.0,  # first run_start to the later node's first step
        "productive": 48.0 + 19.0,  # 12..60 (the hung rank's last heartbeat), 81..100
        "detection": 5.0,  # 60 to B's decision at 65 (the earliest notice)
        "stop": 7.0 + 1.0,  # to the later node's stop
        "rendezvous": 2.0,
        "spawn": 2.0,
        "first_step": 5.0,
        "exit": 1.0,
    }
    assert g.by_cause == {Cause.HANG: pytest.approx(21.0), Cause.CRASH: pytest.approx(1.0)}
    [cost] = g.restarts
    assert (cost.cause, cost.fault, cost.detection_s, cost.total_s) == (Cause.HANG, 60.0, 5.0, 21.0)
    assert cost.recomputed_s is None  # no checkpoint known
    assert g.unknown == ("cycle 0: recomputed work", "cycle 1: recomputed work")
    assert g.ettr == pytest.approx(67.0 / 102.0)


def test_every_node_computes_the_same_summary() -> None:
    a, b = two_nodes()
    expected = account(a + b).to_json()
    ta, tb = Timeline.from_records(a), Timeline.from_records(b)
    # Each node publishes its timeline as JSON; any order, any repetition, same answer.
    wire = [Timeline.from_json(json.loads(json.dumps(t.to_json()))) for t in (ta, tb)]
    for order in itertools.permutations([*wire, ta]):
        assert account(Timeline.merge(order)).to_json() == expected
    assert account(Timeline.merge([ta, Timeline.merge([tb, tb])])).to_json() == expected
    merged = Timeline.merge(wire)
    assert writes_job_summary(merged, "a")
    assert not writes_job_summary(merged, "b")
    assert not writes_job_summary(merged, "c")
    # one node alone sees only its part: B's crash (65) ended cycle 0 for it
    alone = account(tb)
    assert alone.restarts[0].cause is Cause.CRASH


@pytest.mark.parametrize(
    "bad",
    [
        {"schema_version": 2},
        {"nodes": "a"},
        {"cycles": [{"cycle": "0"}]},
        {"cycles": [{"cycle": 0, "started": float("nan")}]},
        {"cycles": [{"cycle": 0, "cause": "meteor"}]},
        {"cycles": [{"cycle": 0, "action": "explode"}]},
        {"checkpoints": [[1.0]]},
        {"group_ranks": {"a": True}},
        {"start": "yesterday"},
        {"straggler": [[1.0, 2.0]]},
        {"straggler": [[2.0, 1.0, 0.5]]},
        {"straggler": [[1.0, 2.0, 1.5]]},
        {"straggler": "none"},
    ],
)
def test_timeline_from_json_refuses_bad_input(bad: dict[str, Any]) -> None:
    good = Timeline.from_records(crash_then_finish()).to_json()
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        Timeline.from_json({**good, **bad})


def test_without_first_step_records_startup_counts_as_training_and_says_so() -> None:
    records = [r for r in crash_then_finish() if r["event"] != "first_step"]
    g = account(records)
    assert g.unknown == ("cycle 0: first step", "cycle 1: first step")
    assert split(g) == {
        "startup": 2.0,  # run_start to workers_started only
        "productive": 48.0 + 107.0,  # 2..80 less 30 recomputed; 83..190
        "recomputed": 30.0,
        "stop": 1.0,
        "rendezvous": 1.0,
        "spawn": 1.0,
        "exit": 1.0,
    }
    assert g.restarts[0].first_step_s is None
    assert "first step unknown" in g.restarts[0].format()
    assert "not in the records: cycle 0: first step" in g.format()


def test_recomputed_work_from_steps_times_measured_step_time() -> None:
    records = [r for r in crash_then_finish() if r["event"] != "progress"]
    # 600 iterations in 60 s (0.1 s a step); the checkpoint in force holds iteration 300
    history = [IterationSample(10.0, 0), IterationSample(40.0, 300), IterationSample(70.0, 600)]
    g = account(records, checkpoints=[CheckpointMark(45.0, 300)], iterations=history)
    assert g.restarts[0].recomputed_s == pytest.approx((600 - 300) * 0.1)
    # without the history: the time since the checkpoint was seen
    g = account(records, checkpoints=[CheckpointMark(45.0, 300)])
    assert g.restarts[0].recomputed_s == pytest.approx(80.0 - 45.0)
    # a checkpoint from an earlier cycle: everything this cycle trained is lost
    g = account(records, checkpoints=[CheckpointMark(1.0, 0)])
    assert g.restarts[0].recomputed_s == pytest.approx(80.0 - 10.0)
    # checkpoints known but none before the fault: the restart starts from scratch
    g = account(records, checkpoints=[CheckpointMark(150.0, 900)])
    assert g.restarts[0].recomputed_s == pytest.approx(70.0)
    assert g.seconds[Phase.PRODUCTIVE] == pytest.approx(100.0)


def test_straggler_wait_taken_from_productive_time() -> None:
    wait = StragglerWait.from_step_times(100.0, 190.0, {0: 1.0, 1: 1.0, 2: 2.0, 3: float("nan")})
    assert wait.fraction == pytest.approx(0.5)  # median 1.0 against the slowest 2.0
    # the report spans 100..200, but the job trained only until 190
    g = account(crash_then_finish(), straggler=[StragglerWait(100.0, 200.0, 0.5)])
    assert g.seconds[Phase.STRAGGLER_WAIT] == pytest.approx(45.0)
    assert g.seconds[Phase.PRODUCTIVE] == pytest.approx(140.0 - 45.0)
    # recomputed time (50..80) is not productive, so no wait is taken from it
    g = account(crash_then_finish(), straggler=[StragglerWait(10.0, 80.0, 1.0)])
    assert g.seconds[Phase.STRAGGLER_WAIT] == pytest.approx(40.0)
    assert StragglerWait.from_step_times(0, 1, {}).fraction == 0.0


def straggler_report(
    t: float, start: float, end: float, fraction: float, node: str = "a", cycle: int = 0
) -> Record:
    return rec(
        "straggler_report",
        t,
        node,
        cycle=cycle,
        written_at=t,
        window_start=start,
        window_end=end,
        wait_fraction=fraction,
        forward_section="fwd",
        step_section="train_step",
        ranks=2,
        worst_rank=1,
        worst_score=0.5,
    )


def test_straggler_wait_from_the_journals_straggler_reports() -> None:
    # 20..40 at 0.25 in cycle 0; 60..85 at 0.5 spans the crash at 80, but the recomputed
    # work (50..80) and the restart (80..90) are not productive: nothing; 150..160 at 0.1.
    records = [
        *crash_then_finish(),
        straggler_report(40.0, 20.0, 40.0, 0.25),
        straggler_report(85.0, 60.0, 85.0, 0.5),
        straggler_report(160.0, 150.0, 160.0, 0.1),
    ]
    g = account(records)
    assert g.seconds[Phase.STRAGGLER_WAIT] == pytest.approx(5.0 + 0.0 + 1.0)
    assert g.seconds[Phase.PRODUCTIVE] == pytest.approx(140.0 - 6.0)
    assert sum(g.seconds.values()) == pytest.approx(g.total_s)
    # the same wait given again to account() is not counted twice
    again = account(records, straggler=[StragglerWait(20.0, 40.0, 0.25)])
    assert again.seconds[Phase.STRAGGLER_WAIT] == pytest.approx(6.0)
    # damaged or partial records add nothing
    broken = [
        {**straggler_report(40.0, 20.0, 40.0, 0.25), "wait_fraction": None},
        {**straggler_report(40.0, 20.0, 40.0, 0.25), "wait_fraction": 1.5},
        {**straggler_report(40.0, 40.0, 20.0, 0.25)},
        {**straggler_report(40.0, 20.0, 40.0, 0.25), "window_start": "x"},
    ]
    g = account([*crash_then_finish(), *broken])
    assert g.seconds[Phase.STRAGGLER_WAIT] == 0.0
    ledger = Ledger()
    for r in records:
        ledger.feed(r)
    assert ledger.summary().seconds[Phase.STRAGGLER_WAIT] == pytest.approx(6.0)


def test_straggler_waits_survive_the_nodes_timeline_exchange_and_merge_once() -> None:
    a, b = two_nodes()
    a = [*a, straggler_report(30.0, 20.0, 30.0, 0.5)]  # rank 0's node journals the report
    expected = account(a + b)
    assert expected.seconds[Phase.STRAGGLER_WAIT] == pytest.approx(5.0)
    ta, tb = Timeline.from_records(a), Timeline.from_records(b)
    wire = [Timeline.from_json(json.loads(json.dumps(t.to_json()))) for t in (ta, tb)]
    assert wire[0].straggler == (StragglerWait(20.0, 30.0, 0.5),)
    for order in itertools.permutations([*wire, ta]):
        assert account(Timeline.merge(order)).to_json() == expected.to_json()
    # a timeline from a launcher without straggler waits still reads
    old = {k: v for k, v in tb.to_json().items() if k != "straggler"}
    assert Timeline.from_json(old).straggler == ()


def one_cycle(end: float) -> list[Record]:
    """One node trains from 0 to ``end``, no fault."""
    return [
        rec("run_start", 0.0, run_id="job"),
        rec("workers_started", 0.0, cycle=0, group_rank=0),
        rec("first_step", 0.0, cycle=0),
        rec("all_nodes_finished", end, cycle=0),
        rec("finished", end, exit_code=0),
    ]


def test_overlapping_straggler_waits_count_once_at_the_latest_reports_fraction() -> None:
    """Review finding 2: each wait's overlap was summed alone (150 s here, not 100)."""
    run = one_cycle(200.0)
    g = account(run, straggler=[StragglerWait(0, 100, 0.5), StragglerWait(0, 200, 0.5)])
    assert g.seconds[Phase.STRAGGLER_WAIT] == pytest.approx(100.0)
    # 50..100 is in both: the later report (ending at 150) says 0.2 there
    g = account(run, straggler=[StragglerWait(0, 100, 0.5), StragglerWait(50, 150, 0.2)])
    assert g.seconds[Phase.STRAGGLER_WAIT] == pytest.approx(25.0 + 20.0)
    g = account(run, straggler=[StragglerWait(0, 200, 0.1), StragglerWait(50, 100, 0.5)])
    assert g.seconds[Phase.STRAGGLER_WAIT] == pytest.approx(20.0)  # the longer one is later
    assert g.seconds[Phase.PRODUCTIVE] == pytest.approx(180.0)


def test_overlapping_waits_of_two_nodes_count_once_after_the_exchange() -> None:
    # cycle 0: rank 0 on node a; cycle 1: on node b, whose journal has a's wait too
    a, b = two_nodes()
    a = [*a, straggler_report(30.0, 20.0, 30.0, 0.5)]
    b = [
        *b,
        straggler_report(30.0, 20.0, 30.0, 0.5, node="b"),
        straggler_report(90.0, 82.0, 90.0, 0.5, node="b", cycle=1),
        straggler_report(95.0, 85.0, 95.0, 0.2, node="b", cycle=1),
    ]
    ta, tb = (
        Timeline.from_json(json.loads(json.dumps(Timeline.from_records(x).to_json())))
        for x in (a, b)
    )
    merged = account(Timeline.merge([ta, tb]))
    # 20..30 x 0.5, 82..85 x 0.5, then the later report's 85..95 x 0.2
    assert merged.seconds[Phase.STRAGGLER_WAIT] == pytest.approx(5.0 + 1.5 + 2.0)
    assert merged.to_json() == account(a + b).to_json()


def test_a_long_run_of_reports_fits_the_timeline_exchange_with_its_wait_seconds() -> None:
    """Review finding 5: ~1,100 waits (3.8 days of 300 s reports) overflowed the 64 KiB value."""
    n, period = 10_000, 300.0
    end = n * period + 10.0
    adjacent = [
        straggler_report((i + 1) * period, i * period, (i + 1) * period, 0.1 if i % 2 else 0.3)
        for i in range(n)
    ]
    tl = Timeline.from_records(one_cycle(end) + adjacent)
    assert len(tl.straggler) == 1  # one cycle of adjacent windows: one wait
    assert account(tl).seconds[Phase.STRAGGLER_WAIT] == pytest.approx(n * period * 0.2)
    gapped = [  # a report every 300 s covering 290 s of it
        straggler_report((i + 1) * period, i * period, i * period + 290.0, 0.2) for i in range(n)
    ]
    tl = Timeline.from_records(one_cycle(end) + gapped)
    wire = json.dumps(tl.to_json(), sort_keys=True)
    assert len(tl.straggler) <= 256
    assert len(wire.encode()) < 32 * 1024
    again = Timeline.from_json(json.loads(wire))
    assert account(again).seconds[Phase.STRAGGLER_WAIT] == pytest.approx(n * 290.0 * 0.2)


def test_fault_during_restart_start_up_is_charged_to_the_restart() -> None:
    # cycle 1 crashes at 86, before its first step; cycle 2 then finishes
    records = [
        *crash_then_finish()[:9],
        rec("rank_failed", 86.0, cycle=1, rank=0, monitor_cause=None),
        decision(86.0, 1),
        rec("workers_stopped", 86.5, cycle=1, workers_stopped=86.5),
        restart("a", 1, 86.5, 87.0, 88.0),
        rec("workers_started", 88.0, cycle=2, group_rank=0),
        rec("first_step", 95.0, cycle=2),
        rec("all_nodes_finished", 195.0, cycle=2),
        rec("finished", 196.0, exit_code=0),
    ]
    g = account(records)
    first, second = g.restarts
    assert first.first_step_s == pytest.approx(3.0)  # 83 to the crash at 86
    assert second.recomputed_s == pytest.approx(0.0)  # it never trained
    assert second.first_step_s == pytest.approx(7.0)
    assert g.seconds[Phase.PRODUCTIVE] == pytest.approx(40.0 + 100.0)
    assert sum(g.seconds.values()) == pytest.approx(g.total_s)
    assert g.unknown == ()


def test_a_crash_journaled_just_after_its_tick_is_still_the_cause() -> None:
    records = crash_then_finish()
    records[4] = rec("rank_failed", 80.02, cycle=0, rank=1, monitor_cause=None)  # noticed 80.0
    [cost] = account(records).restarts
    assert (cost.cause, cost.fault, cost.detection_s) == (Cause.CRASH, 80.0, 0.0)
    # and the other order of the two nodes' views gives the same
    tl = Timeline.from_records(records)
    assert account(Timeline.merge([tl, Timeline.from_records(records[:5])])).restarts == (cost,)


def test_hang_detection_runs_from_the_last_sign_of_life() -> None:
    records = crash_then_finish()
    records[4] = rec(
        "rank_failed", 80.0, cycle=0, rank=1, monitor_cause="section_timeout", observed_s=12.5
    )
    g = account(records)
    [cost] = g.restarts
    assert (cost.cause, cost.fault, cost.detection_s) == (Cause.HANG, 67.5, 12.5)
    assert cost.recomputed_s == pytest.approx(67.5 - 50.0)
    records[4]["monitor_cause"] = "gpu_health"
    assert restart_costs(records)[0].cause is Cause.HEALTH


@pytest.mark.parametrize(
    ("extra", "cause"),
    [
        ({"reason": "new nodes are waiting to join"}, Cause.NODES_WAITING),
        ({"trigger": "nodes_waiting", "reason": "x"}, Cause.NODES_WAITING),
        ({"reason": "something"}, Cause.UNKNOWN),
    ],
)
def test_cause_from_the_decision_when_no_rank_failed(extra: dict[str, Any], cause: Cause) -> None:
    records = crash_then_finish()
    del records[4]
    records[4] = decision(80.0, 0, **extra)
    [cost] = account(records).restarts
    assert (cost.cause, cost.detection_s) == (cause, 0.0)


def test_monitor_death_and_workload_control_are_causes() -> None:
    records = crash_then_finish()
    records[4] = rec("monitor_died", 79.0, cycle=0, local_rank=0, rank_was_connected=True)
    assert restart_costs(records)[0].cause is Cause.MONITOR_DIED
    assert restart_costs(records)[0].detection_s == pytest.approx(1.0)
    records[4] = rec("monitor_died", 79.0, cycle=0, local_rank=0, rank_was_connected=False)
    assert restart_costs(records)[0].cause is Cause.UNKNOWN
    records[4] = rec("workload_control", 79.0, cycle=0, action="ExcludeThisNode")
    assert restart_costs(records)[0].cause is Cause.EXCLUDE_REQUEST


def test_running_job_ends_now_and_a_job_ending_in_a_restart() -> None:
    records = crash_then_finish()[:10]  # running in cycle 1
    g = account(records, now=150.0)
    assert g.total_s == 150.0
    assert g.seconds[Phase.PRODUCTIVE] == pytest.approx(40.0 + 60.0)
    assert g.seconds[Phase.EXIT] == 0.0
    # the launcher was killed during the rendezvous of the restart
    records = [*crash_then_finish()[:7], rec("finished", 85.0, exit_code=130)]
    [cost] = account(records).restarts
    assert (cost.spawn_s, cost.first_step_s, cost.rendezvous_s) == (0.0, None, 0.0)
    g = account(records)
    assert g.seconds[Phase.EXIT] == pytest.approx(4.0)
    assert sum(g.seconds.values()) == pytest.approx(g.total_s)


def test_empty_and_odd_inputs_do_not_raise() -> None:
    g = account([])
    assert (g.total_s, g.ettr, g.restarts) == (0.0, None, ())
    g = account([rec("run_start", 5.0), rec("finished", 9.0)])
    assert g.seconds[Phase.STARTUP] == 4.0
    assert g.ettr == 0.0
    # skewed clocks: a stop recorded before the decision is clamped, never negative
    records = crash_then_finish()
    records[6] = rec("workers_stopped", 79.0, cycle=0, workers_stopped=79.0)
    records[7] = restart("a", 0, 79.0, 82.0, 83.0)
    g = account(records)
    assert all(s >= 0 for s in g.seconds.values())
    assert sum(g.seconds.values()) == pytest.approx(g.total_s)


def test_a_damaged_journal_is_read_as_far_as_it_makes_sense() -> None:
    records: list[Record] = [
        *crash_then_finish(),
        {"event": "decision", "t": "noon", "cycle": 0},
        {"event": "decision", "t": 80.0, "cycle": 0, "action": "explode", "failure_noticed": None},
        {"event": "restart", "t": float("nan"), "from_cycle": 0},
        {"event": "restart", "t": 83.0, "from_cycle": 0, "rendezvous_done": "soon"},
        {"event": "rank_failed", "t": 81.0, "cycle": "zero"},
        {"event": "rank_failed", "t": 80.5, "cycle": 0, "monitor_cause": "x", "observed_s": None},
        {"t": 1.0},
    ]
    g = account([{"node": "a", **r} for r in records])
    assert g.to_json() == account(crash_then_finish()).to_json()


def test_records_of_run_keeps_one_jobs_launchers() -> None:
    a, b = two_nodes()
    other = [rec("run_start", 500.0, "c", run_id="other"), rec("finished", 600.0, "c")]
    assert records_of_run(a + other + b, "job") == a + b


def test_ledger_returns_each_restart_cost_once_when_complete() -> None:
    ledger = Ledger()
    fed = {i: ledger.feed(r) for i, r in enumerate(crash_then_finish())}
    # the cost of the restart into cycle 1 is complete at cycle 1's first step (record 9)
    assert [i for i, costs in fed.items() if costs] == [9]
    [cost] = fed[9]
    assert cost == account(crash_then_finish()).restarts[0]
    assert ledger.summary().to_json() == account(crash_then_finish()).to_json()
    assert ledger.timeline() == Timeline.from_records(crash_then_finish())
    # without first_step records: when the new cycle ends, first step unknown
    ledger = Ledger()
    plain = [r for r in crash_then_finish() if r["event"] != "first_step"]
    by_event = {str(r["event"]): ledger.feed(r) for r in plain}
    [cost] = by_event["all_nodes_finished"]
    assert cost.first_step_s is None
    assert by_event["finished"] == []
    # the launcher ends during the restart: the cost comes with "finished"
    ledger = Ledger()
    out = [c for r in [*crash_then_finish()[:7], rec("finished", 85.0)] for c in ledger.feed(r)]
    assert [(c.from_cycle, c.first_step_s) for c in out] == [(0, None)]
    assert ledger.summary(now=86.0).total_s == 85.0


def test_command_line_summary_of_a_journal_file(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "journal.jsonl"
    a, b = two_nodes()
    other = [rec("run_start", 500.0, "c", run_id="other"), rec("finished", 600.0, "c")]
    lines = [json.dumps(r) for r in [*a, *other, *b]]
    path.write_text("\n".join([*lines, '{"event": "finished", "t": 1', "[1]"]) + "\n")
    assert main([str(path), "--run-id", "job", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == account(a + b).to_json()
    assert main([str(path), "--run-id", "job"]) == 0
    assert capsys.readouterr().out == account(a + b).format() + "\n"
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "missing.jsonl")])
    assert exc.value.code == 2
    assert "missing.jsonl" in capsys.readouterr().err


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_real_run_ettr_matches_a_hand_computation(
    start_launcher: Callable[..., Launcher], tmp_path: pathlib.Path
) -> None:
    """A 2-rank gloo job under ft_launcher, rank 1 SIGKILLed at step 8, then finished.

    The hand computation uses only the training script's own step log: the kept training
    is cycle 0 from its first step to the step-7 checkpoint, and cycle 1 from its first
    step to its end. The first and last steps are given to the account as the journal's
    ``first_step``/``last_step`` records will give them; without ``last_step`` the ranks'
    teardown counts as training (measured here: 0.5 s to 1.5 s more under load).
    Tolerance 0.2 s: the fault is the launcher's notice, a monitor tick after the kill.
    """
    log_dir = tmp_path / "logs"
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "2", "--log-dir", str(log_dir)],
        ["--steps", "20", "--step-time", "0.1", "--fault", "sigkill:1:8"],
    )
    assert launcher.wait() == 0, launcher.log()
    journal = [json.loads(line) for line in (log_dir / "ft_launcher_events.jsonl").open()]
    steps = [e for e in read_events(launcher.out) if e["event"] == "step"]
    done = [e for e in read_events(launcher.out) if e["event"] == "done"]
    first: dict[int, float] = {}  # the later rank's first step of each cycle
    for cycle in {e["cycle"] for e in steps}:
        per_rank: dict[int, float] = {}
        for e in steps:
            if e["cycle"] == cycle:
                per_rank[e["rank"]] = min(per_rank.get(e["rank"], e["t"]), e["t"])
        first[cycle] = max(per_rank.values())
    assert sorted(first) == [0, 1]
    # the records the agent writes once first steps and checkpoints are wired in
    node = journal[0]["node"]
    extra = [rec("first_step", t, node, cycle=c) for c, t in first.items()]
    extra.append(rec("last_step", max(e["t"] for e in done), node, cycle=1))
    marks = [CheckpointMark(e["t"], e["step"]) for e in steps if e["rank"] == 0]
    g = account([*journal, *extra], checkpoints=marks)

    ckpt = next(e["t"] for e in steps if (e["rank"], e["cycle"], e["step"]) == (0, 0, 7))
    hand_productive = (ckpt - first[0]) + (max(e["t"] for e in done) - first[1])
    run_start = next(r["t"] for r in journal if r["event"] == "run_start")
    hand_total = journal[-1]["t"] - run_start
    assert g.total_s == pytest.approx(hand_total)
    assert g.seconds[Phase.PRODUCTIVE] == pytest.approx(hand_productive, abs=0.2)
    hand_ettr = hand_productive / hand_total
    assert g.ettr is not None
    assert g.ettr == pytest.approx(hand_ettr, abs=0.2 / hand_total)
    teardown = account([*journal, *extra[:-1]], checkpoints=marks)
    assert teardown.seconds[Phase.PRODUCTIVE] > g.seconds[Phase.PRODUCTIVE]
    assert sum(g.seconds.values()) == pytest.approx(g.total_s)
    assert g.unknown == ()
    [cost] = g.restarts
    assert cost.cause is Cause.CRASH
    restart_record = next(r for r in journal if r["event"] == "restart")
    for phase in ("stop_s", "rendezvous_s", "spawn_s"):
        assert getattr(cost, phase) == pytest.approx(restart_record[phase], abs=0.05)
    assert cost.first_step_s is not None
    assert cost.first_step_s > 0
    assert cost.recomputed_s is not None
    print(f"\nhand ETTR {hand_ettr:.3f}; {g.format()}")
