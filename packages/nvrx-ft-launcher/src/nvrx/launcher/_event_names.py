"""The journal's event names (the ``event`` field), one constant each.

The journal's writers (:mod:`._events`, one dataclass per event, ``EVENT`` set from
here) and its readers (:mod:`.goodput`, :mod:`._trace`, :mod:`._cycle_info_writer`, the
cycle log) name events only through these constants, never by typing the string. Its
own module, standard library only, so that readers that the event types import
(:mod:`.goodput`) can use them too.
"""

from __future__ import annotations

__all__: list[str] = []

RUN_START = "run_start"
FINISHED = "finished"
RESTART_COST = "restart_cost"
JOB_GOODPUT = "job_goodput"
NODE_GOODPUT = "node_goodput"
WORKERS_STARTED = "workers_started"
RANK_TERMINATED_BY_MONITOR = "rank_terminated_by_monitor"
FIRST_STEP = "first_step"
CYCLE_START = "cycle_start"
NODE_UNHEALTHY = "node_unhealthy"
NODE_REPLACED = "node_replaced"
CHECKPOINT_RESTORED = "checkpoint_restored"
SEGMENT_LEFT = "segment_left"
GPU_MEMORY_RECLAIM = "gpu_memory_reclaim"
NUMA_BINDING = "numa_binding"
HANG_ATTRIBUTED = "hang_attributed"
WORKLOAD_CONTROL = "workload_control"
MONITOR_DIED = "monitor_died"
RANK_FAILED = "rank_failed"
PROGRESS = "progress"
STRAGGLER_REPORT = "straggler_report"
STRAGGLER_REPORT_IGNORED = "straggler_report_ignored"
STORE_VALUE_IGNORED = "store_value_ignored"
DECISION = "decision"
WORKERS_STOPPED = "workers_stopped"
RESTART = "restart"
RESTART_FAILED = "restart_failed"
ALL_NODES_FINISHED = "all_nodes_finished"
#: A cycle's last training step (accepted by the accounting; the launcher journals
#: none itself).
LAST_STEP = "last_step"
