"""The cycle-info file: which restart cycle a rank runs in, written by the launcher.

One definition of the format, used by both sides: ft_launcher writes a :class:`CycleInfo`
with :func:`write_cycle_info` at each cycle's start and end and gives the ranks its path
in ``NVRX_CURRENT_CYCLE_INFO`` (NVRx's variable); training code, dashboards and the
Lightning callbacks read it with :func:`read_cycle_info`, which never raises: the file
comes from outside the rank, so every field's type and range is checked, and a file that
cannot be used is one WARNING and ``None``. The JSON Schema of the file ships beside this
module (:func:`cycle_info_schema_path`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any

from nvrx.ft._events import MAX_WALL_S as _MAX_WALL
from nvrx.ft._files import write_file_atomically
from nvrx.ft._formats.checks import MAX_SPAN_S as _MAX_SPAN_S
from nvrx.ft._formats.checks import check_schema_version as _check_schema_version
from nvrx.ft._formats.checks import exact_object as _object
from nvrx.ft._formats.checks import fail as _fail
from nvrx.ft._formats.checks import integer as _int
from nvrx.ft._formats.checks import number as _number
from nvrx.ft._formats.checks import sequence as _sequence
from nvrx.ft._formats.checks import text as _text
from nvrx.ft._json_files import read_json_file

__all__ = [
    "CYCLE_INFO_ENV",
    "CYCLE_INFO_SCHEMA_VERSION",
    "MAX_CYCLE_INFO_BYTES",
    "CycleGoodput",
    "CycleInfo",
    "CycleNode",
    "cycle_info_schema_path",
    "read_cycle_info",
    "write_cycle_info",
]

#: The variable that gives a rank its cycle-info file's path (NVRx 0.7's name).
CYCLE_INFO_ENV = "NVRX_CURRENT_CYCLE_INFO"
#: The format's version; a reader refuses any other (new fields bump it).
CYCLE_INFO_SCHEMA_VERSION = 1
#: Largest file read: room for ~100,000 nodes and a million ranks with exit codes.
MAX_CYCLE_INFO_BYTES = 32 * 1024 * 1024

_logger = logging.getLogger("nvrx.ft.cycle_info")

_MAX_NODES = 100_000
_MAX_RANKS = 1 << 20
_MAX_ID_CHARS = 255
_MAX_TEXT_CHARS = 4096
#: Wall times are seconds since the epoch; beyond this (year 2242) a value is garbage.
#: Exit codes as torch reports them: 0-255, or minus the signal number.
_EXIT_CODE_RANGE = (-255, 255)
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,9}")


@dataclasses.dataclass(frozen=True)
class CycleNode:
    """One node (one ft_launcher) taking part in a cycle."""

    #: the node's id as the launcher names it (its rendezvous id, usually the host name).
    node_id: str
    #: the node's group rank in this cycle.
    group_rank: int

    def __post_init__(self) -> None:
        _text("node_id", self.node_id, _MAX_ID_CHARS, empty=False)
        _int("group_rank", self.group_rank)


@dataclasses.dataclass(frozen=True)
class CycleGoodput:
    """The job's goodput so far, as the launcher accounts it when it writes the file."""

    #: seconds of productive training since the job started.
    productive_s: float
    #: wall-clock seconds since the job started.
    wall_s: float
    #: effective training time ratio, productive over wall (0-1; the launcher's account).
    ettr: float

    def __post_init__(self) -> None:
        wall = _number("goodput.wall_s", self.wall_s, 0.0, _MAX_SPAN_S)
        productive = _number("goodput.productive_s", self.productive_s, 0.0, _MAX_SPAN_S)
        if productive > wall * (1 + 1e-9) + 1e-6:
            _fail("goodput.productive_s", productive, f"more than wall_s ({wall})")
        _number("goodput.ettr", self.ettr, 0.0, 1.0)
        object.__setattr__(self, "wall_s", wall)
        object.__setattr__(self, "productive_s", productive)
        object.__setattr__(self, "ettr", float(self.ettr))


@dataclasses.dataclass(frozen=True)
class CycleInfo:
    """One restart cycle of a job: what ``NVRX_CURRENT_CYCLE_INFO`` points to.

    Constructing one validates every field (``ValueError`` names the field and value),
    so a launcher cannot write a file that a reader would refuse.
    """

    #: the launcher's job id (``--ft-cycle-info-job-id``, else the scheduler's job id; may be "").
    job_id: str
    #: the cycle number: 0 for the first start, one more at each restart of the workers.
    cycle: int
    #: restarts of the workers so far in this job (TORCHELASTIC_RESTART_COUNT's value).
    restart_count: int
    #: when the cycle's workers started, seconds since the epoch.
    started_at: float
    #: the scheduler's requeue count (NVRx's attempt_index: SLURM_RESTART_CNT), 0 if none.
    attempt: int = 0
    #: when the cycle ended (its workers stopped), seconds since the epoch; None while it runs.
    ended_at: float | None = None
    #: why the restart that began this cycle happened (the journal's restart cause);
    #: None for the first cycle.
    cause: str | None = None
    #: the nodes taking part, with their group ranks.
    nodes: tuple[CycleNode, ...] = ()
    #: node ids waiting as standby (hot spare) nodes in this cycle.
    standby_nodes: tuple[str, ...] = ()
    #: the global ranks running in this cycle.
    ranks: tuple[int, ...] = ()
    #: each rank's exit code once the cycle ended (negative: killed by that signal);
    #: None while it runs.
    exit_codes: Mapping[int, int] | None = None
    #: this cycle's application log file (per-cycle logs), if the launcher writes one.
    log_file: str | None = None
    #: the job's goodput so far, if the launcher accounts it.
    goodput: CycleGoodput | None = None
    #: the format's version: always CYCLE_INFO_SCHEMA_VERSION for an object built here.
    schema_version: int = CYCLE_INFO_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if _int("schema_version", self.schema_version) != CYCLE_INFO_SCHEMA_VERSION:
            _fail("schema_version", self.schema_version, f"not {CYCLE_INFO_SCHEMA_VERSION}")
        _text("job_id", self.job_id, _MAX_ID_CHARS)
        _int("cycle", self.cycle)
        _int("restart_count", self.restart_count)
        _int("attempt", self.attempt)
        started = _number("started_at", self.started_at, 0.0, _MAX_WALL)
        object.__setattr__(self, "started_at", started)
        if self.ended_at is not None:
            ended = _number("ended_at", self.ended_at, 0.0, _MAX_WALL)
            if ended < started:
                _fail("ended_at", ended, f"before started_at ({started})")
            object.__setattr__(self, "ended_at", ended)
        if self.cause is not None:
            _text("cause", self.cause, _MAX_TEXT_CHARS)
        if self.log_file is not None:
            _text("log_file", self.log_file, _MAX_TEXT_CHARS, empty=False)
        nodes = tuple(_sequence("nodes", self.nodes, _MAX_NODES))
        for i, node in enumerate(nodes):
            if not isinstance(node, CycleNode):
                _fail(f"nodes[{i}]", node, "not a CycleNode")
        if len({n.node_id for n in nodes}) != len(nodes):
            _fail("nodes", [n.node_id for n in nodes], "a node id appears twice")
        if len({n.group_rank for n in nodes}) != len(nodes):
            _fail("nodes", [n.group_rank for n in nodes], "a group rank appears twice")
        object.__setattr__(self, "nodes", nodes)
        standby = tuple(_sequence("standby_nodes", self.standby_nodes, _MAX_NODES))
        for i, node_id in enumerate(standby):
            _text(f"standby_nodes[{i}]", node_id, _MAX_ID_CHARS, empty=False)
        if {n.node_id for n in nodes} & set(standby):
            _fail("standby_nodes", standby, "a node is both active and standby")
        object.__setattr__(self, "standby_nodes", standby)
        ranks = tuple(_sequence("ranks", self.ranks, _MAX_RANKS))
        for i, rank in enumerate(ranks):
            _int(f"ranks[{i}]", rank)
        if len(set(ranks)) != len(ranks):
            _fail("ranks", "<ranks>", "a rank appears twice")
        object.__setattr__(self, "ranks", ranks)
        given_codes: object = self.exit_codes
        if given_codes is not None:
            if not isinstance(given_codes, Mapping):
                _fail("exit_codes", given_codes, "not a mapping of rank to exit code")
            known = set(ranks)
            codes: dict[int, int] = {}
            for rank, code in given_codes.items():
                _int("exit_codes rank", rank)
                if rank not in known:
                    _fail("exit_codes rank", rank, "not one of this cycle's ranks")
                codes[rank] = _int(f"exit_codes[{rank}]", code, *_EXIT_CODE_RANGE)
            object.__setattr__(self, "exit_codes", codes)
        given_goodput: object = self.goodput
        if given_goodput is not None and not isinstance(given_goodput, CycleGoodput):
            _fail("goodput", given_goodput, "not a CycleGoodput")

    @property
    def world_size(self) -> int:
        """How many ranks run in this cycle."""
        return len(self.ranks)

    @property
    def ended(self) -> bool:
        """True once the launcher recorded the cycle's end."""
        return self.ended_at is not None

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object (every key present; ``None`` as null)."""
        return {
            "schema_version": self.schema_version,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "cycle": self.cycle,
            "restart_count": self.restart_count,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "cause": self.cause,
            "nodes": [{"node_id": n.node_id, "group_rank": n.group_rank} for n in self.nodes],
            "standby_nodes": list(self.standby_nodes),
            "ranks": list(self.ranks),
            "exit_codes": (
                None
                if self.exit_codes is None
                else {str(r): c for r, c in sorted(self.exit_codes.items())}
            ),
            "log_file": self.log_file,
            "goodput": (
                None
                if self.goodput is None
                else {
                    "productive_s": self.goodput.productive_s,
                    "wall_s": self.goodput.wall_s,
                    "ettr": self.goodput.ettr,
                }
            ),
        }

    @classmethod
    def from_dict(cls, document: object) -> CycleInfo:
        """Validate a parsed file; ``ValueError`` names the first bad field and why."""
        _check_schema_version(document, CYCLE_INFO_SCHEMA_VERSION)
        body = _object("cycle info", document, _KEYS)
        nodes = [
            _object(f"nodes[{i}]", node, _NODE_KEYS)
            for i, node in enumerate(_sequence("nodes", body["nodes"], _MAX_NODES))
        ]
        codes = body["exit_codes"]
        exit_codes: dict[int, int] | None = None
        if codes is not None:
            if not isinstance(codes, Mapping):
                _fail("exit_codes", codes, "not an object of rank to exit code")
            exit_codes = {}
            for key, code in codes.items():
                if not isinstance(key, str) or not _DECIMAL.fullmatch(key):
                    _fail("exit_codes key", key, "not a decimal rank")
                exit_codes[int(key)] = code
        goodput = body["goodput"]
        if goodput is not None:
            goodput = _object("goodput", goodput, _GOODPUT_KEYS)
        return cls(
            schema_version=body["schema_version"],
            job_id=body["job_id"],
            attempt=body["attempt"],
            cycle=body["cycle"],
            restart_count=body["restart_count"],
            started_at=body["started_at"],
            ended_at=body["ended_at"],
            cause=body["cause"],
            nodes=tuple(CycleNode(node_id=n["node_id"], group_rank=n["group_rank"]) for n in nodes),
            standby_nodes=tuple(_sequence("standby_nodes", body["standby_nodes"], _MAX_NODES)),
            ranks=tuple(_sequence("ranks", body["ranks"], _MAX_RANKS)),
            exit_codes=exit_codes,
            log_file=body["log_file"],
            goodput=(
                None
                if goodput is None
                else CycleGoodput(
                    productive_s=goodput["productive_s"],
                    wall_s=goodput["wall_s"],
                    ettr=goodput["ettr"],
                )
            ),
        )


_KEYS = frozenset(f.name for f in dataclasses.fields(CycleInfo))
_NODE_KEYS = frozenset(f.name for f in dataclasses.fields(CycleNode))
_GOODPUT_KEYS = frozenset(f.name for f in dataclasses.fields(CycleGoodput))


def cycle_info_schema_path() -> pathlib.Path:
    """The JSON Schema (draft 2020-12) of the cycle-info file, shipped in the wheel."""
    return pathlib.Path(__file__).with_name("cycle_info.schema.json")


def write_cycle_info(path: str | os.PathLike[str], info: CycleInfo) -> None:
    """Replace ``path`` with ``info`` in one step (no reader sees half a file); mode 0600.

    The directory must exist. OSError is the caller's to handle: the launcher decides
    whether a cycle-info file it cannot write matters.
    """
    if not isinstance(info, CycleInfo):
        raise TypeError(f"info is a {type(info).__name__}, not a CycleInfo")
    text = json.dumps(info.to_dict(), indent=1, allow_nan=False, ensure_ascii=False)
    write_file_atomically(path, text + "\n", mode=0o600)


def _load(path: str) -> CycleInfo:
    """Read and validate one file; ValueError or OSError says why it cannot be used."""
    document = read_json_file(path, MAX_CYCLE_INFO_BYTES)
    return CycleInfo.from_dict(document)


def read_cycle_info(path: str | os.PathLike[str] | None = None) -> CycleInfo | None:
    """The current cycle's info, or ``None``; never raises.

    ``path`` defaults to ``$NVRX_CURRENT_CYCLE_INFO``; with neither (or an empty value)
    the rank runs without cycle info and ``None`` comes back silently. A file that is
    missing, unreadable, not a regular file, larger than MAX_CYCLE_INFO_BYTES, not JSON,
    of another schema version or with any field of the wrong type or range logs one
    WARNING naming the file and why, and gives ``None``. Read it once per cycle (at
    set-up), never in the training loop: it is a file read.
    """
    try:
        where = os.environ.get(CYCLE_INFO_ENV, "") if path is None else os.fspath(path)
    except TypeError as exc:
        _logger.warning("cycle info path %r is not a path (%s); no cycle info", path, exc)
        return None
    if not where:
        return None
    try:
        return _load(where)
    except (OSError, ValueError, TypeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _logger.warning("cycle info %s cannot be used (%s); carrying on without it", where, why)
    except Exception as exc:  # a read for information never breaks training
        _logger.warning(
            "cycle info %s cannot be used (%s: %s); carrying on without it",
            where,
            type(exc).__name__,
            exc,
        )
    return None
