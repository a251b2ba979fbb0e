"""What the agent knows about the current cycle on this node, and which pids were ranks.

:class:`CycleState` is replaced at each start of the ranks; the agent's tick, the monitor
events (:mod:`._rank_reports`) and the failure report (:mod:`._failure_report`) read and
fill it. :class:`RankPids` tells an earlier cycle's rank from this cycle's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

from nvrx.ft import WorkloadAction
from nvrx.ft._events import RankFirstStep, RankTerminated, WorkloadRequest

from ._culprit import CulpritFinding

__all__: list[str] = []


@dataclasses.dataclass
class CycleState:
    """What happened in the current cycle on this node."""

    number: int
    started: float
    progress: int | None
    connected: set[int] = dataclasses.field(default_factory=set)
    terminated: dict[int, RankTerminated] = dataclasses.field(default_factory=dict)
    first_report: float | None = None
    #: Monotonic twins of ``started`` and ``first_report`` (those two label records;
    #: every wait and duration is measured on these, immune to wall-clock steps).
    started_mono: float = dataclasses.field(default_factory=time.monotonic)
    first_report_mono: float | None = None
    noticed_mono: float = dataclasses.field(default_factory=time.monotonic)
    spares_started: bool = False
    #: The first ShutdownWorkload and ExcludeThisNode requests of the cycle, kept until
    #: a decision ends it (also those that arrive while waiting for hang evidence).
    shutdown_request: WorkloadRequest | None = None
    exclude_request: WorkloadRequest | None = None
    #: Each local rank's ``rank_first_step`` event, and whether ``first_step`` was journalled.
    first_steps: dict[int, RankFirstStep] = dataclasses.field(default_factory=dict)
    first_step_recorded: bool = False
    #: Pids of the ranks whose crash was already logged (the moment it was seen).
    crashes_named: set[int] = dataclasses.field(default_factory=set)
    #: Whether the hang was attributed (``hang_attributed`` journalled, once a cycle),
    #: and what was found: as soon as the evidence is in, before the ranks exit.
    hang_attributed: bool = False
    hang_finding: CulpritFinding | None = None

    def note_request(self, event: WorkloadRequest) -> None:
        """Keep a workload control request (the first of each kind) for this cycle."""
        if event.action == WorkloadAction.ShutdownWorkload.name:
            self.shutdown_request = self.shutdown_request or event
        elif event.action == WorkloadAction.ExcludeThisNode.name:
            self.exclude_request = self.exclude_request or event


@dataclasses.dataclass
class RankPids:
    """This cycle's rank pids and every earlier cycle's: an event an earlier cycle's rank
    sent late (drained in the next cycle) must not count there (an early ``first_step``,
    a rank taken as terminated). The monitor reports the rank's own pid (its socket
    peer), which is the worker's pid: the NUMA wrapper and the exec shim exec the rank, a
    warm spare is the rank's process."""

    current: set[int] = dataclasses.field(default_factory=set)
    earlier: set[int] = dataclasses.field(default_factory=set)

    def new_cycle(self, pids: Iterable[int]) -> None:
        """The new cycle's workers started with ``pids`` (a reused pid is theirs now)."""
        self.earlier |= self.current
        self.current = set(pids)
        self.earlier -= self.current

    def is_stale(self, pid: int) -> bool:
        """Whether ``pid`` was an earlier cycle's rank; else it is noted as this cycle's."""
        if pid in self.earlier:
            return True
        self.current.add(pid)
        return False
