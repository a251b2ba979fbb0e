"""Goodput accounting: where a job's wall time went, computed from the launcher's journal.

Infrastructure teams are judged on effective training time (Meta's ETTR: productive
time over wall time). :func:`account` turns the journal records of every node (plus,
where known, checkpoint marks, the iteration history and straggler waits) into a
:class:`Goodput`: the wall time split into :class:`Phase` s that add up to it exactly,
each restart's cost (:class:`RestartCost`) and the badput by :class:`Cause`. It reads no
file and no clock, so every rule is tested on synthetic journals.

The rules (all times are Unix times from the journal):

- the job runs from the first ``run_start`` to the last ``finished`` record (or ``now``);
- a cycle trains from its first step (the ``first_step`` record, the latest over nodes)
  until its fault, or until its last step (``last_step``, else ``all_nodes_finished``:
  then the ranks' teardown counts as training); without ``first_step`` records the
  rank start-up counts as training and :attr:`Goodput.unknown` says so;
- a fault happened at its earliest sign over every node: a hung rank at ``t -
  observed_s`` of its monitor's report (its last heartbeat or section start), a crash
  or a dead monitor when the launcher saw it; detection runs from there to the
  decision's ``failure_noticed`` (the earliest over nodes);
- a restart then costs stop (to the latest ``workers_stopped``), rendezvous (to the
  latest ``rendezvous_done``), spawn (to the latest ``workers_started``) and first step
  (to the next cycle's first step);
- recomputed work is the training after the checkpoint in force at the fault: steps
  since the checkpoint times the measured step time when the iteration history is
  known, otherwise the time since the checkpoint was seen; unknown without checkpoints;
  where the next cycle's ranks journalled what they restored (``checkpoint_restored``,
  local checkpoints), that state is the checkpoint in force: its iteration from the
  time its snapshot was taken (a fresh start, source ``none``: all the cycle's
  training), and the restart's cost says where it came from;
- straggler wait is the productive time the straggler reports cover, times their wait
  fraction (the journal's ``straggler_report`` records, which the launcher writes from
  the scores rank 0 publishes, plus any :class:`StragglerWait` given to :func:`account`).

Multi-node: each node's records give a :class:`Timeline`; :meth:`Timeline.merge` takes
each boundary's earliest (fault, noticed) or latest (started, first step, stopped,
rendezvous done, ended) value over nodes. The merge is commutative, associative and
idempotent, so every node holding the same timelines computes the same accounting. At
the job's end each node publishes its timeline (:meth:`Ledger.timeline`, signed, through
the rendezvous store) and the node of group rank :data:`SUMMARY_GROUP_RANK`
(:func:`writes_job_summary`) merges the ones it gets within a few seconds and journals
the job summary (``job_goodput``); every node journals its own view (``node_goodput``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import heapq
import itertools
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from . import _event_names as names

__all__ = [
    "SCHEMA_VERSION",
    "SUMMARY_GROUP_RANK",
    "Cause",
    "CheckpointMark",
    "CycleTimes",
    "Goodput",
    "IterationSample",
    "Ledger",
    "Phase",
    "RestartCost",
    "StragglerWait",
    "Timeline",
    "account",
    "records_of_run",
    "restart_costs",
    "writes_job_summary",
]

#: Version of :meth:`Goodput.to_json`, :meth:`Timeline.to_json` and the cost record.
SCHEMA_VERSION = 1
#: The node whose ranks form group rank 0 in the last cycle writes the job summary.
SUMMARY_GROUP_RANK = 0


class Phase(enum.Enum):
    """Where a second of wall time went; the phases of a job add up to its wall time."""

    PRODUCTIVE = "productive"
    STARTUP = "startup"
    DETECTION = "detection"
    STOP = "stop"
    RENDEZVOUS = "rendezvous"
    SPAWN = "spawn"
    FIRST_STEP = "first_step"
    RECOMPUTED = "recomputed"
    STRAGGLER_WAIT = "straggler_wait"
    EXIT = "exit"


#: The phases a restart costs, in order.
_RESTART_PHASES = (Phase.DETECTION, Phase.STOP, Phase.RENDEZVOUS, Phase.SPAWN, Phase.FIRST_STEP)


class Cause(enum.Enum):
    """What ended a cycle, from the earliest evidence in the journal."""

    HANG = "hang"
    CRASH = "crash"
    HEALTH = "health"
    MONITOR_DIED = "monitor_died"
    EXCLUDE_REQUEST = "exclude_request"
    SHUTDOWN_REQUEST = "shutdown_request"
    NODES_WAITING = "nodes_waiting"
    UNKNOWN = "unknown"


_HEALTH_CAUSES = frozenset({"gpu_health", "nic_health"})
_WORKLOAD_CAUSES = {
    "ExcludeThisNode": Cause.EXCLUDE_REQUEST,
    "ShutdownWorkload": Cause.SHUTDOWN_REQUEST,
}
_TRIGGERS = {
    "exclude_request": Cause.EXCLUDE_REQUEST,
    "shutdown_request": Cause.SHUTDOWN_REQUEST,
    "nodes_waiting": Cause.NODES_WAITING,
}
#: The reason the agent gives when it restarts for joining nodes (older journals have no
#: ``trigger`` field in the decision).
_NODES_WAITING_REASON = "new nodes are waiting to join"
#: Merged decision actions, strongest first: the job restarts if any node restarts.
_ACTIONS = ("restart", "stop", "shutdown", "finish", "exclude")


@dataclasses.dataclass(frozen=True)
class CheckpointMark:
    """A checkpoint of ``iteration`` whose state is from ``t`` (Unix time)."""

    t: float
    iteration: int


@dataclasses.dataclass(frozen=True)
class IterationSample:
    """The training had reached ``iteration`` at ``t`` (Unix time)."""

    t: float
    iteration: int


@dataclasses.dataclass(frozen=True)
class StragglerWait:
    """Between ``start`` and ``end`` the ranks waited ``fraction`` of each step for the slowest.

    From a straggler report: the launcher takes the report's wait fraction
    (``nvrx.ft.StragglerScores.wait_fraction``: the forward-section gap over the whole
    step); :meth:`from_step_times` is ``1 - median / max`` of whole step times, right
    where the slow rank's extra time is all in its step's own compute. Where waits
    overlap, :func:`account` counts the time once, at the latest report's fraction.
    """

    start: float
    end: float
    fraction: float

    @classmethod
    def from_step_times(
        cls, start: float, end: float, step_s: Mapping[int, float]
    ) -> StragglerWait:
        """The wait from each rank's step time: the others wait for the slowest every step."""
        times = sorted(v for v in step_s.values() if math.isfinite(v) and v > 0)
        if not times:
            return cls(start, end, 0.0)
        mid = len(times) // 2
        median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
        return cls(start, end, 1.0 - median / times[-1])


def _lo(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _hi(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


@dataclasses.dataclass(frozen=True)
class CycleTimes:
    """One cycle's boundaries (Unix times; None: not in the records)."""

    cycle: int
    started: float | None = None
    first_step: float | None = None
    #: The end of training in a cycle that finished (before the ranks' teardown).
    last_step: float | None = None
    fault: float | None = None
    cause: Cause | None = None
    #: The cause the decision gives (its ``trigger``), used when no record shows the fault.
    trigger: Cause | None = None
    noticed: float | None = None
    action: str | None = None
    stopped: float | None = None
    #: The rendezvous of the restart that ended this cycle.
    rendezvous_done: float | None = None
    ended: float | None = None
    #: What this cycle's ranks restored (``checkpoint_restored``): the snapshot's time
    #: and iteration, and where from (``own``, ``peer``, ``global``, ``none``; nodes that
    #: differ are joined with ``+`` in a fixed order, e.g. ``peer+own``).
    restored_t: float | None = None
    restored_iteration: int | None = None
    restored_from: str | None = None

    def merge(self, other: CycleTimes) -> CycleTimes:
        """Both nodes' view of the cycle as one (see the module doc)."""
        fault, cause = self.fault, self.cause
        if other.fault is not None and (
            fault is None or (other.fault, _cause_key(other.cause)) < (fault, _cause_key(cause))
        ):
            fault, cause = other.fault, other.cause
        actions = [a for a in (self.action, other.action) if a is not None]
        return CycleTimes(
            cycle=self.cycle,
            started=_hi(self.started, other.started),
            first_step=_hi(self.first_step, other.first_step),
            last_step=_hi(self.last_step, other.last_step),
            fault=fault,
            cause=cause,
            trigger=min((self.trigger, other.trigger), key=_cause_key),
            noticed=_lo(self.noticed, other.noticed),
            action=min(actions, key=_ACTIONS.index) if actions else None,
            stopped=_hi(self.stopped, other.stopped),
            rendezvous_done=_hi(self.rendezvous_done, other.rendezvous_done),
            ended=_hi(self.ended, other.ended),
            restored_t=_lo(self.restored_t, other.restored_t),
            restored_iteration=_lo_int(self.restored_iteration, other.restored_iteration),
            restored_from=_sources(self.restored_from, other.restored_from),
        )

    def to_json(self) -> dict[str, Any]:
        """JSON form (the cause by value)."""
        out = dataclasses.asdict(self)
        out["cause"] = None if self.cause is None else self.cause.value
        out["trigger"] = None if self.trigger is None else self.trigger.value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CycleTimes:
        """Inverse of :meth:`to_json`; a ValueError names a bad field."""
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = data.get(f.name)
            if f.name == "cycle":
                value = _int(value, "cycle")
            elif f.name in ("cause", "trigger"):
                value = None if value is None else Cause(value)
            elif f.name == "action":
                if value is not None and value not in _ACTIONS:
                    raise ValueError(f"action {value!r} unknown")
            elif f.name == "restored_iteration":
                value = None if value is None else _int(value, f.name)
            elif f.name == "restored_from":
                if value is not None and (
                    not isinstance(value, str) or _sources(value, None) != value
                ):
                    raise ValueError(f"restored_from {value!r} unknown")
            elif value is not None:
                value = _time(value, f.name)
            fields[f.name] = value
        return cls(**fields)


#: Where a cycle's ranks restored their state from, in the order a merged value lists them.
_RESTORE_SOURCES = ("global", "none", "peer", "own")


def _sources(a: str | None, b: str | None) -> str | None:
    """The restore sources of two views, joined in the order of ``_RESTORE_SOURCES``."""
    parts = {p for v in (a, b) if v for p in v.split("+")}
    if not parts:
        return None
    if not parts <= set(_RESTORE_SOURCES):
        raise ValueError(f"restore source {sorted(parts)} unknown")
    return "+".join(s for s in _RESTORE_SOURCES if s in parts)


def _lo_int(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _cause_key(cause: Cause | None) -> int:
    return len(Cause) if cause is None else list(Cause).index(cause)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} is not an integer")
    return value


def _time(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is not a finite number")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Timeline:
    """A job's cycle boundaries as one node (or several, merged) recorded them."""

    nodes: tuple[str, ...] = ()
    start: float | None = None
    end: float | None = None
    cycles: tuple[CycleTimes, ...] = ()
    #: Checkpoints seen (journal ``progress`` records), earliest time per iteration.
    checkpoints: tuple[CheckpointMark, ...] = ()
    #: The group rank of each node in the last cycle it started.
    group_ranks: tuple[tuple[str, int], ...] = ()
    #: The straggler waits the journal's ``straggler_report`` records measured.
    straggler: tuple[StragglerWait, ...] = ()

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> Timeline:
        """The merged timeline of every node in ``records`` (one job's journal lines)."""
        by_node: dict[str, list[Mapping[str, Any]]] = {}
        for record in records:
            by_node.setdefault(str(record.get("node", "")), []).append(record)
        return cls.merge(_node_timeline(node, recs) for node, recs in by_node.items())

    @classmethod
    def merge(cls, timelines: Iterable[Timeline]) -> Timeline:
        """One timeline for the job (the rules in the module doc)."""
        nodes: set[str] = set()
        start = end = None
        cycles: dict[int, CycleTimes] = {}
        marks: dict[int, float] = {}
        ranks: dict[str, int] = {}
        waits: set[StragglerWait] = set()
        for tl in timelines:
            nodes.update(tl.nodes)
            start, end = _lo(start, tl.start), _hi(end, tl.end)
            for c in tl.cycles:
                cycles[c.cycle] = cycles[c.cycle].merge(c) if c.cycle in cycles else c
            for m in tl.checkpoints:
                marks[m.iteration] = min(marks.get(m.iteration, m.t), m.t)
            ranks.update(tl.group_ranks)
            waits.update(tl.straggler)
        return cls(
            nodes=tuple(sorted(nodes)),
            start=start,
            end=end,
            cycles=tuple(cycles[k] for k in sorted(cycles)),
            checkpoints=tuple(CheckpointMark(t, i) for i, t in sorted(marks.items())),
            group_ranks=tuple(sorted(ranks.items())),
            straggler=_sorted_waits(waits),
        )

    def to_json(self) -> dict[str, Any]:
        """JSON form, e.g. for a node to publish its timeline to the summary writer."""
        return {
            "schema_version": SCHEMA_VERSION,
            "nodes": list(self.nodes),
            "start": self.start,
            "end": self.end,
            "cycles": [c.to_json() for c in self.cycles],
            "checkpoints": [[m.t, m.iteration] for m in self.checkpoints],
            "group_ranks": dict(self.group_ranks),
            "straggler": [[w.start, w.end, w.fraction] for w in self.straggler],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Timeline:
        """Inverse of :meth:`to_json`; a ValueError says what is wrong (never trust input)."""
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {data.get('schema_version')!r} is not {SCHEMA_VERSION}"
            )
        nodes, cycles, marks, ranks = (
            data.get(k) for k in ("nodes", "cycles", "checkpoints", "group_ranks")
        )
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise ValueError("nodes is not a list of strings")
        if not isinstance(cycles, list) or not all(isinstance(c, dict) for c in cycles):
            raise ValueError("cycles is not a list of objects")
        if not isinstance(marks, list) or not all(
            isinstance(m, list) and len(m) == 2 for m in marks
        ):
            raise ValueError("checkpoints is not a list of [t, iteration]")
        if not isinstance(ranks, dict):
            raise ValueError("group_ranks is not an object")
        waits = data.get("straggler", [])  # absent in timelines of older launchers
        if not isinstance(waits, list) or not all(
            isinstance(w, list) and len(w) == 3 for w in waits
        ):
            raise ValueError("straggler is not a list of [start, end, fraction]")
        start, end = data.get("start"), data.get("end")
        return cls(
            nodes=tuple(nodes),
            start=None if start is None else _time(start, "start"),
            end=None if end is None else _time(end, "end"),
            cycles=tuple(CycleTimes.from_json(c) for c in cycles),
            checkpoints=tuple(
                CheckpointMark(_time(t, "checkpoint t"), _int(i, "checkpoint iteration"))
                for t, i in marks
            ),
            group_ranks=tuple(sorted((str(k), _int(v, "group rank")) for k, v in ranks.items())),
            straggler=_sorted_waits(
                _wait(_time(a, "straggler start"), _time(b, "straggler end"), _time(f, "fraction"))
                for a, b, f in waits
            ),
        )


def _sorted_waits(waits: Iterable[StragglerWait]) -> tuple[StragglerWait, ...]:
    return tuple(sorted(set(waits), key=lambda w: (w.start, w.end, w.fraction)))


#: Most straggler waits a node's timeline carries (its store value holds at most 64 KiB;
#: one wait takes ~60 bytes of JSON).
_MAX_TIMELINE_WAITS = 256
#: Waits this close (seconds) count as adjacent: one report's window ends where the next starts.
_ADJACENT_S = 1e-3


def _union(waits: Iterable[StragglerWait]) -> list[StragglerWait]:
    """Disjoint pieces covering every wait once; where waits overlap the latest report's
    (the one ending last) fraction holds. Touching pieces of one fraction are joined."""
    ordered = sorted((w for w in waits if w.end > w.start), key=lambda w: w.start)
    points = sorted({p for w in ordered for p in (w.start, w.end)})
    active: list[tuple[float, float, float]] = []  # (-end, -start, -fraction): latest on top
    out: list[StragglerWait] = []
    i = 0
    for a, b in itertools.pairwise(points):
        while i < len(ordered) and ordered[i].start <= a:
            w = ordered[i]
            heapq.heappush(active, (-w.end, -w.start, -w.fraction))
            i += 1
        while active and -active[0][0] <= a:  # the latest has ended: so have all
            heapq.heappop(active)
        if not active:
            continue
        fraction = min(max(-active[0][2], 0.0), 1.0)
        if out and out[-1].end == a and out[-1].fraction == fraction:
            out[-1] = StragglerWait(out[-1].start, b, fraction)
        else:
            out.append(StragglerWait(a, b, fraction))
    return out


def _joined(run: Sequence[StragglerWait]) -> StragglerWait:
    """One wait over ``run``'s span with the same wait seconds (time-weighted fraction)."""
    start, end = run[0].start, run[-1].end
    seconds = sum((w.end - w.start) * w.fraction for w in run)
    return StragglerWait(start, end, min(max(seconds / (end - start), 0.0), 1.0))


def _coalesced(by_cycle: Mapping[int | None, Iterable[StragglerWait]]) -> tuple[StragglerWait, ...]:
    """A node's waits, few enough for the nodes' timeline exchange.

    Within each cycle the waits are made disjoint (:func:`_union`) and adjacent ones (a
    report's window starting where the last ended) joined into one with their total wait
    seconds: a run of any length is one wait per cycle. Should more than
    _MAX_TIMELINE_WAITS remain (reports with gaps between them), neighbours are joined
    pairwise, which spreads a wait over the gap between them.
    """
    waits: list[StragglerWait] = []
    for cycle in sorted(by_cycle, key=lambda c: -1 if c is None else c):
        run: list[StragglerWait] = []
        for w in _union(by_cycle[cycle]):
            if run and w.start - run[-1].end > _ADJACENT_S:
                waits.append(_joined(run))
                run = []
            run.append(w)
        if run:
            waits.append(_joined(run))
    waits.sort(key=lambda w: (w.start, w.end))
    while len(waits) > _MAX_TIMELINE_WAITS:
        waits = [_joined(waits[i : i + 2]) for i in range(0, len(waits), 2)]
    return tuple(waits)


def _wait(start: float, end: float, fraction: float) -> StragglerWait:
    """A wait from outside (a journal line, another node's timeline); ValueError if impossible."""
    if end < start or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"straggler wait [{start}, {end}] x {fraction} is impossible")
    return StragglerWait(start, end, fraction)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _opt_num(record: Mapping[str, Any], key: str) -> float | None:
    """``record[key]`` when it is a finite number, else None (a damaged journal)."""
    value = record.get(key)
    if isinstance(value, (int, float)) and _is_time(value):
        return float(value)
    return None


def _num(record: Mapping[str, Any], key: str, default: float) -> float:
    value = _opt_num(record, key)
    return default if value is None else value


def _evidence(record: Mapping[str, Any]) -> tuple[float, Cause] | None:
    """When a journal record says the fault happened, and its cause (None: no fault)."""
    kind, t = record.get("event"), float(record["t"])
    if kind in (names.RANK_TERMINATED_BY_MONITOR, names.RANK_FAILED):
        monitor_cause = record.get(
            "cause" if kind == names.RANK_TERMINATED_BY_MONITOR else "monitor_cause"
        )
        if monitor_cause is None:
            return t, Cause.CRASH
        since = t - max(0.0, _num(record, "observed_s", 0.0))
        return since, Cause.HEALTH if monitor_cause in _HEALTH_CAUSES else Cause.HANG
    if kind == names.MONITOR_DIED and record.get("rank_was_connected"):
        return t, Cause.MONITOR_DIED
    if kind == names.WORKLOAD_CONTROL and record.get("action") in _WORKLOAD_CAUSES:
        return t, _WORKLOAD_CAUSES[str(record["action"])]
    return None


def _node_timeline(node: str, records: Sequence[Mapping[str, Any]]) -> Timeline:
    cycles: dict[int, CycleTimes] = {}
    start = end = None
    marks: list[CheckpointMark] = []
    waits: dict[int | None, list[StragglerWait]] = {}
    group_rank: int | None = None

    def update(cycle: int, **changes: Any) -> None:
        current = cycles.get(cycle, CycleTimes(cycle))
        cycles[cycle] = current.merge(CycleTimes(cycle, **changes))

    for r in records:
        kind, t, cycle = r.get("event"), _opt_num(r, "t"), r.get("cycle")
        if t is None:
            continue
        if kind == names.RUN_START:
            start = _lo(start, t)
        elif kind == names.FINISHED:
            end = _hi(end, t)
        elif kind == names.PROGRESS and isinstance(r.get("value"), int):
            marks.append(CheckpointMark(_num(r, "saved", t), int(r["value"])))
        elif kind == names.STRAGGLER_REPORT:
            window = [_opt_num(r, k) for k in ("window_start", "window_end", "wait_fraction")]
            if None not in window:
                with contextlib.suppress(ValueError):  # a damaged line adds no wait
                    wait = _wait(*cast("list[float]", window))
                    waits.setdefault(cycle if isinstance(cycle, int) else None, []).append(wait)
        if not isinstance(cycle, int):
            continue
        evidence = _evidence(r)
        if evidence is not None:
            update(cycle, fault=evidence[0], cause=evidence[1])
        if kind == names.WORKERS_STARTED:
            update(cycle, started=t)
            if isinstance(r.get("group_rank"), int):
                group_rank = r["group_rank"]
        elif kind == names.FIRST_STEP:
            update(cycle, first_step=_num(r, "first_step", t))
        elif kind == names.LAST_STEP:
            update(cycle, last_step=_num(r, "last_step", t))
        elif kind == names.DECISION:
            noticed = _num(r, "failure_noticed", t)
            cause = _TRIGGERS.get(str(r.get("trigger")))
            if cause is None and r.get("reason") == _NODES_WAITING_REASON:
                cause = Cause.NODES_WAITING
            # The decision is the fault's latest possible time (e.g. another node's crash
            # whose records are not here): account() takes the earlier of the two.
            update(
                cycle,
                noticed=noticed,
                action=r.get("action") if r.get("action") in _ACTIONS else None,
                trigger=cause or Cause.UNKNOWN,
            )
        elif kind == names.WORKERS_STOPPED:
            update(cycle, stopped=_num(r, "workers_stopped", t))
        elif kind == names.RESTART and isinstance(r.get("from_cycle"), int):
            stopped, done = _opt_num(r, "workers_stopped"), _opt_num(r, "rendezvous_done")
            update(r["from_cycle"], rendezvous_done=done, stopped=stopped)
        elif kind == names.ALL_NODES_FINISHED:
            update(cycle, ended=t, action="finish")
        elif kind == names.CHECKPOINT_RESTORED and r.get("source") in _RESTORE_SOURCES:
            iteration = r.get("iteration")
            update(
                cycle,
                restored_t=_opt_num(r, "snapshot_wall"),
                restored_iteration=iteration if _is_count(iteration) else None,
                restored_from=str(r["source"]),
            )
    return Timeline(
        nodes=(node,),
        start=start,
        end=end,
        cycles=tuple(cycles[k] for k in sorted(cycles)),
        checkpoints=tuple(marks),
        group_ranks=() if group_rank is None else ((node, group_rank),),
        straggler=_coalesced(waits),
    )


def records_of_run(records: Iterable[Mapping[str, Any]], run_id: str) -> list[Mapping[str, Any]]:
    """The records of the launchers whose ``run_start`` names ``run_id`` (a shared file)."""
    records = list(records)
    nodes = {
        r.get("node")
        for r in records
        if r.get("event") == names.RUN_START and r.get("run_id") == run_id
    }
    return [r for r in records if r.get("node") in nodes]


def writes_job_summary(timeline: Timeline, node: str) -> bool:
    """True for the one node that writes the job summary (group rank 0 in its last cycle)."""
    return dict(timeline.group_ranks).get(node) == SUMMARY_GROUP_RANK


@dataclasses.dataclass(frozen=True)
class RestartCost:
    """What one restart cost, in seconds (None: not in the records)."""

    from_cycle: int
    cycle: int
    cause: Cause
    #: When the fault happened (its earliest sign), Unix time.
    fault: float
    detection_s: float
    stop_s: float
    rendezvous_s: float
    spawn_s: float
    first_step_s: float | None
    recomputed_s: float | None
    #: Where the new cycle's ranks restored their state from (``own``, ``peer``,
    #: ``global``, ``none``, joined with ``+`` where nodes differ), and its iteration;
    #: None: the journal does not say (no local checkpoints).
    restored_from: str | None = None
    restored_iteration: int | None = None

    @property
    def total_s(self) -> float:
        """The known parts together."""
        parts = (self.first_step_s, self.recomputed_s)
        known = sum(p for p in parts if p is not None)
        return self.detection_s + self.stop_s + self.rendezvous_s + self.spawn_s + known

    @property
    def recovery_s(self) -> float:
        """Decision to the new cycle's first step (to its start when that is unknown)."""
        return self.stop_s + self.rendezvous_s + self.spawn_s + (self.first_step_s or 0.0)

    def to_record(self) -> dict[str, Any]:
        """The journal's ``restart_cost`` record (``schema_version``, ``t``, ``node`` later)."""
        out = dataclasses.asdict(self)
        out.update(event=names.RESTART_COST, cause=self.cause.value, total_s=self.total_s)
        return out

    def format(self) -> str:
        """One log line."""

        def s(v: float | None) -> str:
            return "unknown" if v is None else f"{v:.2f} s"

        text = (
            f"restart {self.from_cycle}->{self.cycle} ({self.cause.value}) "
            f"cost {self.total_s:.2f} s: "
            f"detection {s(self.detection_s)}, stop {s(self.stop_s)}, rendezvous "
            f"{s(self.rendezvous_s)}, spawn {s(self.spawn_s)}, first step {s(self.first_step_s)}, "
            f"recomputed {s(self.recomputed_s)}"
        )
        if self.restored_from is not None:
            text += f"; {_describe_restore(self.restored_from, self.restored_iteration)}"
        return text


def _describe_restore(source: str, iteration: int | None) -> str:
    """Where a restart's state came from, in words (``peer+own``: nodes differed)."""
    at = "" if iteration is None else f" of iteration {iteration}"
    words = {
        "own": "this node's memory",
        "peer": "a peer node's replica",
        "global": "the global (disk) checkpoint",
        "none": "nothing (a fresh start)",
    }
    parts = source.split("+")
    if set(parts) <= {"own", "peer"}:
        where = " and ".join(words[p] for p in parts if p in words)
        return f"restored the local snapshot{at} from {where}"
    if parts == ["none"]:
        return "restored nothing (a fresh start)"
    return f"restored from {' / '.join(words.get(p, p) for p in parts)}" + at


@dataclasses.dataclass(frozen=True)
class Goodput:
    """A job's wall time split by phase, and its badput by cause."""

    start: float
    end: float
    nodes: int
    seconds: Mapping[Phase, float]
    by_cause: Mapping[Cause, float]
    restarts: tuple[RestartCost, ...]
    #: What the records did not say, e.g. ``"cycle 1: first step"`` (then ETTR is an
    #: upper bound: rank start-up counted as training).
    unknown: tuple[str, ...]

    @property
    def total_s(self) -> float:
        """Wall time of the job."""
        return self.end - self.start

    @property
    def ettr(self) -> float | None:
        """Effective training time ratio: productive over wall time (None for no time)."""
        total = self.total_s
        return None if total <= 0 else self.seconds[Phase.PRODUCTIVE] / total

    def to_json(self) -> dict[str, Any]:
        """The job summary as JSON (schema-versioned)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "start": self.start,
            "end": self.end,
            "nodes": self.nodes,
            "total_s": self.total_s,
            "ettr": self.ettr,
            "seconds": {p.value: self.seconds[p] for p in Phase},
            "by_cause": {c.value: s for c, s in self.by_cause.items()},
            "restarts": [r.to_record() for r in self.restarts],
            "unknown": list(self.unknown),
        }

    def format(self) -> str:
        """The job summary as log text."""
        ettr = "n/a" if self.ettr is None else f"{self.ettr:.1%}"
        lines = [
            f"goodput: ETTR {ettr} of {self.total_s:.1f} s wall time on {self.nodes} node(s), "
            f"{len(self.restarts)} restart(s)"
        ]
        for phase in Phase:
            value = self.seconds[phase]
            if value > 0 or phase is Phase.PRODUCTIVE:
                share = value / self.total_s if self.total_s > 0 else 0.0
                lines.append(f"  {phase.value:<15} {value:10.2f} s {share:7.1%}")
        for cause, value in sorted(self.by_cause.items(), key=lambda kv: -kv[1]):
            lines.append(f"  badput from {cause.value}: {value:.2f} s")
        lines += [f"  {r.format()}" for r in self.restarts]
        if self.unknown:
            lines.append("  not in the records: " + "; ".join(self.unknown))
        return "\n".join(lines)

    def dumps(self) -> str:
        """:meth:`to_json` as one line."""
        return json.dumps(self.to_json(), sort_keys=True)


def _lost_work(
    begin: float,
    fault: float,
    checkpoints: Sequence[CheckpointMark],
    iterations: Sequence[IterationSample],
) -> float | None:
    """Seconds of the training in ``[begin, fault)`` after the checkpoint in force."""
    if not checkpoints:
        return None
    trained = max(0.0, fault - begin)
    before = [m for m in checkpoints if m.t <= fault]
    if not before:  # no checkpoint yet: the restart starts from scratch
        return trained
    mark = before[-1]
    samples = [s for s in iterations if begin <= s.t <= fault]
    if len(samples) >= 2 and samples[-1].iteration > samples[0].iteration:
        step_s = (samples[-1].t - samples[0].t) / (samples[-1].iteration - samples[0].iteration)
        lost = (samples[-1].iteration - mark.iteration) * step_s
    else:
        lost = fault - max(mark.t, begin)
    return min(trained, max(0.0, lost))


def restart_costs(records: Iterable[Mapping[str, Any]], **kwargs: Any) -> tuple[RestartCost, ...]:
    """Each restart's cost so far (:func:`account`'s arguments), for the journal."""
    return account(records, **kwargs).restarts


def account(
    records: Iterable[Mapping[str, Any]] | Timeline,
    *,
    checkpoints: Iterable[CheckpointMark] = (),
    iterations: Iterable[IterationSample] = (),
    straggler: Iterable[StragglerWait] = (),
    now: float | None = None,
) -> Goodput:
    """The job's goodput from its journal records (or merged :class:`Timeline`).

    ``checkpoints`` add to the journal's ``progress`` records; ``iterations`` is the
    training's iteration history (for the step time); ``straggler`` the waits the
    straggler reports measured; ``now`` ends a job that has not finished (without it,
    such a job ends at the latest time in the records).
    """
    tl = records if isinstance(records, Timeline) else Timeline.from_records(records)
    marks = sorted({*tl.checkpoints, *checkpoints}, key=lambda m: (m.t, m.iteration))
    history = sorted(iterations, key=lambda s: s.t)
    cycles = [c for c in tl.cycles if c.started is not None]
    start = tl.start if tl.start is not None else (cycles[0].started if cycles else None)
    end = tl.end if tl.end is not None else now
    if end is None:  # not finished and no ``now``: up to the latest time recorded
        times = [getattr(c, f.name) for c in cycles for f in dataclasses.fields(c)]
        for t in [start, *(t for t in times if isinstance(t, float))]:
            end = _hi(end, t)
    if start is None or end is None:
        start = end = start or end or 0.0
    seconds = dict.fromkeys(Phase, 0.0)
    by_cause: dict[Cause, float] = {}
    unknown: list[str] = []
    costs: list[RestartCost] = []
    first_steps_recorded = any(c.first_step is not None for c in cycles)
    cursor = start
    productive: list[tuple[float, float]] = []

    def span(until: float | None, phase: Phase, cause: Cause | None = None) -> float:
        """Charge ``[cursor, until)`` (clamped to the job) to ``phase``; its length."""
        nonlocal cursor
        t = cursor if until is None else min(max(until, cursor), end)
        length = t - cursor
        seconds[phase] += length
        if cause is not None:
            by_cause[cause] = by_cause.get(cause, 0.0) + length
        if phase is Phase.PRODUCTIVE and length > 0:
            productive.append((cursor, t))
        cursor = t
        return length

    pending: dict[str, Any] | None = None  # the restart into this cycle, until its first step
    for i, c in enumerate(cycles):
        # A rank's failure is journaled just after the tick that noticed it: the fault is
        # the earlier of its records and the decision, its cause the records' if any.
        fault = _lo(c.fault, c.noticed)
        cause = c.cause or c.trigger or Cause.UNKNOWN
        ended_by_fault = c.action not in (None, "finish") and fault is not None
        # With first_step records on, a cycle without one that failed never got there.
        first_known = c.first_step is not None or (first_steps_recorded and ended_by_fault)
        if not first_known:
            unknown.append(f"cycle {c.cycle}: first step")
        begin = c.first_step
        if begin is None:
            begin = fault if first_known else c.started
        if pending is None:
            span(begin, Phase.STARTUP)
        else:
            spawn = span(c.started, Phase.SPAWN, pending["cause"])
            first = span(begin, Phase.FIRST_STEP, pending["cause"])
            costs.append(
                RestartCost(spawn_s=spawn, first_step_s=first if first_known else None, **pending)
            )
            pending = None
        if not ended_by_fault:
            until = c.ended if c.last_step is None or c.ended is None else c.last_step
            span(end if until is None else until, Phase.PRODUCTIVE)
            span(end, Phase.EXIT)
            break
        train_begin = cursor
        span(fault, Phase.PRODUCTIVE)
        after = cycles[i + 1] if i + 1 < len(cycles) else None
        restored_from = None if after is None else after.restored_from
        if (
            after is not None
            and after.restored_t is not None
            and (after.restored_iteration is not None)
        ):  # the state the next cycle restored was the checkpoint in force
            mark = CheckpointMark(min(after.restored_t, cursor), after.restored_iteration)
            lost = _lost_work(train_begin, cursor, [mark], history)
        elif restored_from == "none":  # restored nothing: the cycle's training is lost
            lost = cursor - train_begin
        else:
            lost = _lost_work(train_begin, cursor, marks, history)
        if lost is None:
            unknown.append(f"cycle {c.cycle}: recomputed work")
        elif lost > 0:
            seconds[Phase.PRODUCTIVE] -= lost
            seconds[Phase.RECOMPUTED] += lost
            by_cause[cause] = by_cause.get(cause, 0.0) + lost
            productive[-1] = (productive[-1][0], productive[-1][1] - lost)
        detection = span(c.noticed, Phase.DETECTION, cause)
        stop = span(c.stopped, Phase.STOP, cause)
        if c.action != "restart":
            span(end, Phase.EXIT)
            break
        pending = {
            "from_cycle": c.cycle,
            "cycle": c.cycle + 1,
            "cause": cause,
            "fault": fault,
            "detection_s": detection,
            "stop_s": stop,
            "rendezvous_s": span(c.rendezvous_done, Phase.RENDEZVOUS, cause),
            "recomputed_s": lost,
            "restored_from": restored_from,
            "restored_iteration": None if after is None else after.restored_iteration,
        }
        if i + 1 == len(cycles):  # the job ended during this restart
            costs.append(RestartCost(spawn_s=0.0, first_step_s=None, **pending))
            span(end, Phase.EXIT)
    if not cycles:
        span(end, Phase.STARTUP)
    wait = 0.0
    for w in _union([*tl.straggler, *straggler]):  # overlapping reports count once
        for a, b in productive:
            wait += max(0.0, min(b, w.end) - max(a, w.start)) * w.fraction
    wait = min(wait, seconds[Phase.PRODUCTIVE])
    seconds[Phase.PRODUCTIVE] -= wait
    seconds[Phase.STRAGGLER_WAIT] += wait
    return Goodput(
        start=start,
        end=end,
        nodes=len(tl.nodes),
        seconds=seconds,
        by_cause=by_cause,
        restarts=tuple(costs),
        unknown=tuple(unknown),
    )


#: Records after which a restart's cost may be complete.
_COST_EVENTS = frozenset(
    {names.FIRST_STEP, names.DECISION, names.ALL_NODES_FINISHED, names.FINISHED}
)


class Ledger:
    """The agent's running account: it is fed each journal record and says when each
    restart's cost is complete, so the agent writes it once, as one journal line."""

    def __init__(self) -> None:
        self._records: list[Mapping[str, Any]] = []
        self._written: set[int] = set()

    def feed(self, record: Mapping[str, Any]) -> list[RestartCost]:
        """Add ``record``; the restart costs it completes (each returned once).

        A cost is complete at the new cycle's first step, or, without ``first_step``
        records, when that cycle ends or the launcher finishes (first step unknown).
        """
        self._records.append(dict(record))
        kind = record.get("event")
        if kind not in _COST_EVENTS:
            return []
        ended = {
            r.get("cycle")
            for r in self._records
            if r.get("event") in (names.DECISION, names.ALL_NODES_FINISHED)
        }
        out = []
        for cost in account(self._records).restarts:
            done = cost.first_step_s is not None or cost.cycle in ended or kind == names.FINISHED
            if done and cost.from_cycle not in self._written:
                self._written.add(cost.from_cycle)
                out.append(cost)
        return out

    def summary(self, now: float | None = None) -> Goodput:
        """This node's account so far (``now``: the job has not finished)."""
        return account(self._records, now=now)

    def timeline(self) -> Timeline:
        """This node's timeline, to publish to the node that writes the job summary."""
        return Timeline.from_records(self._records)


if __name__ == "__main__":  # python -m nvrx.launcher.goodput (the CLI lives apart)
    from nvrx.launcher._goodput_cli import main

    sys.exit(main())
