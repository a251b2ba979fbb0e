"""The launcher's log lines about what it journals: a subscriber of the event bus.

A fact the launcher publishes (:class:`._events.Recorder`) that people also read in the
launcher's log gets its line here, from the event alone, just before its journal line is
written: a monitor that died, a rank its monitor terminates, a rank's workload control
request, a hang's culprit, a checkpoint restore, a restart's timing. Lines that need more
than the event (a decision's restart budget, a crash named before the others stop) stay
where that is known.
"""

from __future__ import annotations

import logging
from typing import Any

from ._events import (
    CheckpointRestored,
    Event,
    HangAttributed,
    MonitorDied,
    RankTerminatedByMonitor,
    Restarted,
    WorkloadControl,
)

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")


def log_line(event: Event, record: dict[str, Any]) -> None:
    """The bus' subscriber: the log line of ``event``, if it has one."""
    if isinstance(event, MonitorDied):
        logger.error(
            "the monitor of local rank %d died (exit code %s); starting a new one%s",
            event.local_rank,
            event.exit_code,
            " and restarting, since its rank was unwatched" if event.rank_was_connected else "",
        )
    elif isinstance(event, RankTerminatedByMonitor):
        logger.warning(
            "monitor of local rank %d is terminating rank %d (pid %d): %s",
            event.local_rank,
            event.rank,
            event.pid,
            event.message,
        )
    elif isinstance(event, WorkloadControl):
        logger.warning(
            "rank %d (local rank %d, pid %d) requests %s: %s",
            event.rank,
            event.local_rank,
            event.pid,
            event.action,
            event.description,
        )
    elif isinstance(event, HangAttributed):
        logger.warning("hang in cycle %d: %s", event.cycle, event.sentence)
    elif isinstance(event, CheckpointRestored):
        at = "" if event.iteration is None else f" iteration {event.iteration}"
        logger.info(
            "cycle %d: ranks restored%s from %s in %.2f s (%s)",
            event.cycle,
            at,
            event.source,
            event.restore_s,
            ", ".join(f"local rank {r}: {s}" for r, s in event.ranks.items()),
        )
    elif isinstance(event, Restarted):
        logger.warning(
            "restarted in %.2f s (stop %.2f s, rendezvous %.2f s, start %.2f s); "
            "TORCHELASTIC_RESTART_COUNT=%d",
            event.stop_s + event.rendezvous_s + event.spawn_s,
            event.stop_s,
            event.rendezvous_s,
            event.spawn_s,
            event.cycle,
        )
