"""Straggler reports handed to ft_launcher: what the training loop pays, and the launcher.

* ``publish_call``: one ``nvrx.ft.publish_straggler_report`` call on the training loop
  (the hand-over to the writer thread), at 1,024 and 16,384 ranks; ``target`` is ours:
  well under one training step.
* ``background_write``: the writer thread's conversion and atomic replace of the file
  that follows (off the training loop, but sharing its interpreter's GIL).
* ``feed_poll_unchanged``: the launcher's once-a-second look at a file that did not
  change (one ``lstat``), and ``feed_read``: reading and validating a 1,024-rank file
  (only when it changed).
* ``feed_max_tick_stall``: the largest report the format allows (131,072 ranks) read
  as the launcher does, by its feed's helper thread, while a loop standing in for the
  agent's ticks every 10 ms: the longest gap between two ticks (what failure handling
  could wait), with the read-to-gauges time and the peak memory in the detail.

Reports are synthetic: per rank, GPU and forward-section scores and medians.
"""

from __future__ import annotations

import os
import pathlib
import resource
import statistics
import tempfile
import time
import types

from _common import Metric, median_ns_per_call

from nvrx.ft import (
    STRAGGLER_SCORES_ENV,
    flush_straggler_reports,
    publish_straggler_report,
    read_straggler_scores,
)
from nvrx.ft._formats.straggler_scores import MAX_STRAGGLER_SCORES_RANKS
from nvrx.launcher._straggler_feed import StragglerFeed

AREA = "straggler_scores"
#: Our budget for the hand-over on the training loop (ms): a small fraction of a step.
PUBLISH_TARGET_MS = 1.0


def _report(ranks: int) -> types.SimpleNamespace:
    """A report with nvrx.straggler.Report's attribute names (the file's contract is
    structural). Not a dataclass: run.py loads this module without registering it."""
    relative = {r: 1.0 - (r % 7) * 0.01 for r in range(ranks)}
    return types.SimpleNamespace(
        gpu_relative_perf_scores=relative,
        gpu_individual_perf_scores=dict.fromkeys(range(ranks), 0.95),
        section_relative_perf_scores={"fwd": relative},
        section_individual_perf_scores={"fwd": dict.fromkeys(range(ranks), 0.97)},
        rank_to_node={r: f"node-{r // 8:05d}" for r in range(ranks)},
        section_median_times={
            "fwd": {r: 100.0 + r % 7 for r in range(ranks)},
            "train_step": dict.fromkeys(range(ranks), 400.0),
        },
    )


def _publish(ranks: int, samples: int) -> list[Metric]:
    report = _report(ranks)
    calls_ms: list[float] = []
    writes_ms: list[float] = []
    for i in range(samples):
        start = time.perf_counter()
        handed = publish_straggler_report(
            report,
            window_start=float(i),
            window_end=float(i + 1),
            forward_section="fwd",
            step_section="train_step",
        )
        handed_at = time.perf_counter()
        if not handed or not flush_straggler_reports(60.0):
            raise RuntimeError("the report was not written")
        calls_ms.append((handed_at - start) * 1e3)
        writes_ms.append((time.perf_counter() - handed_at) * 1e3)
    return [
        Metric(
            AREA,
            f"publish_call_{ranks}_ranks_ms",
            statistics.median(calls_ms),
            "ms",
            samples,
            target=PUBLISH_TARGET_MS,
            detail={"max_ms": max(calls_ms)},
        ),
        Metric(
            AREA,
            f"background_write_{ranks}_ranks_ms",
            statistics.median(writes_ms),
            "ms",
            samples,
            detail={"max_ms": max(writes_ms)},
        ),
    ]


def _feed(path: pathlib.Path, samples: int) -> list[Metric]:
    feed = StragglerFeed(path, period_s=0.0)
    if feed.poll() is None:
        raise RuntimeError("the launcher's feed did not read the file")
    poll_ns = median_ns_per_call(feed.poll, calls_per_sample=1_000, samples=samples)
    reads_ms = []
    for _ in range(samples):
        start = time.perf_counter()
        read_straggler_scores(path)
        reads_ms.append((time.perf_counter() - start) * 1e3)
    ranks = len(read_straggler_scores(path).ranks)
    return [
        Metric(AREA, "feed_poll_unchanged_us", poll_ns / 1e3, "us", samples),
        Metric(AREA, f"feed_read_{ranks}_ranks_ms", statistics.median(reads_ms), "ms", samples),
    ]


def _feed_max(path: pathlib.Path) -> list[Metric]:
    ranks = MAX_STRAGGLER_SCORES_RANKS
    if not publish_straggler_report(
        _report(ranks), window_start=0.0, window_end=1.0, forward_section="fwd",
        step_section="train_step",
    ) or not flush_straggler_reports(600.0):  # fmt: skip
        raise RuntimeError("the largest report was not written")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    feed = StragglerFeed(path, period_s=0.0)
    gaps_ms: list[float] = []
    start = last = time.perf_counter()
    got = None
    while got is None and last - start < 600:
        got = feed.poll()
        if got is not None:  # what the agent does with a new report
            feed.show(got)
            feed.wait(got)
            feed.worst(got)
        time.sleep(0.01)
        now = time.perf_counter()
        gaps_ms.append((now - last) * 1e3 - 10.0)
        last = now
    if got is None:
        raise RuntimeError("the feed never read the largest report")
    return [
        Metric(
            AREA,
            f"feed_max_{ranks}_ranks_tick_stall_ms",
            max(gaps_ms),
            "ms",
            1,
            detail={
                "read_to_gauges_s": last - start,
                "ticks": len(gaps_ms),
                "median_gap_ms": statistics.median(gaps_ms),
                "file_bytes": path.stat().st_size,
                "peak_rss_growth_mib": (
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
                )
                / 1024,
            },
        )
    ]


def run(quick: bool) -> list[Metric]:
    """Publish at two world sizes into a private file, then read it as the launcher does."""
    samples = 5 if quick else 21
    saved = os.environ.get(STRAGGLER_SCORES_ENV)
    with tempfile.TemporaryDirectory(prefix="nvrx-bench-scores-") as tmp:
        path = pathlib.Path(tmp) / "scores.json"
        os.environ[STRAGGLER_SCORES_ENV] = str(path)
        try:
            metrics = _publish(16_384, max(3, samples // 3))
            metrics = _publish(1_024, samples) + metrics  # the file now holds 1,024 ranks
            return metrics + _feed(path, samples) + _feed_max(path)
        finally:
            if saved is None:
                os.environ.pop(STRAGGLER_SCORES_ENV, None)
            else:
                os.environ[STRAGGLER_SCORES_ENV] = saved
