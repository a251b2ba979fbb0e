"""A rank for the straggler-feed test: rank 0 publishes a straggler report to its launcher.

Both ranks join a gloo group and gather their forward times (rank r: ``0.1 * (r + 1)`` s)
over whole steps of 0.4 s on both, so the wait fraction is known: ``(max - median) /
step`` = (0.2 - 0.15) / 0.4 = 0.125. Rank 0 first writes a file the
launcher must refuse and waits until the launcher journaled ``straggler_report_ignored``;
then it publishes, through :func:`nvrx.ft.publish_straggler_report`, a report-like object
with those step times over a window it measured, writes the window to
``<out>/published.json`` and waits for ``<out>/go`` (the test scrapes the metrics
first). Then it publishes a last report from the first one's end to now (its window in
``<out>/final.json``) and exits at once, without flushing.

``--restart``: cycle 0's rank 0 publishes the same report and both ranks exit 1 at once
(the report is written just before the fault); in cycle 1 rank 0 writes ``<out>/cycle1``
and no report, and both wait for ``<out>/go``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

from nvrx.ft import STRAGGLER_SCORES_ENV, flush_straggler_reports, publish_straggler_report

FORWARD_SECTION = "fwd"
STEP_SECTION = "train_step"
STEP_S = 0.4


@dataclasses.dataclass(frozen=True)
class Report:
    """The attribute names of nvrx.straggler.Report that the scores file takes."""

    gpu_relative_perf_scores: Mapping[int, float]
    gpu_individual_perf_scores: Mapping[int, float]
    section_relative_perf_scores: Mapping[str, Mapping[int, float]]
    section_individual_perf_scores: Mapping[str, Mapping[int, float]]
    rank_to_node: Mapping[int, str]
    section_median_times: Mapping[str, Mapping[int, float]]


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            print(f"rank 0: gave up waiting for {what}", file=sys.stderr, flush=True)
            raise SystemExit(4)
        time.sleep(0.05)


def _journaled(journal: pathlib.Path, event: str) -> bool:
    if not journal.exists():
        return False
    return any(
        f'"event": "{event}"' in line or f'"event":"{event}"' in line
        for line in journal.read_text(errors="replace").splitlines()
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--journal", type=pathlib.Path, required=True)
    parser.add_argument("--restart", action="store_true")
    args = parser.parse_args()
    if args.restart:
        return restart_run(args.out)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([0.1 * (rank + 1)], dtype=torch.float64)
    steps = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    start = time.time()
    dist.all_gather(steps, mine)
    time.sleep(1.0)
    end = time.time()
    if rank == 0:
        path = os.environ[STRAGGLER_SCORES_ENV]
        pathlib.Path(path).write_text("not a report")  # the launcher must refuse this one
        _wait_for(lambda: _journaled(args.journal, "straggler_report_ignored"), "the refusal")
        forward_s = {r: float(t.item()) for r, t in enumerate(steps)}  # 0.1 s and 0.2 s
        report = _report(forward_s)
        ok = publish_straggler_report(
            report,
            window_start=start,
            window_end=end,
            forward_section=FORWARD_SECTION,
            step_section=STEP_SECTION,
        )
        ok = ok and flush_straggler_reports(60.0)  # written by nvrx.ft's background thread
        published = {"ok": ok, "path": path, "start": start, "end": end, "forward_s": forward_s}
        (args.out / "published.json").write_text(json.dumps(published))
        _wait_for(lambda: (args.out / "go").exists(), "the test's go")
        # A last report just before the end, not flushed: nvrx.ft writes it as the
        # interpreter exits and the launcher reads it once more at the job's end.
        final_end = time.time()
        (args.out / "final.json").write_text(json.dumps({"start": end, "end": final_end}))
        publish_straggler_report(
            report,
            window_start=end,
            window_end=final_end,
            forward_section=FORWARD_SECTION,
            step_section=STEP_SECTION,
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _report(forward_s: Mapping[int, float]) -> Report:
    fastest = min(forward_s.values())
    relative = {r: fastest / s for r, s in forward_s.items()}
    return Report(
        gpu_relative_perf_scores=relative,
        gpu_individual_perf_scores=dict.fromkeys(forward_s, 0.9),
        section_relative_perf_scores={FORWARD_SECTION: relative},
        section_individual_perf_scores={},
        rank_to_node=dict.fromkeys(forward_s, "localhost"),
        section_median_times={
            FORWARD_SECTION: {r: s * 1000.0 for r, s in forward_s.items()},
            STEP_SECTION: dict.fromkeys(forward_s, STEP_S * 1000.0),
        },
    )


def restart_run(out: pathlib.Path) -> int:
    """Cycle 0 reports and fails; cycle 1 runs without a report until the test says go."""
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
    rank = dist.get_rank()
    if cycle == 0:
        if rank == 0:
            start = time.time()
            time.sleep(0.5)
            publish_straggler_report(
                _report({0: 0.1, 1: 0.2}),
                window_start=start,
                window_end=time.time(),
                forward_section=FORWARD_SECTION,
                step_section=STEP_SECTION,
            )
            if not flush_straggler_reports(60.0):
                return 4
        dist.barrier()  # the report is on disk: now the fault, on every rank at once
        return 1
    if rank == 0:
        (out / "cycle1").touch()
    _wait_for(lambda: (out / "go").exists(), "the test's go", timeout=120.0)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
