"""The cluster features as steps of the restart cycle, called by the agent at three points.

- before each rendezvous (the first and every restart): the node health checks;
- before each start of the ranks: the GPU memory wait (restarts only), the NUMA
  binding's journal record, and the ``cycle_start`` record (the cycle-info file's start);
- for every journal record: the cycle-info file (:class:`~._cycle_records.CycleInfoSink`).

Each step journals what it found through the agent's Recorder; none is a special case
in the agent, which only calls :class:`CycleSteps` at those points.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousHandler
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

from nvrx.ft import CycleGoodput

from ._app_logs import cycle_log_paths
from ._cluster import ClusterOptions
from ._cycle_records import CycleInfoSink, cycle_info_attempt, cycle_info_job_id
from ._events import (
    CycleStarted,
    GpuMemoryReclaim,
    NodeReplaced,
    NodeUnhealthy,
    NumaBinding,
    Recorder,
)
from ._gpu_memory import GpuMemoryWatch
from ._group_rank import GroupRankAligner
from ._node_health import NodeHealth, NodeHealthChecker
from ._numa import NumaPlan

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")


class CycleSteps:
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
        self.aligner = GroupRankAligner(
            os.environ, node_id, stable=options.standby_nodes, key=job_key, run_id=run_id
        )
        self._health = NodeHealthChecker(options.health) if options.health.any else None
        self._numa = numa
        self._gpu = GpuMemoryWatch(options.gpu_memory)
        self.cycle_info: CycleInfoSink | None = None
        if options.cycle_info_dir is not None:
            job_id = cycle_info_job_id(options.cycle_info_job_id, os.environ)
            prefix = options.applog_prefix
            self.cycle_info = CycleInfoSink(
                options.cycle_info_dir,
                job_id,
                cycle_info_attempt(os.environ),
                file_job=job_id or run_id,
                log_file=None if prefix is None else lambda c, r: cycle_log_paths(prefix, c, r)[0],
                goodput=goodput,
            )
            self.cycle_info.export(os.environ)  # the ranks inherit the launcher's environment

    def install(self, handler: RendezvousHandler) -> None:
        """Scheduler-aligned group ranks, except where the user gave them (static)."""
        if not isinstance(handler, StaticTCPRendezvous):
            self.aligner.install(handler)

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
