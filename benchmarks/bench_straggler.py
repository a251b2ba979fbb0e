"""Straggler detection costs: the section hot path and report generation.

* ``detection_section`` per entry with ``profile_cuda=False``: measured entries
  (``profiling_interval=1``) and unmeasured ones (``profiling_interval=1000``), next to
  a bare ``contextlib.contextmanager`` measured in the same run for scale.
* ``generate_report`` for world size 1 with a few sections and synthetic kernels.
* Simulated relative + individual scoring of 1,024 and 8,192 ranks with 200 kernels
  each: the MIN all-reduce is replaced by a tensor minimum over the ranks' encoded
  vectors, then every rank's scores are computed by the package's scoring functions.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator

import torch
from _common import Metric, median_ns_per_call

from nvrx.straggler import StragglerDetector, SyntheticKernelRecord, SyntheticKernelTimer
from nvrx.straggler.scoring import (
    decode_slots,
    encode_kernel_slots,
    encode_section_slots,
    gpu_scores,
    section_scores,
)

AREA = "straggler"


def _section_cost(profiling_interval: int, quick: bool) -> float:
    det = StragglerDetector(
        profiling_interval=profiling_interval, kernel_timer=SyntheticKernelTimer()
    )
    section = det.detection_section

    def entry() -> None:
        with section("bench", profile_cuda=False):
            pass

    try:
        return median_ns_per_call(
            entry, calls_per_sample=2_000 if quick else 20_000, samples=11 if quick else 31
        )
    finally:
        det.close()


def _contextmanager_cost(quick: bool) -> float:
    @contextlib.contextmanager
    def cm() -> Iterator[None]:
        yield

    def entry() -> None:
        with cm():
            pass

    return median_ns_per_call(
        entry, calls_per_sample=2_000 if quick else 20_000, samples=11 if quick else 31
    )


def _report_world1(quick: bool) -> tuple[float, int]:
    timer = SyntheticKernelTimer()
    det = StragglerDetector(kernel_timer=timer, node_name="bench")
    times: list[float] = []
    reps = 5 if quick else 21
    try:
        for _ in range(reps):
            for i in range(100):
                with det.detection_section("fwd"):
                    timer.feed(
                        SyntheticKernelRecord(f"kernel_{k}", 1000, 2000 + k + i) for k in range(200)
                    )
                with det.detection_section("data", profile_cuda=False):
                    pass
            t0 = time.perf_counter_ns()
            det.generate_report()
            times.append((time.perf_counter_ns() - t0) / 1e6)
    finally:
        det.close()
    return statistics.median(times), reps


def _simulated_scoring(ranks: int, kernels: int, sections: int, reps: int) -> float:
    gen = torch.Generator().manual_seed(ranks)
    k_meds = 100.0 + 10.0 * torch.rand((ranks, kernels), generator=gen, dtype=torch.float64)
    k_w = k_meds * 50
    s_meds = 20.0 + torch.rand((ranks, sections), generator=gen, dtype=torch.float64)
    k_base = k_meds * 0.95
    s_base = s_meds * 0.95
    times: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        encoded = torch.stack(
            [
                torch.cat([encode_kernel_slots(k_meds[r]), encode_section_slots(s_meds[r])])
                for r in range(ranks)
            ]
        )
        reduced = encoded.min(dim=0).values
        k_ref, common, s_ref = decode_slots(reduced, kernels, sections)
        gpu_scores(k_meds, k_w, k_ref, common)
        gpu_scores(k_meds, k_w, k_base, torch.ones(kernels, dtype=torch.bool))
        section_scores(s_meds, s_ref)
        section_scores(s_meds, s_base)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times)


def run(quick: bool) -> list[Metric]:
    """Measure the hot path, a world-size-1 report and simulated scoring at scale."""
    samples = 11 if quick else 31
    cm = _contextmanager_cost(quick)
    measured = _section_cost(1, quick)
    unmeasured = _section_cost(1000, quick)
    report_ms, report_reps = _report_world1(quick)
    metrics = [
        Metric(
            AREA,
            "detection_section_measured_entry",
            measured / 1000,
            "us",
            samples,
            target=0.5,
            detail={"contextmanager_us": cm / 1000, "ratio_to_contextmanager": measured / cm},
        ),
        Metric(
            AREA,
            "detection_section_unmeasured_entry",
            unmeasured / 1000,
            "us",
            samples,
            target=measured / 1000,
            detail={"profiling_interval": 1000, "ratio_to_contextmanager": unmeasured / cm},
        ),
        Metric(AREA, "contextmanager_entry_baseline", cm / 1000, "us", samples),
        Metric(
            AREA,
            "generate_report_world1",
            report_ms,
            "ms",
            report_reps,
            detail={"sections": 2, "kernels": 200, "samples_per_kernel": 100},
        ),
    ]
    for ranks in (1024, 8192):
        reps = 3 if quick else 7
        ms = _simulated_scoring(ranks, 200, 4, reps)
        metrics.append(
            Metric(
                AREA,
                f"simulated_scoring_{ranks}_ranks_200_kernels",
                ms,
                "ms",
                reps,
                detail={"ranks": ranks, "kernels": 200, "sections": 4},
            )
        )
    return metrics
