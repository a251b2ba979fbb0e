"""One gloo rank of a multi-process straggler test.

Usage: ``dist_worker.py SCENARIO RANK WORLD PORT OUT PARAMS``.

Each scenario runs real sections and synthetic kernel records through a real
StragglerDetector and writes what the test checks to ``OUT/rank<R>.json``.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from nvrx.straggler import (
    Report,
    StragglerDetector,
    SyntheticKernelRecord,
    SyntheticKernelTimer,
)


class CountingDist:
    """Counts the torch.distributed collectives the detector issues."""

    NAMES = ("all_reduce", "all_gather", "gather", "broadcast", "all_gather_object")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(self.NAMES, 0)
        for name in self.NAMES:
            original = getattr(dist, name)
            setattr(dist, name, self._counting(name, original))

    def _counting(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    def total(self) -> int:
        return sum(self.counts.values())


def forbid_cuda() -> None:
    """Make any CUDA call in this process fail loudly (gloo runs must not make one)."""
    import torch

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a CUDA call was made on a CPU-only (gloo) run")

    for name in ("synchronize", "current_device", "set_device", "Event", "init"):
        setattr(torch.cuda, name, fail)
    torch.Tensor.cuda = fail  # type: ignore[method-assign]


def report_json(report: Report | None) -> dict[str, Any] | None:
    return None if report is None else report.to_dict()


def kernels(scale: float, names: list[str]) -> list[SyntheticKernelRecord]:
    return [
        SyntheticKernelRecord(name, 1_000, 1_000 + int(scale * (i + 1) * 10_000))
        for i, name in enumerate(names)
    ]


def window(
    det: StragglerDetector,
    timer: SyntheticKernelTimer,
    *,
    steps: int,
    sleep_s: float,
    kernel_scale: float,
    kernel_names: list[str],
    sections: tuple[str, ...] = ("step",),
) -> None:
    for _ in range(steps):
        for name in sections:
            with det.detection_section(name):
                time.sleep(sleep_s)
                if kernel_names:
                    timer.feed(kernels(kernel_scale, kernel_names))


def scenario_slow_rank(rank: int, world: int, p: dict[str, Any]) -> dict[str, Any]:
    counter = CountingDist()
    timer = SyntheticKernelTimer()
    det = StragglerDetector(
        gather_on_rank0=p.get("gather", True), kernel_timer=timer, node_name=f"node{rank // 2}"
    )
    names = ["gemm", "softmax", "ncclDevKernel_AllReduce"]
    slow = p["slow_rank"]
    out: dict[str, Any] = {"reports": [], "collectives": []}
    # Window 1: everybody equally fast (sets the individual baselines).
    # Window 2: the slow rank sleeps 4x as long and its kernels take 4x as long.
    # Window 3: same as 2, no new names: steady state.
    # A fast step sleeps 50 ms: a rank is a section straggler once its step lasts 4/3 of
    # the fastest one's, and four ranks on a loaded 2-core machine (two tests at a time)
    # were late by more than a third of a 10 ms step.
    for w in range(3):
        factor = 4.0 if (w > 0 and rank == slow) else 1.0
        window(det, timer, steps=4, sleep_s=0.05 * factor, kernel_scale=factor, kernel_names=names)
        before = counter.total()
        calls_before = det.reporter.comm.calls
        report = det.generate_report()
        out["collectives"].append(
            {"dist": counter.total() - before, "comm": det.reporter.comm.calls - calls_before}
        )
        out["reports"].append(report_json(report))
        if report is not None:
            ids = report.identify_stragglers()
            out.setdefault("stragglers", []).append(
                {
                    k: sorted(str(x) for x in v)
                    if isinstance(v, set)
                    else {s: sorted(str(x) for x in ids_) for s, ids_ in v.items()}
                    for k, v in ids.items()
                }
            )
    det.close()
    return out


def scenario_two_ranks(rank: int, world: int, p: dict[str, Any]) -> dict[str, Any]:
    """Missing data, gather off/on, name exchange counts, interval agreement."""
    counter = CountingDist()
    out: dict[str, Any] = {}

    # 1. rank 1 records no kernels and never enters "extra"; gather off then on
    for gather in (False, True):
        timer = SyntheticKernelTimer()
        det = StragglerDetector(gather_on_rank0=gather, kernel_timer=timer, node_name=f"n{rank}")
        names = ["gemm"] if rank == 0 else []
        sections = ("step", "extra") if rank == 0 else ("step",)
        window(
            det,
            timer,
            steps=3,
            sleep_s=0.002,
            kernel_scale=1.0,
            kernel_names=names,
            sections=sections,
        )
        out[f"missing_gather_{gather}"] = report_json(det.generate_report())
        det.close()

    # 2. names cross the wire only when new
    timer = SyntheticKernelTimer()
    det = StragglerDetector(kernel_timer=timer)
    counts = []
    for step in range(4):
        names = ["a", "b"] + (["only_rank0_new"] if rank == 0 and step == 2 else [])
        window(det, timer, steps=1, sleep_s=0.0, kernel_scale=1.0, kernel_names=names)
        before = dict(counter.counts)
        det.generate_report()
        counts.append({k: counter.counts[k] - before[k] for k in counter.counts})
    out["name_counts"] = counts
    out["kernel_ids"] = det.reporter.name_mapper.id_to_kernel_name
    det.close()

    # 3. individual scores without gathering: no collective at all
    timer = SyntheticKernelTimer()
    det = StragglerDetector("individual_perf_scores", gather_on_rank0=False, kernel_timer=timer)
    window(det, timer, steps=2, sleep_s=0.0, kernel_scale=1.0, kernel_names=["a"])
    before_total = counter.total()
    report = det.generate_report()
    out["indiv_no_gather"] = {
        "collectives": counter.total() - before_total,
        "report": report_json(report),
    }
    det.close()

    # 4. the report interval is agreed across ranks with different step times, and
    #    re-estimated at the next report once the steps become much slower
    det = StragglerDetector(report_time_interval=0.1, kernel_timer=SyntheticKernelTimer())
    reported: list[int] = []
    intervals: list[int | None] = []
    for it in range(1, 200):
        fast = not reported
        with det.detection_section("step", profile_cuda=False):
            time.sleep((0.002 if rank == 0 else 0.003) if fast else 0.03)
        det.generate_report_if_interval_elapsed()
        if det.is_interval_elapsed():
            reported.append(it)
            intervals.append(det.report_interval_tracker.iter_interval)
            if len(reported) == 3:
                break
    out["interval"] = {"reported": reported, "intervals": intervals}
    det.close()
    out["pickled_collectives"] = counter.counts["all_gather_object"]
    return out


SCENARIOS: dict[str, Callable[[int, int, dict[str, Any]], dict[str, Any]]] = {
    "slow_rank": scenario_slow_rank,
    "two_ranks": scenario_two_ranks,
}


def main() -> None:
    scenario, rank, world, port, out = sys.argv[1:6]
    params = json.loads(sys.argv[6])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=int(rank),
        world_size=int(world),
        timeout=datetime.timedelta(seconds=60),
    )
    forbid_cuda()
    try:
        result = SCENARIOS[scenario](int(rank), int(world), params)
    finally:
        dist.destroy_process_group()
    path = pathlib.Path(out) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)


if __name__ == "__main__":
    main()
