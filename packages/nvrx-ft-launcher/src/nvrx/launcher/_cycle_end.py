"""What ends a cycle: one tick's observations to at most one trigger. Pure, no torch.

The agent observes, at each tick (every 0.1 s, or at once when a watched descriptor
wakes it), the coordinator's published decision of the cycle, its ranks' requests, the
state of its ranks (its own poll, then torch's pid and D-state checks) and its monitors,
and whether nodes wait to join. :func:`cycle_end` says which of those ends the cycle;
the agent then acts on it (follow the decision, or decide through the coordinator and
the policy). The precedence is written here, once.
"""

from __future__ import annotations

import dataclasses
import enum

__all__: list[str] = []


class Workers(str, enum.Enum):
    """This node's ranks, as the agent's ``_monitor_workers`` found them."""

    HEALTHY = "healthy"
    SUCCEEDED = "succeeded"
    #: A rank failed (a non-zero exit, or its monitor terminated it).
    FAILED = "failed"
    #: torch's pid check: the workers' pids do not match its process context.
    PIDS_MISMATCH = "pids_mismatch"
    #: torch's D-state check: a rank stayed in uninterruptible sleep too long.
    UNINTERRUPTIBLE = "uninterruptible"


class End(str, enum.Enum):
    """What ends the cycle."""

    #: Another node's (or an earlier tick's) decision of this cycle is published.
    FOLLOW = "follow"
    #: A rank requested ShutdownWorkload.
    SHUTDOWN_REQUEST = "shutdown_request"
    #: A rank asked to exclude this node.
    EXCLUDE_REQUEST = "exclude_request"
    #: A rank stayed in D-state: this node leaves the job (an exclusion).
    UNINTERRUPTIBLE = "uninterruptible"
    #: A rank failed, torch's pid check failed, or a watched rank's monitor died.
    FAILURE = "failure"
    #: Every rank of this node succeeded.
    SUCCESS = "success"
    #: New nodes wait to join the job.
    NODES_WAITING = "nodes_waiting"


@dataclasses.dataclass(frozen=True)
class Seen:
    """What the agent observed in one tick."""

    #: The cycle's decision is published (the coordinator's ``decided``).
    decided: bool = False
    #: A rank's ShutdownWorkload request arrived in this cycle.
    shutdown_requested: bool = False
    #: A rank's ExcludeThisNode request arrived in this cycle.
    exclude_requested: bool = False
    workers: Workers = Workers.HEALTHY
    #: A monitor died while its rank was connected to it (its rank went unwatched).
    watched_monitor_died: bool = False
    #: How many nodes wait to join (torch's rendezvous; 0 between its checks).
    nodes_waiting: int = 0


def cycle_end(seen: Seen) -> End | None:
    """The one trigger that ends the cycle, or None when the cycle goes on.

    Precedence, first match wins:

    1. ``FOLLOW``: a decision of this cycle is published; every node follows it, so
       nothing this node saw can change what happens.
    2. ``SHUTDOWN_REQUEST``, then 3. ``EXCLUDE_REQUEST``: a rank's request wins over a
       failure seen in the same tick (the rank asked first; its siblings' failures are
       the consequence). The agent asks again after waiting for hang evidence, so a
       request that comes during that wait still wins.
    4. ``UNINTERRUPTIBLE``: torch's D-state check; the wedged rank holds a kernel
       resource a new rank here would conflict with, so this node leaves the job (an
       exclusion), whatever else failed.
    5. ``FAILURE``: a failed rank, torch's pid mismatch, or the death of a monitor whose
       rank was connected (its reason lists every one of them).
    6. ``SUCCESS``: every rank of this node succeeded.
    7. ``NODES_WAITING``: nodes wait to join; a restart takes them in.
    """
    if seen.decided:
        return End.FOLLOW
    if seen.shutdown_requested:
        return End.SHUTDOWN_REQUEST
    if seen.exclude_requested:
        return End.EXCLUDE_REQUEST
    if seen.workers is Workers.UNINTERRUPTIBLE:
        return End.UNINTERRUPTIBLE
    if seen.workers in (Workers.FAILED, Workers.PIDS_MISMATCH) or seen.watched_monitor_died:
        return End.FAILURE
    if seen.workers is Workers.SUCCEEDED:
        return End.SUCCESS
    if seen.nodes_waiting > 0:
        return End.NODES_WAITING
    return None
