"""The cluster features as steps of the restart cycle, called by the agent at three points.

- before each rendezvous (the first and every restart): the node health checks;
- before each start of the ranks: the GPU memory wait (restarts only), the NUMA
  binding's journal record, and the ``cycle_start`` record (the cycle-info file's start);
- for every journal record: the cycle-info file (:class:`~._cycle_info_writer.CycleInfoWriter`).

Each step journals what it found through the agent's Recorder; none is a special case
in the agent, which only calls :class:`ClusterSteps` at those points.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any, NoReturn

from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
)
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

from nvrx.ft import CycleGoodput

from ._app_logs import cycle_log_paths
from ._cluster import ClusterOptions
from ._cycle_info_writer import CycleInfoWriter, cycle_info_attempt, cycle_info_job_id
from ._events import (
    CycleStarted,
    Event,
    GpuMemoryReclaim,
    NodeReplaced,
    NodeUnhealthy,
    NumaBinding,
    Recorder,
    SegmentLeft,
)
from ._gpu_memory import GpuMemoryWatch
from ._group_rank import GroupRankAligner
from ._launcher_exit import LauncherExit
from ._node_health import NodeHealth, NodeHealthChecker
from ._numa import NumaPlan
from ._segment_gate import (
    SegmentGate,
    SegmentLeave,
    hosts_store,
    keep_alive_window,
    settle_window,
)
from ._staged_rendezvous import HOST_GRACE_S, StagedRendezvous, serve_a_moment_if_host
from ._torch_compat import (
    Store,
    leave_rendezvous,
    rendezvous_nodes,
    rendezvous_store,
)
from .exit_codes import ExitCode

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

#: ... and how long past torch's keep-alive window it waits once no node is listed.
_HOST_IDLE_S = 60.0


class ClusterSteps:
    """What the cluster features do at each step of a cycle, for one launcher."""

    def __init__(
        self,
        options: ClusterOptions,
        recorder: Recorder,
        node_id: str,
        *,
        run_id: str,
        numa: NumaPlan | None = None,
        goodput: Callable[[], CycleGoodput | None] | None = None,
        job_key: bytes | None = None,
    ) -> None:
        self.options = options
        self._recorder = recorder
        self._node_id = node_id
        segments = options.segments
        self.gate = (
            None
            if segments is None
            else SegmentGate(segments, node_id, os.environ, key=job_key, run_id=run_id)
        )
        self.aligner = GroupRankAligner(
            os.environ,
            node_id,
            stable=options.standby_nodes,
            key=job_key,
            run_id=run_id,
            segment_size=None if segments is None else segments.size,
            place=None if self.gate is None else self._place,
        )
        self._health = NodeHealthChecker(options.health) if options.health.any else None
        self._numa = numa
        self._gpu = GpuMemoryWatch(options.gpu_memory)
        self.cycle_info: CycleInfoWriter | None = None
        if options.cycle_info_dir is not None:
            job_id = cycle_info_job_id(options.cycle_info_job_id, os.environ)
            prefix = options.applog_prefix
            self.cycle_info = CycleInfoWriter(
                options.cycle_info_dir,
                job_id,
                cycle_info_attempt(os.environ),
                file_job=job_id or run_id,
                log_file=None if prefix is None else lambda c, r: cycle_log_paths(prefix, c, r)[0],
                goodput=goodput,
            )
            self.cycle_info.export(os.environ)  # the ranks inherit the launcher's environment

    def install(self, handler: RendezvousHandler) -> None:
        """The launcher's rendezvous stages on ``handler`` (:mod:`._staged_rendezvous`)."""
        gate = self.gate
        capacity = self.options.standby_nodes and self.options.max_nodes is not None
        StagedRendezvous(
            handler,
            gate=gate,
            on_segment_left=lambda exc: self._segment_left(handler, exc),
            max_nodes=self.options.max_nodes if gate is None and capacity else None,
            aligner=None if isinstance(handler, StaticTCPRendezvous) else self.aligner,
        ).install()

    def _place(self) -> tuple[int, str] | None:
        gate = self.gate
        if gate is None or gate.place is None or gate.segment is None:
            return None
        return gate.place, gate.segment

    def _segment_left(self, handler: RendezvousHandler, exc: SegmentLeave) -> NoReturn:
        logger.error(
            "segment %s broke and this node leaves the job with it: %s (nodes back: %s)",
            exc.segment.name,
            exc.reason,
            ", ".join(exc.nodes),
        )
        self._recorder.record(
            SegmentLeft(segment=exc.segment.name, reason=exc.reason, nodes=list(exc.nodes))
        )
        try:  # the round it was in forms again without it
            leave_rendezvous(handler, timeout_s=10.0)
        except Exception as err:  # best effort: torch's keep-alive expiry is the fallback
            logger.warning("could not leave the rendezvous promptly: %s", err)
        store = rendezvous_store(handler)
        if store is not None and hosts_store(store):
            # The job's store lives in this process: leaving now would end the job.
            logger.warning(
                "this node hosts the rendezvous store: it stays, outside every round, "
                "until the job ends, then exits %d",
                int(ExitCode.NODE_EXCLUDED),
            )
            _host_until_the_job_ends(handler, self.gate, store)
        raise LauncherExit(
            int(ExitCode.NODE_EXCLUDED),
            f"segment {exc.segment.name} broke: {exc.reason}",
        )

    def after_close(self, handler: RendezvousHandler) -> None:
        """The job ended: a store host of a segmented job serves a moment longer.

        Standby segments wait at the gate, outside torch's rounds: they learn that the
        job ended from the closed rendezvous (checked once a second), which needs the
        store; without it they would fail with a store error (exit 5).
        """
        if self.gate is None:
            return
        store = rendezvous_store(handler)
        if store is not None:
            serve_a_moment_if_host(store)

    def on_event(self, event: Event, record: dict[str, Any]) -> None:
        """A subscriber of the event bus: the cycle-info file follows the journal."""
        self.feed(record)

    def feed(self, record: dict[str, Any]) -> None:
        """One journal record (the cycle-info file follows the journal)."""
        if self.cycle_info is None:
            return
        try:
            self.cycle_info.feed(record)
        except (ValueError, TypeError, KeyError) as exc:  # a record it cannot use
            logger.warning("cycle info: %s record not used: %r", record.get("event"), exc)

    # -- before the rendezvous -----------------------------------------------------

    def check_health(self, cycle: int) -> NodeHealth:
        """The node's health; an unhealthy result is journalled (the agent then leaves)."""
        if self._health is None:
            return NodeHealth()
        health = self._health.check()
        if not health.healthy:
            logger.error("this node is unhealthy and leaves the job: %s", health.reason)
            self._recorder.record(
                NodeUnhealthy(
                    cycle=cycle,
                    failures=[f.to_json() for f in health.failures],
                    skipped=list(health.skipped),
                )
            )
        return health

    # -- before the ranks start ----------------------------------------------------

    def before_start(self, cycle: int, *, restart: bool) -> None:
        """GPU memory wait on a restart (baseline at the first start); the NUMA record."""
        self._wait_for_gpu_memory(cycle, restart=restart)
        plan = self._numa
        if plan is not None:
            if not plan.binds and cycle == 0 and plan.reason:
                logger.info("NUMA binding: nothing to bind: %s", plan.reason)
            elif plan.binds and cycle == 0:
                logger.info("NUMA binding (%s): local rank -> node %s", plan.method, plan.nodes)
            self._recorder.record(
                NumaBinding(
                    cycle=cycle,
                    method=plan.method,
                    strict=plan.strict,
                    nodes=dict(plan.nodes),
                    reason=plan.reason,
                )
            )

    def cycle_started(
        self,
        cycle: int,
        restart_count: int,
        group_rank: int | None,
        world_size: int,
        local_ranks: dict[int, int],
    ) -> None:
        """The ranks of ``cycle`` are about to be spawned (cycle-info file's start)."""
        for group_rank_left, left, by in self.aligner.replaced:
            self._recorder.record(
                NodeReplaced(
                    cycle=cycle, group_rank=group_rank_left, replaced_node=left, by_node=by
                )
            )
        self.aligner.replaced = []
        nodes = [{"node_id": n, "group_rank": r} for n, r in self.aligner.nodes]
        if not nodes and group_rank is not None:
            nodes = [{"node_id": self._node_id, "group_rank": group_rank}]
        self._recorder.record(
            CycleStarted(
                cycle=cycle,
                restart_count=restart_count,
                group_rank=group_rank,
                world_size=world_size,
                local_ranks=local_ranks,
                nodes=nodes,
            )
        )

    def _wait_for_gpu_memory(self, cycle: int, *, restart: bool) -> None:
        result = self._gpu.before_start(restart=restart)
        if result is None:
            return
        if not result.reclaimed:
            logger.error("%s; starting the ranks anyway", result.describe())
        else:
            logger.info("%s", result.describe())
        self._recorder.record(
            GpuMemoryReclaim(
                cycle=cycle,
                reclaimed=result.reclaimed,
                waited_s=result.waited_s,
                used_mb=result.used_mb,
                baseline_mb=result.baseline_mb,
                leftover=[p.to_json() for p in result.leftover],
            )
        )


def _host_until_the_job_ends(
    handler: RendezvousHandler, gate: SegmentGate | None = None, store: Store | None = None
) -> None:
    """Serve the store until the rendezvous closes, or no node has used it for a while.

    A job whose other launchers all failed never closes the rendezvous: once torch has
    listed no node, and the segment gate has seen no change, for a keep-alive window
    plus two settle windows (the standbys' own opening of an orphaned epoch, then its
    election) plus :data:`_HOST_IDLE_S`, nobody needs it.
    """
    settle = settle_window(handler)
    idle_after = keep_alive_window(handler) + 2 * settle + _HOST_IDLE_S
    empty_since: float | None = None
    last_activity: tuple[int, int, int] | None = None
    while not handler.is_closed():
        found = rendezvous_nodes(handler)
        activity = None
        if gate is not None and store is not None:
            with contextlib.suppress(RuntimeError):  # the store's own error: no change seen
                activity = gate.activity(store)
        now = time.monotonic()
        used = activity is not None and activity != last_activity
        last_activity = activity if activity is not None else last_activity
        if found is None or found[0] > 0 or used:
            empty_since = None
        elif empty_since is None:
            empty_since = now
        elif now - empty_since > idle_after:
            logger.warning("no node has used the rendezvous for %.0f s", now - empty_since)
            return
        time.sleep(1.0)
    time.sleep(HOST_GRACE_S)  # the others' last store calls (leave barrier)
