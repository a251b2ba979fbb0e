"""The exit barrier: after this node's ranks all succeeded, wait for the other nodes.

A node whose ranks finished has arrived (:meth:`._coordination.JobCoordinator.arrive`);
it waits until every node of the round arrived, for at most ``--exit-barrier-timeout``,
unless a decision of the cycle is published meanwhile (another node failed: this node
follows the restart or stop like any other).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ._coordination import Decision, JobCoordinator

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")


def await_other_nodes(
    coord: JobCoordinator,
    cycle: int,
    world: int,
    *,
    timeout: float,
    wait: Callable[[], None],
    drain: Callable[[], object],
) -> Decision | None:
    """Wait until ``world`` nodes arrived in ``cycle``; the decision published meanwhile, if any.

    Gives up, logged, after ``timeout`` seconds (the job then ends here as finished).
    ``wait`` sleeps one interval (woken early by the decision watcher), ``drain`` empties
    the monitors' socket between waits.
    """
    deadline = time.monotonic() + timeout
    logger.info("local workers finished; waiting for %d node(s) in all", world)
    while coord.arrived(cycle) < world:
        decision = coord.decided(cycle)
        if decision is not None:
            return decision
        if time.monotonic() > deadline:
            logger.error("gave up waiting for the other nodes after %.0f s", timeout)
            break
        wait()
        drain()
    return None
