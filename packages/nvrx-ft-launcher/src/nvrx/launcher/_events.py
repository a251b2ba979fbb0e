"""The launcher's events: one typed record per fact, and the one recorder that writes them.

Every fact the launcher reports about a run is one of the dataclasses below, written once
to the journal (``--ft-journal``) by :class:`Recorder`. The cycle log
(``--ft-cycle-log``: one record per cycle end) is not written separately: the recorder
derives each of its records from the journal events that end a cycle
(:class:`CycleLogDeriver`), and ``CycleLogDeriver`` applied to a journal file offline gives the same
records. The record formats are versioned and described by the JSON Schemas in
``schemas/`` (see :mod:`.journal`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from nvrx.ft._events import RankEvent

from . import _event_names as names
from .goodput import RestartCost
from .journal import JsonLines

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")


E = TypeVar("E", bound="Event")


@dataclasses.dataclass(frozen=True)
class Event:
    """Base of every journal event; ``EVENT`` is its ``event`` field."""

    EVENT: ClassVar[str] = ""

    def to_record(self) -> dict[str, Any]:
        """The journal's JSON object (``schema_version``, ``t`` and ``node`` come later)."""
        return {"event": self.EVENT, **dataclasses.asdict(self)}


def _json_value(value: Any) -> Any:
    """A monitor event's field as a journal record holds it (JSON types only)."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return list(value)
    return value


def from_monitor_event(kind: type[E], cycle: int, event: RankEvent) -> E:
    """The journal event ``kind`` of a monitor's ``event`` in ``cycle``.

    Every field of ``kind`` but ``cycle`` is the monitor event's field of that name (its
    JSON form), so a field added to both needs no copying by hand
    (``tests/test_monitor_events.py`` checks each such kind against its monitor type).
    """
    values = {
        field.name: _json_value(getattr(event, field.name))
        for field in dataclasses.fields(kind)
        if field.name != "cycle"
    }
    return kind(cycle=cycle, **values)  # type: ignore[call-arg]  # every such kind has it


@dataclasses.dataclass(frozen=True)
class RunStarted(Event):
    """The launcher starts (once per launcher), with what it was asked to run."""

    EVENT: ClassVar[str] = names.RUN_START
    run_id: str
    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    max_restarts: int
    command: list[str]
    #: Where --ft-metrics-port serves the metrics (None: off).
    metrics_url: str | None


@dataclasses.dataclass(frozen=True)
class Finished(Event):
    """The launcher ends with ``exit_code`` (its last record)."""

    EVENT: ClassVar[str] = names.FINISHED
    exit_code: int
    reason: str


@dataclasses.dataclass(frozen=True)
class RestartCostMeasured(Event):
    """What one restart cost, by phase (:class:`~nvrx.launcher.goodput.RestartCost`)."""

    EVENT: ClassVar[str] = names.RESTART_COST
    cost: RestartCost

    def to_record(self) -> dict[str, Any]:
        """The cost's own fields, flat (as ``python -m nvrx.launcher.goodput`` reads them)."""
        return self.cost.to_record()


@dataclasses.dataclass(frozen=True)
class JobGoodput(Event):
    """The job's goodput account at its end (:meth:`~nvrx.launcher.goodput.Summary.to_json`)."""

    EVENT: ClassVar[str] = names.JOB_GOODPUT
    summary: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class NodeGoodput(Event):
    """This node's goodput account at its end, in a multi-node job."""

    EVENT: ClassVar[str] = names.NODE_GOODPUT
    summary: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class WorkersStarted(Event):
    """This node's ranks of a cycle started."""

    EVENT: ClassVar[str] = names.WORKERS_STARTED
    cycle: int
    restart_count: int
    group_rank: int | None
    group_world_size: int | None
    ranks: dict[int, int]
    pids: dict[int, Any]
    warm_local_ranks: list[int]


@dataclasses.dataclass(frozen=True)
class RankTerminatedByMonitor(Event):
    """A rank's monitor found it hung (or unhealthy) and is terminating it."""

    EVENT: ClassVar[str] = names.RANK_TERMINATED_BY_MONITOR
    cycle: int
    rank: int
    local_rank: int
    pid: int
    cause: str | None
    section: str | None
    observed_s: float | None
    limit_s: float | None
    message: str | None
    # The monitor's evidence for a hang (absent from older monitors' events).
    last_activity_s: float | None = None
    last_activity_wall: float | None = None
    last_heartbeat_s: float | None = None
    open_sections: list[str] | None = None
    stack: dict[str, Any] | None = None
    #: The rank's /proc state letter before its monitor signalled it ("T": stopped).
    proc_state: str | None = None
    #: Its latest collective in torch's flight recorder (op, group, seq, pending).
    collective: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class FirstStep(Event):
    """Every local rank of the cycle finished its first iteration (``rank_first_step``)."""

    EVENT: ClassVar[str] = names.FIRST_STEP
    cycle: int
    #: When the last local rank finished its first iteration (Unix time).
    first_step: float
    #: The longest rank start-up: init_workload_monitoring to its first iteration's end.
    since_init_s: float
    local_ranks: list[int]


@dataclasses.dataclass(frozen=True)
class CycleStarted(Event):
    """The ranks of a cycle are about to be spawned on this node (cycle-info file's start)."""

    EVENT: ClassVar[str] = names.CYCLE_START
    cycle: int
    restart_count: int
    group_rank: int | None
    world_size: int
    #: Local rank -> global rank.
    local_ranks: dict[int, int]
    #: ``[{"node_id": str, "group_rank": int}]`` as known on this node.
    nodes: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class NodeUnhealthy(Event):
    """A health check before a rendezvous failed: this node leaves the job (exit 3)."""

    EVENT: ClassVar[str] = names.NODE_UNHEALTHY
    #: The job cycle it was about to join (0 at start).
    cycle: int
    #: ``[{"check": "storage" | "nic" | "gpu" | "command", "reason": "..."}]``
    failures: list[dict[str, str]]
    #: Checks that could not run here, e.g. ``["gpu: no NVML (...)"]``.
    skipped: list[str]


@dataclasses.dataclass(frozen=True)
class NodeReplaced(Event):
    """A standby node took the place (and group rank) of a node that left the job.

    Journalled by every node that was in the round before, when the cycle starts.
    """

    EVENT: ClassVar[str] = names.NODE_REPLACED
    #: The cycle the standby joins.
    cycle: int
    group_rank: int
    #: The node that left, and the standby now in its place (host:pid:random).
    replaced_node: str
    by_node: str


@dataclasses.dataclass(frozen=True)
class CheckpointRestored(Event):
    """What this node's ranks restored at the start of a cycle (their restore records).

    From ``nvrx.ft.checkpointing.local``: one record per cycle and node, once every
    local rank wrote its record (or at the first step, with those that did).
    """

    EVENT: ClassVar[str] = names.CHECKPOINT_RESTORED
    cycle: int
    #: The node's source: ``own``, ``peer``, ``global`` or ``none`` (the first of these
    #: in the order global, none, peer, own that any local rank reports).
    source: str
    #: The restored iteration (the lowest over the local ranks; None: not said).
    iteration: int | None
    #: When the restored snapshot's state was taken (Unix time; None: not a snapshot).
    snapshot_wall: float | None
    #: The longest restore of a local rank (agreement, fetch, load), seconds.
    restore_s: float
    #: Local rank -> its source.
    ranks: dict[int, str]


@dataclasses.dataclass(frozen=True)
class SegmentLeft(Event):
    """This node's segment lost a node: it leaves the job (exit 3) with its segment.

    --ft-segment: a job runs on whole segments only; a complete standby segment takes
    the broken one's place at the restart.
    """

    EVENT: ClassVar[str] = names.SEGMENT_LEFT
    #: The segment (NVLink domain id, or NVRX_SEGMENT_ID).
    segment: str
    #: Why, e.g. "1 of its 2 nodes did not come back to the restart".
    reason: str
    #: The segment's nodes that did come back (host:pid:random), this one included.
    nodes: list[str]


@dataclasses.dataclass(frozen=True)
class GpuMemoryReclaim(Event):
    """After a cycle's ranks stopped, before the next start: did the GPU memory come back."""

    EVENT: ClassVar[str] = names.GPU_MEMORY_RECLAIM
    #: The cycle about to start.
    cycle: int
    #: False: timed out.
    reclaimed: bool
    waited_s: float
    #: Per GPU index at the last poll.
    used_mb: dict[int, float]
    #: Per GPU index before the first start.
    baseline_mb: dict[int, float]
    #: ``[{"pid": int, "name": str, "gpu": int, "used_mb": float}]``
    leftover: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class NumaBinding(Event):
    """How the ranks of a start were bound to NUMA nodes (NVRX_GPUS_PER_NUMA set)."""

    EVENT: ClassVar[str] = names.NUMA_BINDING
    cycle: int
    #: ``numactl``, ``sched_setaffinity`` or ``none``.
    method: str
    #: --ft-numa-bind-strict.
    strict: bool
    #: Local rank -> NUMA node (None: not bound).
    nodes: dict[int, int | None]
    #: Why nothing was bound (e.g. one NUMA node).
    reason: str | None


@dataclasses.dataclass(frozen=True)
class HangAttributed(Event):
    """Which rank of a hang is the likely culprit and which waited on it (or undecided)."""

    EVENT: ClassVar[str] = names.HANG_ATTRIBUTED
    cycle: int
    culprit: int | None
    victims: list[int]
    basis: list[str]
    reason: str
    sentence: str
    #: The collective the other ranks wait in: op, group and seq (None: unknown).
    collective: dict[str, Any] | None = None
    #: Where the culprit was instead ('in broadcast #5 on default_pg at train.py:40 (main)').
    culprit_frame: str | None = None


@dataclasses.dataclass(frozen=True)
class WorkloadControl(Event):
    """A rank asked to exclude its node or to shut the workload down."""

    EVENT: ClassVar[str] = names.WORKLOAD_CONTROL
    cycle: int
    rank: int
    local_rank: int
    pid: int
    action: str | None
    description: str | None


@dataclasses.dataclass(frozen=True)
class MonitorDied(Event):
    """A rank monitor died and is being replaced."""

    EVENT: ClassVar[str] = names.MONITOR_DIED
    cycle: int
    local_rank: int
    exit_code: int | None
    rank_was_connected: bool


@dataclasses.dataclass(frozen=True)
class RankFailed(Event):
    """A rank failed: how it ended, what its monitor found, its own traceback."""

    EVENT: ClassVar[str] = names.RANK_FAILED
    cycle: int
    rank: int
    local_rank: int
    pid: int
    exit_code: int | None
    signal: str | None
    monitor_cause: str | None
    section: str | None
    observed_s: float | None
    limit_s: float | None
    root_cause: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class ProgressMoved(Event):
    """The value in --ft-progress-file changed (read at most once a second)."""

    EVENT: ClassVar[str] = names.PROGRESS
    cycle: int
    value: int
    #: The file's modification time (Unix time): when the training saved that state.
    saved: float | None


@dataclasses.dataclass(frozen=True)
class StragglerReported(Event):
    """Rank 0 published a straggler report (``NVRX_STRAGGLER_SCORES_FILE``, read once a second).

    The goodput takes ``wait_fraction`` of the productive time in the window as straggler
    wait; the metrics' ``nvrx_straggler_score`` gauges hold the per-rank scores.
    """

    EVENT: ClassVar[str] = names.STRAGGLER_REPORT
    cycle: int
    #: When rank 0 wrote the report (Unix time).
    written_at: float
    #: The report's window (Unix times); None where the report did not say.
    window_start: float | None
    window_end: float | None
    #: Share of each step the median rank waited for the slowest one's forward section:
    #: (max - median) / step of the ranks' ``forward_section`` medians over the median
    #: ``step_section`` (whole step) time; without step times 1 - median / max of the
    #: forward medians. None without forward times for two ranks or a window.
    wait_fraction: float | None
    #: The sections whose medians give the forward and the whole-step times (None: none).
    forward_section: str | None
    step_section: str | None
    #: Ranks in the report.
    ranks: int
    #: The rank with the lowest relative score (GPU where known, else its worst section).
    worst_rank: int | None
    worst_score: float | None


@dataclasses.dataclass(frozen=True)
class StragglerReportIgnored(Event):
    """The straggler-scores file could not be used (journaled once per version of the file).

    The log says so once per launcher (WARNING; later ones at DEBUG).
    """

    EVENT: ClassVar[str] = names.STRAGGLER_REPORT_IGNORED
    cycle: int
    path: str
    why: str


@dataclasses.dataclass(frozen=True)
class StoreValueIgnored(Event):
    """A value in the rendezvous store was malformed or not signed with the job key."""

    EVENT: ClassVar[str] = names.STORE_VALUE_IGNORED
    cycle: int
    key: str
    why: str


@dataclasses.dataclass(frozen=True)
class DecisionTaken(Event):
    """The job-wide decision this node follows at the end of a cycle."""

    EVENT: ClassVar[str] = names.DECISION
    cycle: int
    #: ``restart``, ``stop``, ``shutdown`` or ``exclude`` (this node leaves).
    action: str
    reason: str
    decided_by: str
    charged: bool
    restart_count: int
    restarts_charged: int
    #: The launcher's exit code; None for a restart.
    exit_code: int | None
    #: When this node noticed the cycle's end (Unix time).
    failure_noticed: float
    #: What ended the cycle: ``failure``, ``exclude_request``, ``shutdown_request`` or
    #: ``nodes_waiting`` (:class:`~nvrx.launcher._policy.Trigger`).
    trigger: str


@dataclasses.dataclass(frozen=True)
class WorkersStopped(Event):
    """This node's ranks were stopped after a decision."""

    EVENT: ClassVar[str] = names.WORKERS_STOPPED
    cycle: int
    workers_stopped: float


@dataclasses.dataclass(frozen=True)
class Restarted(Event):
    """This node restarted its ranks: phases in seconds, times as Unix time."""

    EVENT: ClassVar[str] = names.RESTART
    from_cycle: int
    cycle: int
    charged: bool
    detect_s: float | None
    stop_s: float
    rendezvous_s: float
    spawn_s: float
    total_s: float
    failure_noticed: float
    workers_stopped: float
    rendezvous_done: float
    workers_started: float


@dataclasses.dataclass(frozen=True)
class RestartFailed(Event):
    """The re-rendezvous of a restart failed; the launcher ends."""

    EVENT: ClassVar[str] = names.RESTART_FAILED
    cycle: int
    error: str


@dataclasses.dataclass(frozen=True)
class AllNodesFinished(Event):
    """Every node's ranks finished the cycle successfully."""

    EVENT: ClassVar[str] = names.ALL_NODES_FINISHED
    cycle: int


class CycleLogDeriver:
    """Derives the cycle log's records from journal records, one cycle end at a time."""

    def __init__(self) -> None:
        self._decision: dict[str, Any] | None = None
        # Whether a cycle record said how this launcher ends (stop, shutdown, exclude,
        # finish); if none did, its ``finished`` record gives the final ``stop``.
        self._ended = False

    def feed(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The cycle record that ``record`` completes, if any."""
        kind = record.get("event")
        if kind == Finished.EVENT:
            if self._ended:
                return None
            stop = {"action": "stop", "exit_code": record["exit_code"], "reason": record["reason"]}
            return self._out(record, stop)
        if kind == DecisionTaken.EVENT:
            self._decision = {
                "cycle": record["cycle"],
                "action": record["action"],
                "reason": record["reason"],
                "decided_by": record["decided_by"],
                "charged": record["charged"],
                "failure_noticed": record["failure_noticed"],
            }
            if record["action"] != "restart":
                self._decision["exit_code"] = record["exit_code"]
            return None
        if kind == AllNodesFinished.EVENT:
            return self._out(record, {"cycle": record["cycle"], "action": "finish"}, "finished")
        decision = self._decision
        if decision is None or record.get("cycle", record.get("from_cycle")) is None:
            return None
        if kind == WorkersStopped.EVENT:
            decision["workers_stopped"] = record["workers_stopped"]
            if decision["action"] != "restart":
                return self._out(record, decision)
        elif kind == RestartFailed.EVENT:
            return self._out(record, dict(decision, failed=record["error"]))
        elif kind == Restarted.EVENT:
            times = {k: record[k] for k in ("rendezvous_done", "workers_started")}
            return self._out(record, dict(decision, **times))
        return None

    def _out(
        self, record: dict[str, Any], cycle: dict[str, Any], t_as: str | None = None
    ) -> dict[str, Any]:
        self._decision = None
        self._ended = self._ended or cycle["action"] != "restart"
        out = dict(cycle)
        if t_as is not None:
            out[t_as] = record["t"]
        for name in ("schema_version", "t", "node"):
            if name in record:
                out[name] = record[name]
        return out


#: A subscriber of the bus: called with each event and its journal record (stamped with
#: ``schema_version``, ``t`` and ``node``), before the record is written.
Subscriber = Callable[[Event, dict[str, Any]], None]


class Recorder:
    r"""The launcher's event bus: every fact is published here once, as a typed event.

    Its own sinks are the journal (each event's record) and the cycle log (the records
    :class:`CycleLogDeriver` derives from them); everything else that follows the facts
    (the cycle-info file, the goodput ledger, the metrics) :meth:`subscribe`\ s. A
    subscriber runs before the event's journal line is written, in subscription order,
    so what it publishes in turn (a ``restart_cost``) is journalled first; what it
    raises is logged once and otherwise ignored (following the facts never stops the
    launcher).
    """

    def __init__(self, journal: JsonLines, cycle_log: JsonLines) -> None:
        self._journal = journal
        self._cycle_log = cycle_log
        self._cycles = CycleLogDeriver()
        self._subscribers: list[Subscriber] = []
        self._subscriber_warned = False

    @property
    def journal(self) -> JsonLines:
        """Where the events go (its ``node`` names this launcher in every record)."""
        return self._journal

    def set_node(self, node: str) -> None:
        """Name this launcher in every later journal and cycle record."""
        self._journal.node = self._cycle_log.node = node

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call ``subscriber`` with every later event (after those subscribed before)."""
        self._subscribers.append(subscriber)

    def record(self, event: Event) -> None:
        """Publish ``event``: subscribers, the journal, the cycle log; never raises for I/O."""
        record = event.to_record()
        record["t"] = time.time()  # wall clock: label
        self._journal.stamp(record)
        for subscriber in self._subscribers:
            try:
                subscriber(event, record)
            except Exception as exc:  # following the facts never stops the launcher
                if not self._subscriber_warned:
                    self._subscriber_warned = True
                    logger.warning("journal subscriber failed: %r (further errors not logged)", exc)
        self._journal.write(record)
        cycle = self._cycles.feed(record)
        if cycle is not None:
            self._cycle_log.write(cycle)
