"""The agent's goodput: a subscriber of the event bus that keeps the running account.

Every event the launcher publishes (:class:`._events.Recorder`) is fed, as its journal
record, to a :class:`.goodput.Ledger`. A restart whose cost the ledger completes is
published in turn (``restart_cost``) and logged; a restart counts in the metrics as soon
as its ranks started (``restart``); the metrics' goodput gauges follow at most every
5 s. At the job's end :meth:`GoodputFeed.journal_summary` writes the node's (or the
job's) account, exchanging the nodes' timelines through the coordinator.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from nvrx.ft import CycleGoodput

from . import goodput
from ._coordination import JobCoordinator
from ._events import Event, JobGoodput, NodeGoodput, Recorder, RestartCostMeasured, Restarted
from .metrics import NULL_RECORDER, NullRecorder

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

GAUGE_PERIOD_S = 5.0
#: How long the job summary's writer waits for the other nodes' goodput timelines.
EXCHANGE_WAIT_S = 5.0


class GoodputFeed:
    """The running goodput account of this launcher, fed by the bus it subscribes to."""

    def __init__(self, recorder: Recorder, metrics: NullRecorder) -> None:
        self._recorder = recorder
        self._metrics = metrics
        self.ledger = goodput.Ledger()
        self._next_gauge = 0.0

    def on_event(self, event: Event, record: dict[str, Any]) -> None:
        """The bus' subscriber: every record feeds the ledger; a new restart counts."""
        for cost in self.ledger.feed(record):
            self._recorder.record(RestartCostMeasured(cost))
            logger.info("%s", cost.format())
            self.update_gauges(force=True)
        if isinstance(event, Restarted):
            self._count_restart(event.from_cycle)

    def cycle_goodput(self) -> CycleGoodput | None:
        """The job's goodput so far, for the cycle-info file (None before any time passed)."""
        summary = self.ledger.summary(now=time.time())  # wall clock: label
        if summary.ettr is None:
            return None
        productive = min(summary.seconds[goodput.Phase.PRODUCTIVE], summary.total_s)
        return CycleGoodput(
            productive_s=max(0.0, productive),
            wall_s=summary.total_s,
            ettr=min(1.0, max(0.0, summary.ettr)),
        )

    def _count_restart(self, from_cycle: int) -> None:
        """The restart metrics, as soon as the new cycle's ranks started.

        The journal's cost line waits for the new cycle's first step; the counter does
        not (its recovery latency then ends at the ranks' start).
        """
        if self._metrics is NULL_RECORDER:
            return
        try:
            costs = self.ledger.summary(now=time.time()).restarts  # wall clock: label
            cost = next((c for c in costs if c.from_cycle == from_cycle), None)
        except Exception as exc:  # accounting never stops training
            logger.debug("restart metrics: %r", exc)
            cost = None
        if cost is None:
            self._metrics.restart(goodput.Cause.UNKNOWN, None, None)
        else:
            self._metrics.restart(cost.cause, cost.detection_s, cost.recovery_s)
        self.update_gauges(force=True)

    def update_gauges(self, *, force: bool = False) -> None:
        """The metrics' goodput gauges, at most every ``GAUGE_PERIOD_S`` unless ``force``."""
        if self._metrics is NULL_RECORDER:
            return
        now = time.monotonic()
        if not force and now < self._next_gauge:
            return
        self._next_gauge = now + GAUGE_PERIOD_S
        try:
            self._metrics.goodput(self.ledger.summary(now=time.time()))  # wall clock: label
        except Exception as exc:  # accounting never stops training
            logger.debug("goodput gauges: %r", exc)

    def journal_summary(
        self, *, nodes: int, node: str, cycle: int, coordinator: Callable[[], JobCoordinator]
    ) -> None:
        """At the job's end: the goodput summary in the log (INFO) and the journal.

        One node holding the whole job writes ``job_goodput``. In a multi-node job each
        node writes its own view as ``node_goodput`` and publishes its timeline to the
        store (signed); the node of group rank ``goodput.SUMMARY_GROUP_RANK`` waits up
        to ``EXCHANGE_WAIT_S`` for the others' and writes ``job_goodput`` over every
        timeline it got.
        """
        try:
            now = time.time()  # wall clock: label (the ledger's timeline is record labels)
            summary = self.ledger.summary(now=now)
            if nodes <= 1:
                logger.info("%s", summary.format())
                self._recorder.record(JobGoodput(summary.to_json()))
                self._metrics.goodput(summary)
                return
            logger.info("this node's %s", summary.format())
            self._recorder.record(NodeGoodput(summary.to_json()))
            self._metrics.goodput(summary)
            self._journal_job_goodput(now, nodes, node, cycle, coordinator())
        except Exception as exc:  # accounting never changes the job's outcome
            logger.warning("no goodput summary: %r", exc)

    def _journal_job_goodput(
        self, now: float, world: int, node: str, cycle: int, coord: JobCoordinator
    ) -> None:
        """Exchange the nodes' timelines; the summary writer journals the job's account."""
        mine = self.ledger.timeline()
        coord.publish_timeline(cycle, json.dumps(mine.to_json(), sort_keys=True))
        if not goodput.writes_job_summary(mine, node):
            return

        def parse(raw: bytes) -> goodput.Timeline:
            return goodput.Timeline.from_json(json.loads(raw))

        got = coord.timelines(cycle, world, EXCHANGE_WAIT_S, parse)
        summary = goodput.account(goodput.Timeline.merge([mine, *got]), now=now)
        if summary.nodes < world:
            logger.warning(
                "job goodput covers %d of %d nodes (the others' timelines did not come "
                "within %.0f s)",
                summary.nodes,
                world,
                EXCHANGE_WAIT_S,
            )
        logger.info("job %s", summary.format())
        self._recorder.record(JobGoodput(summary.to_json()))
        self._metrics.goodput(summary)
