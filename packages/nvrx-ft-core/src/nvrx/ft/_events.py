"""Events a monitor sends to its launcher: one JSON object per Unix datagram.

See ``docs/design/launcher-monitor-contract.md``. This module is the contract, written
once for both sides: one type per kind of event (:class:`RankConnected`,
:class:`RankDisconnected`, :class:`RankTerminated`, :class:`RankFirstStep`,
:class:`WorkloadRequest`, each a :class:`RankEvent`), encoded by :func:`encode_event`
and parsed, validated, once by :func:`parse_event`. The monitor sends with
:class:`EventSender`, which never blocks and logs a failed send once; the launcher reads
with :func:`parse_event` and dispatches on the type.

:class:`MonitorEvent` and :func:`parse_monitor_event` are the public, flat view of the
same datagrams (every kind's fields in one class, ``event`` naming the kind), for code
outside nvrx that reads the stream; they encode and parse through the functions here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import socket
from typing import Any, ClassVar

from nvrx.ft._flight import CollectiveState
from nvrx.ft._stacks import StackSummary

__all__ = [
    "EVENT_CAUSES",
    "EVENT_KINDS",
    "EVENT_VERSION",
    "FIRST_STEP_VIA",
    "MAX_EVENT_BYTES",
    "PROC_STATES",
    "RANK_CONNECTED",
    "RANK_DISCONNECTED",
    "RANK_FIRST_STEP",
    "RANK_TERMINATED",
    "WORKLOAD_CONTROL",
    "EventSender",
    "MonitorEvent",
    "RankConnected",
    "RankDisconnected",
    "RankEvent",
    "RankFirstStep",
    "RankTerminated",
    "WorkloadRequest",
    "encode_event",
    "parse_event",
    "parse_monitor_event",
]

EVENT_VERSION = 1
#: The kinds of monitor event (their ``event`` field); readers compare with these.
RANK_CONNECTED = "rank_connected"
RANK_DISCONNECTED = "rank_disconnected"
RANK_FIRST_STEP = "rank_first_step"
RANK_TERMINATED = "rank_terminated"
WORKLOAD_CONTROL = "workload_control"
EVENT_KINDS = frozenset(
    {RANK_CONNECTED, RANK_DISCONNECTED, RANK_FIRST_STEP, RANK_TERMINATED, WORKLOAD_CONTROL}
)
EVENT_CAUSES = frozenset(
    {
        "initial_heartbeat_timeout",
        "heartbeat_timeout",
        "section_timeout",
        "out_of_section_timeout",
        "gpu_health",
        "nic_health",
    }
)
_ACTIONS = frozenset({"Continue", "ExcludeThisNode", "ShutdownWorkload"})
#: Largest event datagram. A monitor refuses (does not acknowledge) a request whose
#: event would be larger; the launcher reads datagrams of up to this size.
MAX_EVENT_BYTES = 16 * 1024
_NUMBERS = ("observed_s", "limit_s", "last_activity_s", "last_activity_wall", "last_heartbeat_s")
_MAX_OPEN_SECTIONS = 64
#: The scheduler states /proc/<pid>/stat reports (Linux 2.6+, with the historical ones).
PROC_STATES = frozenset("RSDTtZXxKWPI")
#: How rank_first_step saw the first iteration end.
FIRST_STEP_VIA = frozenset({"heartbeat", "section"})
#: Latest wall time accepted (year 2242): a larger value is garbage, not a time.
#: Largest wall-clock time (seconds since the epoch) a file or event may carry.
MAX_WALL_S = float(2**33)
_MAX_WALL = MAX_WALL_S


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankEvent:
    """What every monitor event says: which rank (local and global) and its pid.

    ``EVENT`` is the kind's name on the wire (the datagram's ``event`` field).
    """

    EVENT: ClassVar[str] = ""
    local_rank: int
    rank: int
    #: The rank's own pid (the monitor's socket peer).
    pid: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankConnected(RankEvent):
    """The rank connected to its monitor (``init_workload_monitoring``)."""

    EVENT: ClassVar[str] = RANK_CONNECTED


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankDisconnected(RankEvent):
    """The monitor stopped watching the rank (it shut monitoring down, or exited)."""

    EVENT: ClassVar[str] = RANK_DISCONNECTED


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankTerminated(RankEvent):
    """The monitor found the rank hung (or unhealthy) and is terminating it.

    The fields after ``message`` are the hang evidence (additive within v1; absent from
    older monitors). Fields are in their wire order.
    """

    EVENT: ClassVar[str] = RANK_TERMINATED
    #: One of :data:`EVENT_CAUSES`.
    cause: str
    section: str | None = None
    observed_s: float | None = None
    limit_s: float | None = None
    message: str
    #: seconds from the rank's last heartbeat or section open/close to the detection.
    last_activity_s: float | None = None
    #: the same moment as a wall-clock time (seconds since the epoch), comparable across nodes.
    last_activity_wall: float | None = None
    #: seconds from the rank's last heartbeat to the detection (None: it never sent one).
    last_heartbeat_s: float | None = None
    #: the sections open at detection.
    open_sections: tuple[str, ...] | None = None
    #: where the rank's training thread was, from its stack dump (None: no dump read).
    stack: StackSummary | None = None
    #: the rank's state letter in /proc/<pid>/stat just before the monitor signalled it:
    #: "T" stopped (SIGSTOP: not waiting on anyone), "D" in uninterruptible I/O, "S"
    #: sleeping (waiting, e.g. in a collective), "R" running. None: not read.
    proc_state: str | None = None
    #: the rank's latest collective in torch's flight recorder, read before the monitor
    #: signalled it (None: not read, e.g. a stopped rank or no flight-recorder server).
    collective: CollectiveState | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankFirstStep(RankEvent):
    """The rank finished its first iteration after init (sent once per init)."""

    EVENT: ClassVar[str] = RANK_FIRST_STEP
    #: wall time (seconds since the epoch) the rank finished its first iteration.
    step_wall: float
    #: seconds from the rank's init_workload_monitoring to that moment.
    since_init_s: float
    #: what showed it: "heartbeat" (the first heartbeat) or "section" (the first ``step`` end).
    via: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkloadRequest(RankEvent):
    """The rank asked its launcher to act (a ``WorkloadControlRequest``)."""

    EVENT: ClassVar[str] = WORKLOAD_CONTROL
    #: ``Continue``, ``ExcludeThisNode`` or ``ShutdownWorkload``.
    action: str
    description: str


#: Each kind's type, by its wire name.
_TYPES: dict[str, type[RankEvent]] = {
    t.EVENT: t
    for t in (RankConnected, RankDisconnected, RankTerminated, RankFirstStep, WorkloadRequest)
}


def encode_event(event: RankEvent) -> bytes:
    """The datagram of ``event``: the common fields, then the kind's (``None`` left out).

    ValueError when it would exceed :data:`MAX_EVENT_BYTES` or is not valid UTF-8.
    """
    body: dict[str, Any] = {
        "event": event.EVENT,
        "local_rank": event.local_rank,
        "rank": event.rank,
        "pid": event.pid,
        "v": EVENT_VERSION,
    }
    body.update(
        (key, value)
        for key, value in dataclasses.asdict(event).items()
        if key not in body and value is not None
    )
    data = json.dumps(body, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    encoded = data.encode("utf-8")  # a lone surrogate is a UnicodeEncodeError (ValueError)
    if len(encoded) > MAX_EVENT_BYTES:
        raise ValueError(f"{event.EVENT} event of {len(encoded)} bytes exceeds {MAX_EVENT_BYTES}")
    return encoded


@dataclasses.dataclass(frozen=True)
class MonitorEvent:
    """One event from a rank monitor, flat. Fields beyond the common five depend on ``event``.

    ``rank_first_step`` is sent once per rank init, when the rank finished its first
    iteration (``step_wall``, ``since_init_s``, ``via``); ``rank_terminated`` carries the
    cause and the hang evidence. The public view of the per-kind types (:meth:`of`,
    :meth:`typed`); their fields are its fields of the same names.
    """

    event: str
    local_rank: int
    rank: int
    pid: int
    v: int = EVENT_VERSION
    cause: str | None = None
    section: str | None = None
    observed_s: float | None = None
    limit_s: float | None = None
    message: str | None = None
    action: str | None = None
    description: str | None = None
    # Hang evidence (rank_terminated, additive within v1; absent from older monitors):
    #: seconds from the rank's last heartbeat or section open/close to the detection.
    last_activity_s: float | None = None
    #: the same moment as a wall-clock time (seconds since the epoch), comparable across nodes.
    last_activity_wall: float | None = None
    #: seconds from the rank's last heartbeat to the detection (None: it never sent one).
    last_heartbeat_s: float | None = None
    #: the sections open at detection.
    open_sections: tuple[str, ...] | None = None
    #: where the rank's training thread was, from its stack dump (None: no dump read).
    stack: StackSummary | None = None
    #: the rank's state letter in /proc/<pid>/stat just before the monitor signalled it:
    #: "T" stopped (SIGSTOP: not waiting on anyone), "D" in uninterruptible I/O, "S"
    #: sleeping (waiting, e.g. in a collective), "R" running. None: not read.
    proc_state: str | None = None
    #: the rank's latest collective in torch's flight recorder, read before the monitor
    #: signalled it (None: not read, e.g. a stopped rank or no flight-recorder server).
    collective: CollectiveState | None = None
    # rank_first_step (additive within v1):
    #: wall time (seconds since the epoch) the rank finished its first iteration after init.
    step_wall: float | None = None
    #: seconds from the rank's init_workload_monitoring to that moment.
    since_init_s: float | None = None
    #: what showed it: "heartbeat" (the first heartbeat) or "section" (the first ``step`` end).
    via: str | None = None

    @classmethod
    def of(cls, event: RankEvent) -> MonitorEvent:
        """The flat view of a typed event (every field by its name)."""
        fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
        return cls(event=event.EVENT, **fields)

    def typed(self) -> RankEvent:
        """This event as its kind's type (fields of other kinds left out).

        ValueError for an unknown ``event``.
        """
        kind = _TYPES.get(self.event)
        if kind is None:
            raise ValueError(f"unknown event {self.event!r}")
        return kind(**{f.name: getattr(self, f.name) for f in dataclasses.fields(kind)})

    def to_bytes(self) -> bytes:
        """The datagram for this event (:func:`encode_event` of :meth:`typed`)."""
        return encode_event(self.typed())


def _require(cond: bool, why: str) -> None:
    if not cond:
        raise ValueError(f"bad monitor event: {why}")


def parse_event(data: bytes) -> RankEvent:
    """Validate and parse one datagram into its kind's type; a ValueError says what is
    wrong with it."""
    try:
        return _parse_event(data)
    except TypeError as exc:  # e.g. an unhashable value tested against a set of names
        raise ValueError(f"bad monitor event: {exc}") from None


def parse_monitor_event(data: bytes) -> MonitorEvent:
    """Validate and parse one datagram (the flat view: :func:`parse_event`, then
    :meth:`MonitorEvent.of`); a ValueError says what is wrong with it."""
    return MonitorEvent.of(parse_event(data))


def _parse_event(data: bytes) -> RankEvent:
    _require(len(data) <= MAX_EVENT_BYTES, f"{len(data)} bytes is too long")
    try:
        body = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("bad monitor event: nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"bad monitor event: not UTF-8 JSON ({exc})") from None
    _require(isinstance(body, dict), "not a JSON object")
    assert isinstance(body, dict)
    _require(body.get("v") == EVENT_VERSION, f"version {body.get('v')!r} is not {EVENT_VERSION}")
    kind = body.get("event")
    _require(kind in EVENT_KINDS, f"unknown event {kind!r}")
    assert isinstance(kind, str)
    for key in ("local_rank", "rank", "pid"):
        value = body.get(key)
        _require(
            isinstance(value, int) and not isinstance(value, bool), f"{key}={value!r} not an int"
        )
    allowed = {"v", "event", "local_rank", "rank", "pid"}
    if kind == RANK_TERMINATED:
        allowed |= {"cause", "section", "message", *_NUMBERS, "open_sections", "stack"}
        allowed |= {"proc_state", "collective"}
        state = body.get("proc_state")
        _require(state is None or state in PROC_STATES, f"proc_state={state!r} is not a state")
        _require(body.get("cause") in EVENT_CAUSES, f"unknown cause {body.get('cause')!r}")
        _require(isinstance(body.get("message"), str), "message is not a string")
        _require(body.get("section") is None or isinstance(body["section"], str), "bad section")
        for key in _NUMBERS:
            value = body.get(key)
            _require(
                value is None
                or (
                    isinstance(value, (int, float))
                    and not isinstance(value, bool)
                    and math.isfinite(value)
                ),
                f"{key}={value!r} is not a number",
            )
        sections = body.get("open_sections")
        _require(
            sections is None
            or (
                isinstance(sections, list)
                and len(sections) <= _MAX_OPEN_SECTIONS
                and all(isinstance(s, str) for s in sections)
            ),
            f"open_sections={sections!r} is not a list of names",
        )
    elif kind == RANK_FIRST_STEP:
        allowed |= {"step_wall", "since_init_s", "via"}
        _require(body.get("via") in FIRST_STEP_VIA, f"via={body.get('via')!r} is not known")
        for key, high in (("step_wall", _MAX_WALL), ("since_init_s", _MAX_WALL)):
            value = body.get(key)
            _require(
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and 0 <= value <= high,
                f"{key}={value!r} is not a time",
            )
    elif kind == WORKLOAD_CONTROL:
        allowed |= {"action", "description"}
        _require(body.get("action") in _ACTIONS, f"unknown action {body.get('action')!r}")
        _require(isinstance(body.get("description"), str), "description is not a string")
    extra = sorted(set(body) - allowed)
    _require(not extra, f"unexpected fields {extra} for {kind}")
    fields: dict[str, Any] = {k: v for k, v in body.items() if k not in ("v", "event")}
    for key in (*_NUMBERS, "step_wall", "since_init_s"):
        if fields.get(key) is not None:
            fields[key] = float(fields[key])
    if fields.get("open_sections") is not None:
        fields["open_sections"] = tuple(fields["open_sections"])
    if fields.get("stack") is not None:
        try:
            fields["stack"] = StackSummary.from_json(fields["stack"])
        except ValueError as exc:
            raise ValueError(f"bad monitor event: {exc}") from None
    if fields.get("collective") is not None:
        try:
            fields["collective"] = CollectiveState.from_json(fields["collective"])
        except ValueError as exc:
            raise ValueError(f"bad monitor event: {exc}") from None
    return _TYPES[kind](**fields)


class EventSender:
    """Sends events to the launcher's datagram socket without ever blocking."""

    def __init__(self, path: str | os.PathLike[str] | None, logger: logging.Logger) -> None:
        self._path = None if path is None else os.fspath(path)
        self._logger = logger
        self._warned = False
        self._sock: socket.socket | None = None
        if self._path is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)

    @property
    def enabled(self) -> bool:
        """True when a launcher listens for events."""
        return self._sock is not None

    def send(self, event: RankEvent) -> bool:
        """Send one event; a failure is logged once and the event dropped."""
        if self._sock is None or self._path is None:
            return False
        try:
            self._sock.sendto(encode_event(event), self._path)
        except (OSError, ValueError) as exc:
            if not self._warned:
                self._warned = True
                self._logger.warning(
                    "could not send %s event to %s (%s); further failures are not logged",
                    event.EVENT,
                    self._path,
                    exc,
                )
            return False
        return True

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
