"""A training loop shaped like Megatron-Bridge's FT and straggler integration (gloo, CPU).

Written from Megatron-Bridge's documented call shapes (``training/fault_tolerance.py``
and ``training/nvrx_straggler.py``), not its code: ``init_workload_monitoring()``
without arguments and sections ``setup``/``step``; ``Detector.initialize(
scores_to_compute=[...], gather_on_rank0=True, profiling_interval=...,
report_time_interval=...)``; the train step wrapped with ``wrap_callables`` through
``CallableId(wrapper, "train_step")``; ``generate_report_if_interval_elapsed()`` on every
rank each iteration, ``is_interval_elapsed()``, and on rank 0
``report.identify_stragglers(gpu_rel_threshold=..., gpu_indiv_threshold=...)`` plus
the scores and node of every rank read by rank; ``shutdown()`` at the end.

Rank ``--slow-rank`` takes ``--slowdown`` times longer per step. Each rank appends JSON
lines to ``<out>/journal.jsonl`` (one ``report`` line per elapsed interval).
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from _rank_journal import Journal

from nvrx.ft import RankMonitorClient
from nvrx.straggler import CallableId, Detector


class TrainStepWrapper:
    """What Bridge wraps: an object whose ``train_step`` runs one iteration."""

    def __init__(self, step_time: float) -> None:
        self.step_time = step_time

    def train_step(self, value: torch.Tensor) -> torch.Tensor:
        time.sleep(self.step_time)
        return value * 2


def _by_rank(scores: Any, world: int) -> dict[str, Any]:
    return {str(r): scores[r] for r in range(world)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--slowdown", type=float, default=3.0)
    parser.add_argument("--report-interval", type=float, default=0.5)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    journal = Journal(args.out / "journal.jsonl", rank=rank, attempt=attempt)

    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.start_section("setup")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    world = dist.get_world_size()
    # Bridge imports attribution.straggler, falling back to straggler: both are nvrx.straggler.
    detector = Detector
    detector.initialize(
        scores_to_compute=["relative_perf_scores", "individual_perf_scores"],
        gather_on_rank0=True,
        profiling_interval=1,
        report_time_interval=args.report_interval,
    )
    step_time = args.step_time * (args.slowdown if rank == args.slow_rank else 1.0)
    wrapper = TrainStepWrapper(step_time)
    callable_id = CallableId(wrapper, "train_step")
    detector.wrap_callables(callable_ids=[callable_id])
    client.end_section("setup")
    journal.record("start", section=str(callable_id))

    for step in range(1, args.steps + 1):
        client.start_section("step")
        value = wrapper.train_step(torch.ones(1))
        client.end_section("step")
        dist.all_reduce(value)
        report = detector.generate_report_if_interval_elapsed()
        if not detector.is_interval_elapsed():
            continue
        if rank != 0:
            journal.record("report", step=step, has_report=report is not None)
            continue
        assert report is not None
        found = report.identify_stragglers(gpu_rel_threshold=0.7, gpu_indiv_threshold=0.7)
        journal.record(
            "report",
            step=step,
            has_report=True,
            gpu_relative=_by_rank(report.gpu_relative_perf_scores, world),
            gpu_individual=_by_rank(report.gpu_individual_perf_scores, world),
            rank_to_node=_by_rank(report.rank_to_node, world),
            section_relative={
                name: _by_rank(scores, world)
                for name, scores in report.section_relative_perf_scores.items()
            },
            stragglers={
                "gpus_relative": sorted(s.rank for s in found["straggler_gpus_relative"]),
                "gpus_individual": sorted(s.rank for s in found["straggler_gpus_individual"]),
                "sections_relative": {
                    name: sorted(s.rank for s in ids)
                    for name, ids in found["straggler_sections_relative"].items()
                },
            },
        )

    detector.shutdown()
    dist.barrier()
    journal.record("done", step=args.steps)
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
