"""The cluster features' settings, gathered once from the options, the FT config and env.

Health checks before each rendezvous (:mod:`._node_health`), the GPU memory wait before
each restart (:mod:`._gpu_memory`), NUMA binding (:mod:`._numa`), the cycle-info file
(:mod:`._cycle_info_writer`) and per-cycle application logs (:mod:`._app_logs`) each read
their part of :class:`ClusterOptions`; :func:`cluster_options` builds it at start-up
and refuses a bad value there (ValueError naming the option or variable: exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping

from nvrx.ft import FaultToleranceConfig

from ._node_health import HealthSettings
from ._numa import GPUS_PER_NUMA_ENV, machine_plan, numactl_refusal, parse_gpus_per_numa
from ._segments import SegmentSettings
from ._validation import unsafe_output_path

__all__: list[str] = []


@dataclasses.dataclass(frozen=True)
class GpuMemorySettings:
    """NVRx's GPU memory reclaim options (FT config fields)."""

    timeout: float = 50.0
    tolerance_mb: float = 512.0
    poll_interval: float = 2.0
    check_remaining_processes: bool = False


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    """Everything the cluster features need, validated."""

    health: HealthSettings = dataclasses.field(default_factory=lambda: HealthSettings(gpu=False))
    gpu_memory: GpuMemorySettings = dataclasses.field(default_factory=GpuMemorySettings)
    #: NVRX_GPUS_PER_NUMA (None: no binding) and --ft-numa-bind-strict.
    gpus_per_numa: int | None = None
    numa_bind_strict: bool = True
    cycle_info_dir: str | None = None
    cycle_info_job_id: str | None = None
    applog_prefix: str | None = None
    #: --ft-standby-nodes: of --nnodes=MIN:MAX, MIN nodes run the job and the rest wait.
    standby_nodes: bool = False
    #: --ft-segment: whole segments only (implies standby_nodes); None: off.
    segments: SegmentSettings | None = None
    #: With standby nodes: --nnodes' MAX, beyond which a launcher is refused.
    max_nodes: int | None = None


def _storage_paths(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def _check_numactl(args: argparse.Namespace, gpus_per_numa: int, strict: bool) -> None:
    """numactl tried once with each binding the ranks will get; refused: ValueError."""
    nproc = str(getattr(args, "nproc_per_node", "") or "")
    plan = machine_plan(int(nproc) if nproc.isdigit() else None, gpus_per_numa, strict, log=False)
    refused = numactl_refusal(plan)
    if refused is not None:
        raise ValueError(
            f"{GPUS_PER_NUMA_ENV}={gpus_per_numa}: this machine refuses the NUMA binding "
            f"({refused}); unset {GPUS_PER_NUMA_ENV} or allow the binding"
        )


def cluster_options(
    args: argparse.Namespace, cfg: FaultToleranceConfig, env: Mapping[str, str] = os.environ
) -> ClusterOptions:
    """The settings from parsed ``args``, the FT config ``cfg`` and the environment."""
    gpus_per_numa = None
    if env.get(GPUS_PER_NUMA_ENV):
        gpus_per_numa = parse_gpus_per_numa(env[GPUS_PER_NUMA_ENV])
        _check_numactl(args, gpus_per_numa, cfg.numa_bind_strict)
    cycle_dir = cfg.cycle_info_dir
    if cycle_dir is not None and not os.path.isdir(cycle_dir):
        raise ValueError(f"argument --ft-cycle-info-dir: {cycle_dir!r} is not a directory")
    if cycle_dir is not None and not os.access(cycle_dir, os.W_OK | os.X_OK):
        raise ValueError(
            f"argument --ft-cycle-info-dir: {cycle_dir!r} is not writable by this user"
        )
    unsafe = None if cycle_dir is None else unsafe_output_path(cycle_dir, is_dir=True)
    if unsafe is not None:  # also when the directory came from the YAML file
        raise ValueError(f"argument --ft-cycle-info-dir: {cycle_dir!r}: {unsafe}")
    return ClusterOptions(
        health=HealthSettings(
            gpu=cfg.enable_gpu_monitor,
            nic=cfg.enable_nic_healthcheck,
            link_state_path_template=cfg.link_state_path_template,
            link_down_path_template=cfg.link_down_path_template,
            storage_paths=_storage_paths(cfg.storage_healthcheck_path),
            command=args.ft_node_health_check_cmd,
        ),
        gpu_memory=GpuMemorySettings(
            timeout=cfg.gpu_memory_reclaim_timeout,
            tolerance_mb=cfg.gpu_memory_tolerance_mb,
            poll_interval=cfg.gpu_memory_poll_interval,
            check_remaining_processes=cfg.check_remaining_processes,
        ),
        gpus_per_numa=gpus_per_numa,
        numa_bind_strict=cfg.numa_bind_strict,
        cycle_info_dir=cycle_dir,
        cycle_info_job_id=args.ft_cycle_info_job_id,
        applog_prefix=args.ft_per_cycle_applog_prefix,
        standby_nodes=bool(getattr(args, "ft_standby_nodes", False)),
    )
