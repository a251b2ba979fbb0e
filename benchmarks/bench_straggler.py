"""Straggler detection costs: the section hot path and report generation.

* ``detection_section`` per entry with ``profile_cuda=False``: measured entries
  (``profiling_interval=1``) and unmeasured ones (``profiling_interval=1000``), next to
  a bare ``contextlib.contextmanager`` measured in the same run for scale. The default
  implementation (the C extension where it is built) and the Python fallback.
* ``generate_report`` in the three configurations of issue 16 against NVRx's, in the same
  run: world size 1 after 3 sections x 100 entries, right after 100,000 entries, and
  rank 0 of 2 gloo ranks (``profile_cuda=False``). NVRx (``NVRX_REFERENCE_PATH`` or
  installed) runs with its CUPTI manager stubbed; without it, the issue's figures are
  scaled by the contextmanager cost of this run. ``target`` is NVRx's figure.
* ``generate_report`` on rank 0 of 1, 2 and 4 gloo ranks, and at world size 1 after 100
  steps of 200 synthetic kernels.
* A simulated report at 1,024, 8,192 and 65,536 ranks x 10 sections x 200 kernels: the
  same code as after the gather (rows decoded by column, the Report assembled, the
  sustained-slowdown rule), with each rank's own scoring and a stand-in for the MIN
  all-reduce timed apart.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.metadata
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from _common import Metric, median_ns_per_call

from nvrx.straggler import (
    Detector,
    ReportGenerator,
    Statistic,
    StragglerDetector,
    SustainedSlowdownRule,
    SyntheticKernelRecord,
    SyntheticKernelTimer,
)
from nvrx.straggler import sections as sections_module
from nvrx.straggler.rank_row import ROW_VERSION, GatheredRows, RankRow

AREA = "straggler"


def _both(fn: Callable[[], object], quick: bool) -> tuple[float, float]:
    """(median wall ns, best thread-CPU ns) per call."""
    calls = 2_000 if quick else 20_000
    samples = 11 if quick else 31
    wall = median_ns_per_call(fn, calls_per_sample=calls, samples=samples)
    return wall, _thread_cpu_ns_per_call(fn, calls, samples)


@contextlib.contextmanager
def _python_fallback() -> Iterator[None]:
    """Detectors created inside use the Python hot path even where the C one is built."""
    saved = sections_module.hotpath
    sections_module.hotpath = None
    try:
        yield
    finally:
        sections_module.hotpath = saved


def _section_cost(
    profiling_interval: int, quick: bool, python: bool = False
) -> tuple[float, float]:
    """Cost of one ``with Detector.detection_section(name, profile_cuda=False)``."""
    with _python_fallback() if python else contextlib.nullcontext():
        Detector.initialize(
            profiling_interval=profiling_interval, kernel_timer=SyntheticKernelTimer()
        )

    def entry() -> None:
        with Detector.detection_section("bench", profile_cuda=False):
            pass

    try:
        return _both(entry, quick)
    finally:
        Detector.shutdown()


def _in_loop_cost(quick: bool) -> tuple[float, float]:
    """(median wall ns, best thread-CPU ns) per ``with`` entry inside one loop, the usual
    training loop shape (the caller's frame already exists), minus the empty loop."""
    Detector.initialize(kernel_timer=SyntheticKernelTimer())
    n = 2_000 if quick else 20_000
    section = Detector.detection_section

    def timed(clock: Callable[[], int], body: bool) -> float:
        start = clock()
        if body:
            for _ in range(n):
                with section("loop", profile_cuda=False):
                    pass
        else:
            for _ in range(n):
                pass
        return (clock() - start) / n

    try:
        samples = 11 if quick else 31
        wall = [
            timed(time.perf_counter_ns, True) - timed(time.perf_counter_ns, False)
            for _ in range(samples)
        ]
        cpu = [
            timed(time.thread_time_ns, True) - timed(time.thread_time_ns, False)
            for _ in range(samples)
        ]
        return statistics.median(wall), min(cpu)
    finally:
        Detector.shutdown()


def _thread_cpu_ns_per_call(fn: Callable[[], object], calls: int, samples: int) -> float:
    """Best of ``samples`` on this thread's CPU time: time spent descheduled is not
    counted, and the best sample is the one least disturbed by a loaded machine."""

    def loop(body: Callable[[], object]) -> float:
        start = time.thread_time_ns()
        for _ in range(calls):
            body()
        return (time.thread_time_ns() - start) / calls

    def empty() -> None:
        return None

    return min(loop(fn) - loop(empty) for _ in range(samples))


def _contextmanager_cost(quick: bool) -> tuple[float, float]:
    @contextlib.contextmanager
    def cm() -> Iterator[None]:
        yield

    def entry() -> None:
        with cm():
            pass

    return _both(entry, quick)


# -- generate_report against NVRx ------------------------------------------------------

# The issue's figures for NVRx 0.7.0's generate_report on this VM (ms), measured when a
# bare contextmanager entry cost ISSUE_CONTEXTMANAGER_US here (docs/benchmarks.md then).
# Used, scaled by the contextmanager cost of this run, only where NVRx cannot run.
ISSUE_NVRX_MS = {"world1_3x100": 0.26, "world1_after_100k": 1.2, "world2_rank0": 1.7}
ISSUE_CONTEXTMANAGER_US = 2.785


def _nvrx_straggler() -> Any:
    """NVRx's straggler module with CUPTI stubbed (its kernel timing needs a GPU), or None.

    Found on sys.path, or in ``NVRX_REFERENCE_PATH`` (an unpacked
    nvidia-resiliency-ext wheel: ``pip download --no-deps nvidia-resiliency-ext==0.4.1``).
    Only its CUPTI manager and ``torch.cuda.synchronize`` are replaced; the section
    timing and ReportGenerator that run are NVRx's own.
    """
    extra = os.environ.get("NVRX_REFERENCE_PATH")
    if extra and extra not in sys.path:
        sys.path.append(extra)
    try:
        nvrx: Any = importlib.import_module("nvidia_resiliency_ext.straggler.straggler")
    except Exception:
        return None

    class NoCupti:
        def __init__(self, *args: object, **kwargs: object) -> None: ...

        def initialize(self) -> None: ...

        def shutdown(self) -> None: ...

        def start_profiling(self) -> None: ...

        def stop_profiling(self) -> None: ...

        def get_results(self) -> dict[str, object]:
            return {}

        def reset_results(self) -> None: ...

    nvrx.CuptiManager = NoCupti
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
    return nvrx


def _version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        path = os.environ.get("NVRX_REFERENCE_PATH", "")
        found = sorted(pathlib.Path(path).glob("nvidia_resiliency_ext-*.dist-info")) if path else []
        return found[0].name.split("-")[1] if found else "unknown"


CPU_TIMES: list[float] = []
"""Thread-CPU ms of the reports the last ``_report_times`` call timed (no waiting)."""


def _report_times(which: str, scenario: str, reps: int) -> list[float]:
    """Milliseconds of ``generate_report`` in one process (world size 1 or a gloo rank).

    ``scenario``: ``3x100`` (3 sections x 100 entries per report) or ``100k`` (one
    section entered 100,000 times before each report), profile_cuda=False. The garbage
    collector is off while a report is timed, for ours and NVRx's alike.
    """
    if which == "nvrx":
        nvrx = _nvrx_straggler()
        assert nvrx is not None
        det: Any = nvrx.Detector
        det.initialize(node_name="bench")
        section = det.detection_section
    else:
        inst = Detector.initialize(kernel_timer=SyntheticKernelTimer(), node_name="bench")
        det = Detector
        section = inst.detection_section
    times: list[float] = []
    cpu = CPU_TIMES
    cpu.clear()
    names = ("a", "b", "c")
    try:
        for _ in range(reps):
            if scenario == "3x100":
                for _ in range(100):
                    for name in names:
                        with section(name, profile_cuda=False):
                            pass
            else:
                for _ in range(100_000):
                    with section("a", profile_cuda=False):
                        pass
            if torch.distributed.is_initialized():
                torch.distributed.barrier()
            gc.collect()
            gc.disable()  # as timeit does: a collection of torch's objects is ms, for either
            try:
                t0 = time.perf_counter_ns()
                c0 = time.thread_time_ns()
                det.generate_report()
                cpu.append((time.thread_time_ns() - c0) / 1e6)
                times.append((time.perf_counter_ns() - t0) / 1e6)
            finally:
                gc.enable()
    finally:
        det.shutdown()
    return times


def _rank_main(argv: list[str]) -> None:
    """``bench_straggler.py --rank WHICH RANK WORLD PORT OUT REPS``: one gloo rank."""
    which, rank, world, port, out, reps = argv
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.distributed.init_process_group("gloo", rank=int(rank), world_size=int(world))
    try:
        times = _report_times(which, "3x100", int(reps))
    finally:
        torch.distributed.destroy_process_group()
    if rank == "0":
        pathlib.Path(out).write_text(json.dumps({"wall": times, "cpu": CPU_TIMES}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ranks_report_ms(which: str, world: int, reps: int) -> float:
    """Median ``generate_report`` ms on rank 0 of ``world`` gloo ranks (real processes)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "rank0.json"
        port = str(_free_port())
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--rank",
                    which,
                    str(r),
                    str(world),
                    port,
                    str(out),
                    str(reps),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for r in range(world)
        ]
        try:
            errors = [p.communicate(timeout=300)[1] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        failed = [p.returncode for p in procs if p.returncode]
        if failed:
            raise RuntimeError(f"bench ranks failed: {errors[0].decode()[-2000:]}")
        measured = json.loads(out.read_text())
        CPU_TIMES[:] = measured["cpu"]
        return float(statistics.median(measured["wall"][1:]))


def _compare_with_nvrx(quick: bool, cm_us: float) -> list[Metric]:
    """generate_report in the issue's three configurations, ours against NVRx's."""
    reps = 5 if quick else 21
    nvrx_here = _nvrx_straggler() is not None
    scale = cm_us / ISSUE_CONTEXTMANAGER_US
    configs: list[tuple[str, Callable[[str], float]]] = [
        ("world1_3x100", lambda w: statistics.median(_report_times(w, "3x100", reps)[1:])),
        (
            "world1_after_100k",
            lambda w: statistics.median(_report_times(w, "100k", 3 if quick else 5)[1:]),
        ),
        ("world2_rank0", lambda w: _ranks_report_ms(w, 2, reps)),
    ]
    metrics = []
    for name, measure in configs:
        ours = measure("ours")
        ours_cpu = statistics.median(CPU_TIMES[1:])
        baseline_cpu = None
        if nvrx_here:
            baseline = measure("nvrx")
            baseline_cpu = statistics.median(CPU_TIMES[1:])
            how = f"NVRx {_version_of('nvidia-resiliency-ext')} in this run (CUPTI stubbed)"
        else:
            baseline = ISSUE_NVRX_MS[name] * scale
            how = (
                f"issue figure {ISSUE_NVRX_MS[name]} ms x contextmanager {cm_us:.3f} us / "
                f"{ISSUE_CONTEXTMANAGER_US} us (NVRx not importable here)"
            )
        metrics.append(
            Metric(
                AREA,
                f"generate_report_{name}",
                ours,
                "ms",
                reps,
                target=baseline,
                detail={
                    "nvrx_ms": baseline,
                    "ratio_to_nvrx": ours / baseline,
                    "baseline": how,
                    "rank0_thread_cpu_ms": ours_cpu,
                    "nvrx_rank0_thread_cpu_ms": baseline_cpu,
                },
            )
        )
    return metrics


def _report_ranks(quick: bool) -> list[Metric]:
    """Our generate_report on rank 0 of 1, 2 and 4 gloo ranks (3 sections x 100 entries)."""
    reps = 5 if quick else 21
    metrics = []
    for world in (1, 2, 4):
        if world == 1:
            ms = statistics.median(_report_times("ours", "3x100", reps)[1:])
        else:
            ms = _ranks_report_ms("ours", world, reps)
        metrics.append(
            Metric(AREA, f"generate_report_{world}_ranks", ms, "ms", reps, detail={"ranks": world})
        )
    return metrics


def _report_world1_kernels(quick: bool) -> tuple[float, int]:
    """A world-size-1 report after 100 steps of 200 synthetic kernels and 2 sections."""
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


def _summary(med: float, num: float) -> dict[Statistic, float]:
    return {
        Statistic.MIN: med * 0.9,
        Statistic.MAX: med * 1.2,
        Statistic.MED: med,
        Statistic.AVG: med,
        Statistic.STD: med * 0.05,
        Statistic.NUM: num,
    }


def _simulated_report(ranks: int, kernels: int, sections: int, reps: int) -> dict[str, float]:
    """CPU milliseconds per phase of one report at ``ranks`` ranks, without collectives.

    ``local`` is what every rank does in parallel (score itself from its summaries:
    ReportGenerator at world size 1, the same code); ``reduce`` stands in for the MIN
    all-reduce (a tensor minimum over every rank's vector: the network's work);
    ``decode`` and ``assemble`` are rank 0 after the gather: reading the rows by column
    and building the Report; ``rule`` is the sustained-slowdown rule on that report.
    """
    gen = torch.Generator().manual_seed(ranks)
    k_names = [f"kernel_{i}_blk_128_1_1_grid_64_1_1" for i in range(kernels)]
    s_names = [f"section_{i}" for i in range(sections)]
    local = ReportGenerator(node_name="bench")
    k_sum = {n: _summary(100.0 + i, 50.0) for i, n in enumerate(k_names)}
    s_sum = {n: _summary(20.0 + i, 100.0) for i, n in enumerate(s_names)}
    local.generate_report(s_sum, k_sum)  # names get ids once, as in steady state

    rank0 = ReportGenerator(node_name="bench")  # the rule is timed on its own below
    rule = SustainedSlowdownRule()
    rank0.name_mapper.assign([(s_names, k_names)])
    rank0.rank_to_node = {r: f"node{r // 8}" for r in range(ranks)}
    vectors = torch.rand((ranks, 2 * kernels + sections + 2), generator=gen, dtype=torch.float64)
    # window noise of 1% around 0.95 (relative to the fastest rank), one rank 20% slower
    noise = torch.randn((ranks, 2 + 2 * sections), generator=gen, dtype=torch.float64)
    scores = 0.95 * (1 + 0.01 * noise)
    scores[ranks // 3, :] /= 1.2
    scores[ranks // 2, :] = float("nan")  # one rank with nothing comparable
    matrix = torch.zeros((ranks, RankRow.length(sections)), dtype=torch.float64)
    matrix[:, 0] = ROW_VERSION
    matrix[:, 1] = sections
    matrix[:, 2] = scores[:, 0]  # gpu individual
    matrix[:, 4] = scores[:, 1]  # gpu relative
    matrix[:, 3] = matrix[:, 5] = torch.isnan(scores[:, 0]).double()
    matrix[:, 6] = 12.5
    base = 8
    matrix[:, base : base + sections] = scores[:, 2 : 2 + sections]
    matrix[:, base + 2 * sections : base + 3 * sections] = scores[:, 2 + sections :]
    nan_rank = torch.isnan(scores[:, 2:3]).double()
    matrix[:, base + sections : base + 2 * sections] = nan_rank
    matrix[:, base + 3 * sections : base + 4 * sections] = nan_rank
    matrix[:, base + 4 * sections :] = 20.0
    clock = time.thread_time_ns  # this thread's CPU time: the machine's load is not counted
    phases: dict[str, list[float]] = {
        "local": [],
        "reduce": [],
        "decode": [],
        "assemble": [],
        "rule": [],
    }
    gc.disable()  # as timeit does; the phases allocate millions of objects
    for _ in range(reps):
        t0 = clock()
        local.generate_report(s_sum, k_sum)
        t1 = clock()
        vectors.min(dim=0)
        t2 = clock()
        rows = GatheredRows(range(ranks), matrix.T.contiguous().tolist())
        t3 = clock()
        report = rank0.assemble(rows, s_sum, k_sum, None)
        t4 = clock()
        rule.update(report)
        t5 = clock()
        for name, a, b in (
            ("local", t0, t1),
            ("reduce", t1, t2),
            ("decode", t2, t3),
            ("assemble", t3, t4),
            ("rule", t4, t5),
        ):
            phases[name].append((b - a) / 1e6)
        del rows, report
        gc.enable()
        gc.collect()
        gc.disable()
    gc.enable()
    return {name: statistics.median(v) for name, v in phases.items()}


def run(quick: bool) -> list[Metric]:
    """Measure the hot path, a world-size-1 report and simulated scoring at scale."""
    samples = 11 if quick else 31
    cm, cm_cpu = _contextmanager_cost(quick)
    measured, measured_cpu = _section_cost(1, quick)
    unmeasured, unmeasured_cpu = _section_cost(1000, quick)
    py_measured, py_measured_cpu = _section_cost(1, quick, python=True)
    py_unmeasured, py_unmeasured_cpu = _section_cost(1000, quick, python=True)
    implementation = sections_module.HOT_PATH
    in_loop, in_loop_cpu = _in_loop_cost(quick)
    report_ms, report_reps = _report_world1_kernels(quick)
    # The 0.5 us budget was set where a bare contextmanager costs 0.7 us; on a slower or
    # loaded machine compare the ratio instead: 0.5 / 0.7 = 0.71.
    metrics = [
        Metric(
            AREA,
            "detection_section_measured_entry",
            measured / 1000,
            "us",
            samples,
            target=0.5,
            detail={
                "best_thread_cpu_us": measured_cpu / 1000,
                "ratio_to_contextmanager": measured / cm,
                "ratio_to_contextmanager_cpu": measured_cpu / cm_cpu,
                "ratio_budget": 0.5 / 0.7,
                "api": "Detector.detection_section(name, profile_cuda=False)",
                "implementation": implementation,
            },
        ),
        Metric(
            AREA,
            "detection_section_measured_entry_in_loop",
            in_loop / 1000,
            "us",
            samples,
            target=0.5,
            detail={
                "best_thread_cpu_us": in_loop_cpu / 1000,
                "ratio_to_contextmanager": in_loop / cm,
                "ratio_to_contextmanager_cpu": in_loop_cpu / cm_cpu,
                "ratio_budget": 0.5 / 0.7,
                "implementation": implementation,
            },
        ),
        Metric(
            AREA,
            "detection_section_unmeasured_entry",
            unmeasured / 1000,
            "us",
            samples,
            target=measured / 1000,
            detail={
                "profiling_interval": 1000,
                "best_thread_cpu_us": unmeasured_cpu / 1000,
                "ratio_to_contextmanager": unmeasured / cm,
                "ratio_to_contextmanager_cpu": unmeasured_cpu / cm_cpu,
                "implementation": implementation,
            },
        ),
        Metric(
            AREA,
            "detection_section_measured_entry_python",
            py_measured / 1000,
            "us",
            samples,
            detail={
                "best_thread_cpu_us": py_measured_cpu / 1000,
                "ratio_to_contextmanager": py_measured / cm,
                "implementation": "python (the fallback where the C extension is not built)",
            },
        ),
        Metric(
            AREA,
            "detection_section_unmeasured_entry_python",
            py_unmeasured / 1000,
            "us",
            samples,
            detail={
                "profiling_interval": 1000,
                "best_thread_cpu_us": py_unmeasured_cpu / 1000,
                "ratio_to_contextmanager": py_unmeasured / cm,
            },
        ),
        Metric(
            AREA,
            "contextmanager_entry_baseline",
            cm / 1000,
            "us",
            samples,
            detail={"best_thread_cpu_us": cm_cpu / 1000},
        ),
        Metric(
            AREA,
            "generate_report_world1_200_kernels",
            report_ms,
            "ms",
            report_reps,
            detail={"sections": 2, "kernels": 200, "samples_per_kernel": 100},
        ),
    ]
    metrics += _compare_with_nvrx(quick, cm / 1000)
    metrics += _report_ranks(quick)
    previous: tuple[int, float] | None = None
    for ranks in (1024, 8192, 65536):
        reps = 3 if quick else 7
        phases = _simulated_report(ranks, 200, 10, reps)
        rank0_ms = phases["decode"] + phases["assemble"] + phases["rule"]
        detail: dict[str, object] = {
            "ranks": ranks,
            "kernels": 200,
            "sections": 10,
            "phases_ms": phases,
            "rank0_after_gather_ms": rank0_ms,
            "rank0_us_per_rank": rank0_ms * 1000 / ranks,
        }
        if previous is not None:
            detail["growth_vs_previous"] = rank0_ms / previous[1]
            detail["ranks_ratio_vs_previous"] = ranks / previous[0]
        previous = (ranks, rank0_ms)
        metrics.append(
            Metric(
                AREA,
                f"simulated_report_{ranks}_ranks_10_sections_200_kernels",
                phases["local"] + rank0_ms,
                "ms",
                reps,
                detail=detail,
            )
        )
    return metrics


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        _rank_main(sys.argv[2:])
