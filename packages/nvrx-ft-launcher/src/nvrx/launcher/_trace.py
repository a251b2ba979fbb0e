"""A job's timeline as Chrome trace-event JSON, which Perfetto and chrome://tracing open.

People look at a timeline before they read a summary: where the job trained, where a
fault hit, how long each restart phase took, which rank hung. :func:`job_trace` turns
the journal records of every node into one trace (it reads no file and no clock):

- track "cycles": one slice per cycle, from its start to its end;
- track "phases": start-up, training, and each restart's detection, stop, rendezvous,
  spawn and first step (the same numbers :func:`nvrx.launcher.goodput.account` gives);
- track "recomputed": the training lost at each fault (it is run again after restart);
- track "events": an instant per fault, rank failure, hang report and hang attribution,
  naming the rank.

Times are microseconds from the job's start (the first ``run_start``); the trace's
``otherData`` holds that start as Unix time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nvrx.launcher import goodput
from nvrx.launcher._events import HangAttributed, RankFailed, RankTerminatedByMonitor

__all__: list[str] = []

_PID = 1
_TRACKS = ("cycles", "phases", "recomputed", "events")


def _tid(track: str) -> int:
    return _TRACKS.index(track) + 1


def _slice(
    name: str, track: str, start: float, end: float, origin: float, args: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "cat": track,
        "ph": "X",
        "ts": round((start - origin) * 1e6),
        "dur": max(0, round((end - start) * 1e6)),
        "pid": _PID,
        "tid": _tid(track),
        "args": dict(args),
    }


def _instant(name: str, t: float, origin: float, args: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "cat": "events",
        "ph": "i",
        "s": "p",
        "ts": round((t - origin) * 1e6),
        "pid": _PID,
        "tid": _tid("events"),
        "args": dict(args),
    }


def _metadata(job: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": _PID, "args": {"name": job}}
    ]
    for track in _TRACKS:
        out.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": _PID,
                "tid": _tid(track),
                "args": {"name": track},
            }
        )
        out.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": _PID,
                "tid": _tid(track),
                "args": {"sort_index": _tid(track)},
            }
        )
    return out


def _cycle_slices(
    cycle: goodput.CycleTimes, origin: float, job_end: float, restarted: bool
) -> list[dict[str, Any]]:
    """The cycle's slice, and its start-up (unless a restart's phases cover it) and training."""
    out: list[dict[str, Any]] = []
    if cycle.started is None:
        return out
    end = cycle.ended or cycle.stopped or cycle.fault or cycle.last_step or job_end
    args = {"cycle": cycle.cycle, "cause": None if cycle.cause is None else cycle.cause.value}
    out.append(_slice(f"cycle {cycle.cycle}", "cycles", cycle.started, end, origin, args))
    if cycle.first_step is None:
        return out
    if not restarted:
        out.append(_slice("start-up", "phases", cycle.started, cycle.first_step, origin, args))
    trained_to = cycle.fault or cycle.last_step or end
    if trained_to > cycle.first_step:
        out.append(_slice("training", "phases", cycle.first_step, trained_to, origin, args))
    return out


def _restart_slices(cost: goodput.RestartCost, origin: float) -> list[dict[str, Any]]:
    args = {"from_cycle": cost.from_cycle, "cycle": cost.cycle, "cause": cost.cause.value}
    parts = (
        ("detection", cost.detection_s),
        ("stop", cost.stop_s),
        ("rendezvous", cost.rendezvous_s),
        ("spawn", cost.spawn_s),
        ("first step", cost.first_step_s),
    )
    out: list[dict[str, Any]] = []
    t = cost.fault
    for name, seconds in parts:
        if seconds is None:
            break
        out.append(_slice(name, "phases", t, t + seconds, origin, {**args, "seconds": seconds}))
        t += seconds
    if cost.recomputed_s:
        out.append(
            _slice(
                f"lost at cycle {cost.from_cycle}'s {cost.cause.value}",
                "recomputed",
                cost.fault - cost.recomputed_s,
                cost.fault,
                origin,
                {**args, "seconds": cost.recomputed_s},
            )
        )
    return out


def _event_instant(record: Mapping[str, Any], origin: float) -> dict[str, Any] | None:
    kind, t = record.get("event"), record.get("t")
    if not isinstance(t, (int, float)):
        return None
    node = record.get("node")
    fields: tuple[str, ...]
    if kind == RankTerminatedByMonitor.EVENT:
        what = record.get("cause") or "hang"
        section = record.get("section")
        name = f"rank {record.get('rank')} {what}" + (f" in section {section}" if section else "")
        fields = ("cycle", "rank", "observed_s", "limit_s", "proc_state", "message")
    elif kind == RankFailed.EVENT:
        how = record.get("signal") or f"exit code {record.get('exit_code')}"
        name = f"rank {record.get('rank')} failed ({how})"
        fields = ("cycle", "rank", "exit_code", "signal", "monitor_cause")
    elif kind == HangAttributed.EVENT:
        culprit = record.get("culprit")
        name = "hang: culprit undecided" if culprit is None else f"hang: culprit rank {culprit}"
        fields = ("cycle", "culprit", "victims", "sentence")
    else:
        return None
    args = {f: record.get(f) for f in fields if record.get(f) is not None}
    args["node"] = node
    return _instant(name, float(t), origin, args)


def job_trace(records: Iterable[Mapping[str, Any]], job: str = "job") -> dict[str, Any]:
    """The trace-event JSON object of the job whose journal records are ``records``."""
    records = list(records)
    timeline = goodput.Timeline.from_records(records)
    summary = goodput.account(records)
    origin = timeline.start if timeline.start is not None else summary.start
    job_end = timeline.end if timeline.end is not None else summary.end
    events = _metadata(job)
    restarted = {cost.cycle for cost in summary.restarts if cost.first_step_s is not None}
    for cycle in timeline.cycles:
        events += _cycle_slices(cycle, origin, job_end, cycle.cycle in restarted)
    for cost in summary.restarts:
        events += _restart_slices(cost, origin)
        events.append(
            _instant(
                f"{cost.cause.value} (cycle {cost.from_cycle})",
                cost.fault,
                origin,
                {"cause": cost.cause.value, "cycle": cost.from_cycle},
            )
        )
    for record in records:
        instant = _event_instant(record, origin)
        if instant is not None:
            events.append(instant)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"job": job, "start_unix": origin, "nodes": list(timeline.nodes)},
    }


def slices(trace: Mapping[str, Any], track: str) -> Sequence[Mapping[str, Any]]:
    """The slices and instants of one track, in time order (for tests and tools)."""
    tid = _tid(track)
    found = [e for e in trace["traceEvents"] if e.get("ph") != "M" and e.get("tid") == tid]
    return sorted(found, key=lambda e: e["ts"])
