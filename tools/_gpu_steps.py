"""The steps of ``tools/gpu_check.py``, one per process: ``_gpu_steps.py NAME --result F``.

Each step writes ``{"status", "reason", "figures"}`` as JSON to ``F``: ``passed`` when
every check in ``figures["checks"]`` held, ``failed`` otherwise or on an exception
(its figures so far are kept), ``not_available`` when the feature it measures does not
exist yet. ``gpu_check.py`` runs each with a time budget and kills what is left.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import logging
import math
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
ITESTS = ROOT / "tests-integration"
CUDA_STEPS = ITESTS / "scripts" / "cuda_steps.py"
CPU_BENCH = ROOT / "benchmarks" / "results" / "latest.json"
PACKAGES = ["nvrx-ft-core", "nvrx-ft-launcher", "nvrx-straggler", "nvrx-ptl"]

Figures = dict[str, Any]


class NotAvailable(Exception):
    """The feature this step measures does not exist (yet): the step says so."""


def _check(figures: Figures, name: str, ok: bool) -> None:
    figures.setdefault("checks", {})[name] = bool(ok)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def _finite(value: float, digits: int = 6) -> float | None:
    return round(value, digits) if math.isfinite(value) else None


def _stats(summary: Any) -> dict[str, float | None]:
    """A section or kernel summary (Statistic -> value) as JSON."""
    return {str(k): _finite(float(v)) for k, v in summary.items()}


def _scores(scores: Any) -> Any:
    """Scores by rank (or by section, then rank) as JSON, NaN as None."""
    if isinstance(scores, dict) or hasattr(scores, "items"):
        return {str(k): _scores(v) for k, v in scores.items()}
    return _finite(float(scores))


# -- environment --------------------------------------------------------------------------


def step_environment(figures: Figures, budget: float) -> None:
    import torch

    figures["torch"] = torch.__version__
    figures["torch_cuda"] = torch.version.cuda
    figures["cuda_available"] = torch.cuda.is_available()
    versions: dict[str, str | None] = {}
    for name in ["cupti-python", "nvidia-ml-py", "lightning", "pytorch-lightning", *PACKAGES]:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    figures["packages"] = versions
    import nvrx.launcher
    import nvrx.straggler.sections as sections

    figures["nvrx_from"] = str(pathlib.Path(nvrx.launcher.__file__).parent)
    figures["straggler_hot_path"] = sections.HOT_PATH
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        figures["gpu"] = {
            "name": props.name,
            "count": torch.cuda.device_count(),
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
        }
        cudnn: Any = torch.backends.cudnn  # its version() is untyped
        nccl: Any = torch.cuda.nccl
        figures["cudnn"] = cudnn.version()
        with contextlib.suppress(Exception):
            figures["nccl"] = ".".join(map(str, nccl.version()))
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        figures["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
        pynvml.nvmlShutdown()
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        figures["nvidia_smi"] = smi.stdout.strip()[:2000]
    _check(figures, "nvrx_imports", True)


# -- straggler: CUPTI and sections around real kernels ------------------------------------


def _report_figures(report: Any) -> Figures:
    kernels = report.local_kernel_summaries
    top = sorted(kernels.items(), key=lambda kv: -float(kv[1].get(_stat("NUM"), 0)))[:5]
    return {
        "sections": {n: _stats(s) for n, s in report.local_section_summaries.items()},
        "kernel_names": len(kernels),
        "kernel_records": int(sum(float(s.get(_stat("NUM"), 0)) for s in kernels.values())),
        "top_kernels": {n[:120]: _stats(s) for n, s in top},
        "gpu_relative_perf_scores": _scores(report.gpu_relative_perf_scores),
        "gpu_individual_perf_scores": _scores(report.gpu_individual_perf_scores),
        "section_relative_perf_scores": _scores(report.section_relative_perf_scores),
        "section_individual_perf_scores": _scores(report.section_individual_perf_scores),
        "gpu_kernel_times_us": _scores(report.gpu_kernel_times),
        "dropped_kernel_records": {
            str(k): int(v) for k, v in report.dropped_kernel_records.items()
        },
        "kernel_timing": (
            dataclasses.asdict(report.kernel_timing) if report.kernel_timing is not None else None
        ),
        "generate_report_ms": _finite(float(report.generate_report_elapsed_time)),
    }


def _stat(name: str) -> Any:
    from nvrx.straggler import Statistic

    return Statistic[name]


def _per_entry_ns(enter: Callable[[], Any], entries: int = 20_000, samples: int = 7) -> float:
    """Median ns per ``with enter(): pass`` over ``samples`` loops of ``entries``."""
    times = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        for _ in range(entries):
            with enter():
                pass
        times.append((time.perf_counter_ns() - start) / entries)
    return _median(times)


def _cpu_reference() -> dict[str, float]:
    """The CPU figures of the latest ``nox -s bench`` (benchmarks/results/latest.json)."""
    wanted = {
        "detection_section_measured_entry",
        "detection_section_unmeasured_entry",
        "contextmanager_entry_baseline",
    }
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = json.loads(CPU_BENCH.read_text())
        return {
            m["name"] + "_us": float(m["value"])
            for m in data["metrics"]
            if m.get("area") == "straggler" and m.get("name") in wanted
        }
    return {}


def step_straggler(figures: Figures, budget: float) -> None:
    import torch

    from nvrx.straggler import StragglerDetector
    from nvrx.straggler._cupti_timer import CuptiKernelTimer

    det = StragglerDetector(report_time_interval=1e9)
    try:
        timer = det.kernel_timer
        figures["kernel_timer"] = type(timer).__name__
        figures["kernel_timer_status"] = dataclasses.asdict(timer.status)
        _check(figures, "cupti_timer_in_use", isinstance(timer, CuptiKernelTimer))
        a = torch.randn(4096, 4096, device="cuda")
        for _ in range(3):
            a @ a
        torch.cuda.synchronize()

        def window(extra_kernel: bool, steps: int = 30) -> Any:
            for _ in range(steps):
                with det.detection_section("steady", profile_cuda=True):
                    a @ a
                    torch.cuda.synchronize()
                with det.detection_section("slowed", profile_cuda=True):
                    a @ a
                    if extra_kernel:  # the slowdown: one more kernel in this section
                        a @ a
                    torch.cuda.synchronize()
            return det.generate_report()

        baseline = window(extra_kernel=False)
        slowed = window(extra_kernel=True)
        figures["baseline_window"] = _report_figures(baseline)
        figures["slowed_window"] = _report_figures(slowed)
        _check(figures, "kernel_records_arrived", figures["baseline_window"]["kernel_records"] > 0)
        med = _stat("MED")
        ratio = float(slowed.local_section_summaries["slowed"][med]) / float(
            slowed.local_section_summaries["steady"][med]
        )
        figures["slowed_over_steady_section_time"] = _finite(ratio, 3)
        _check(figures, "slowed_section_about_twice_as_long", 1.5 < ratio < 2.6)
        individual = slowed.section_individual_perf_scores
        slowed_score = individual.get("slowed", {}).get(0, math.nan)
        steady_score = individual.get("steady", {}).get(0, math.nan)
        figures["slowed_individual_score"] = _finite(float(slowed_score), 3)
        figures["steady_individual_score"] = _finite(float(steady_score), 3)
        _check(figures, "slowed_section_scores_below_steady", slowed_score < steady_score)
        _check(figures, "slowed_section_is_a_straggler", slowed_score < 0.75)

        # A burst of tiny kernels in one section: do CUPTI's records all arrive?
        small = torch.zeros(16, device="cuda")
        burst = 20_000
        with det.detection_section("burst", profile_cuda=True):
            for _ in range(burst):
                small.add_(1)
            torch.cuda.synchronize()
        report = det.generate_report()
        got = _report_figures(report)
        figures["burst"] = {
            "kernels_launched": burst,
            "kernel_records": got["kernel_records"],
            "dropped_kernel_records": got["dropped_kernel_records"],
            "kernel_timing": got["kernel_timing"],
        }
        dropped = sum(got["dropped_kernel_records"].values())
        _check(figures, "burst_records_accounted", got["kernel_records"] + dropped >= burst)

        # Per-entry cost of an empty section, CUPTI on and off, against the CPU figures.
        cost = {
            "profile_cuda_true_ns": _per_entry_ns(
                lambda: det.detection_section("empty_cupti", profile_cuda=True)
            ),
            "profile_cuda_false_ns": _per_entry_ns(
                lambda: det.detection_section("empty_host", profile_cuda=False)
            ),
            "contextmanager_ns": _per_entry_ns(contextlib.nullcontext),
        }
        figures["per_entry"] = {k: _finite(v, 1) for k, v in cost.items()}
        figures["per_entry_cpu_reference"] = _cpu_reference()
        det.generate_report()
    finally:
        det.close()


# -- CUDA-event section timing ------------------------------------------------------------


def step_cuda_events(figures: Figures, budget: float) -> None:
    import torch

    from nvrx.straggler import StragglerDetector

    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    reference = []
    for _ in range(10):
        event: Any = torch.cuda.Event  # untyped in torch's stubs
        start, end = event(enable_timing=True), event(enable_timing=True)
        start.record()
        a @ a
        end.record()
        end.synchronize()
        reference.append(start.elapsed_time(end))
    figures["reference_matmul_ms"] = _finite(_median(reference))
    det = StragglerDetector(report_time_interval=1e9, cuda_event_timing=True)
    try:
        for _ in range(20):
            with det.detection_section("async_matmul", profile_cuda=True):
                a @ a  # launched, not waited for: the host time is the launch alone
        torch.cuda.synchronize()
        report = det.generate_report()
        assert report is not None
        summaries = report.local_section_summaries
        med = _stat("MED")
        host = float(summaries["async_matmul"][med])
        gpu_section = summaries.get("async_matmul [cuda]")
        _check(figures, "cuda_section_reported", gpu_section is not None)
        if gpu_section is None:
            return
        gpu = float(gpu_section[med])
        figures["host_ms"] = _stats(summaries["async_matmul"])
        figures["gpu_ms"] = _stats(gpu_section)
        figures["gpu_over_host"] = _finite(gpu / host, 2) if host > 0 else None
        _check(figures, "gpu_time_exceeds_host_time", gpu > host)
        _check(
            figures,
            "gpu_time_near_the_reference",
            0.5 * _median(reference) <= gpu <= 2.0 * _median(reference) + 0.05,
        )
    finally:
        det.close()


# -- NVML health and memory reclaim -------------------------------------------------------

_HOLDER = (
    "import sys, time, torch\n"
    "x = torch.empty(int(sys.argv[1]) * 2**20, dtype=torch.uint8, device='cuda:0')\n"
    "x.fill_(1); torch.cuda.synchronize(); print('held', flush=True); time.sleep(300)\n"
)


def step_nvml_reclaim(figures: Figures, budget: float) -> None:
    from nvrx.ft._health import GpuHealthCheck
    from nvrx.launcher._gpu_memory import nvml_reader, wait_for_reclaim
    from nvrx.launcher._node_health import check_gpus

    start = time.perf_counter()
    check = GpuHealthCheck(local_rank=0, logger=logging.getLogger("gpu_check"))
    try:
        figures["rank_check_active"] = check.active
        figures["pci_bus_id"] = check.pci_bus_id
        t0 = time.perf_counter()
        check.check()
        figures["rank_check_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    finally:
        check.close()
    figures["rank_check_with_init_ms"] = round((time.perf_counter() - start) * 1e3, 3)
    _check(figures, "rank_health_check_active", figures["rank_check_active"])
    t0 = time.perf_counter()
    failures, skipped = check_gpus()
    figures["node_check_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    figures["node_check_failures"] = [f.to_json() for f in failures]
    figures["node_check_skipped"] = skipped
    _check(figures, "node_health_check_ran_and_passed", skipped is None and not failures)

    read, why = nvml_reader()
    figures["nvml_reader"] = why or "ok"
    _check(figures, "nvml_reader_available", read is not None)
    if read is None:
        return
    baseline = dict(read().used_mb)
    hold_mb = 8192
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(hold_mb)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline().strip()
        _check(figures, "holder_allocated", line == "held")
        reading = read()
        figures["held_mb_over_baseline"] = {
            str(g): round(u - baseline.get(g, 0.0)) for g, u in reading.used_mb.items()
        }
        figures["holder_listed_by_nvml"] = any(p.pid == holder.pid for p in reading.processes)
        figures["processes_listed"] = len(reading.processes)
        held = wait_for_reclaim(read, baseline, timeout=1, tolerance_mb=512, poll_interval=0.2)
        _check(figures, "held_memory_seen", not held.reclaimed)
        killed = time.monotonic()
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        reaped = time.monotonic() - killed
        back = wait_for_reclaim(read, baseline, timeout=30, tolerance_mb=512, poll_interval=0.02)
        figures["kill_to_reaped_s"] = round(reaped, 4)
        figures["reclaim_wait_s"] = round(back.waited_s, 4)
        figures["kill_to_reclaimed_s"] = round(time.monotonic() - killed, 4)
        figures["reclaim"] = back.describe()
        _check(figures, "memory_reclaimed", back.reclaimed)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)


# -- ft_launcher with 2 ranks on the GPU --------------------------------------------------

_NCCL_PROBE = (
    "import datetime, os, torch, torch.distributed as dist\n"
    "torch.cuda.set_device(0)\n"
    "dist.init_process_group('nccl', timeout=datetime.timedelta(seconds=30),"
    " device_id=torch.device('cuda', 0))\n"
    "t = torch.ones(1, device='cuda'); dist.all_reduce(t); torch.cuda.synchronize()\n"
    "print('sum', int(t.item()), flush=True); dist.destroy_process_group()\n"
)


def nccl_on_one_gpu(timeout: float = 45.0) -> tuple[bool, str]:
    """Whether 2 NCCL ranks on GPU 0 can all-reduce here (NCCL may refuse a shared GPU)."""
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))  # fmt: skip
        procs.append(
            subprocess.Popen([sys.executable, "-c", _NCCL_PROBE], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )  # fmt: skip
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        return False, f"no answer within {timeout:.0f} s"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    if all(p.returncode == 0 and "sum 2" in o for p, o in zip(procs, outputs, strict=False)):
        return True, "ok"
    return False, " | ".join(o.strip().splitlines()[-1] if o.strip() else "" for o in outputs)


def _first_step_after(journal: list[dict[str, Any]], attempt: int) -> float | None:
    """When every rank had run its first step of ``attempt`` (the latest rank's first)."""
    firsts: dict[int, float] = {}
    for e in journal:
        if e["event"] == "step" and e["attempt"] == attempt:
            firsts[e["rank"]] = min(firsts.get(e["rank"], math.inf), e["t"])
    return max(firsts.values()) if firsts else None


def _launcher_run(
    name: str, backend: str, warm: bool, tmp: pathlib.Path, timeout: float
) -> Figures:
    import importlib

    sys.path.insert(0, str(ITESTS))
    harness: Any = importlib.import_module("itest_harness")
    FAST_FT, LauncherRun = harness.FAST_FT, harness.LauncherRun
    assert_every_step_once, read_jsonl = harness.assert_every_step_once, harness.read_jsonl

    steps = 12
    out = tmp / name / "out"
    logs = tmp / name / "logs"
    out.mkdir(parents=True)
    logs.mkdir(parents=True)
    launcher_journal = tmp / name / "launcher.jsonl"
    args = [
        *FAST_FT, "--nproc-per-node=2", "--standalone", f"--ft-journal={launcher_journal}",
        *(["--warm-spares"] if warm else []),
        str(CUDA_STEPS), "--out", str(out), f"--steps={steps}", "--checkpoint-every=2",
        f"--backend={backend}", "--fault=sigkill:1:5:0", "--fault=sigstop:1:5:1",
    ]  # fmt: skip
    run = LauncherRun(name, args, out, logs)
    got: Figures = {"backend": backend, "warm_spares": warm}
    try:
        try:
            got["exit_code"] = run.wait(timeout)
        except AssertionError as exc:
            got["exit_code"] = None
            got["error"] = str(exc)[-3000:]
        journal = run.journal()
        events = read_jsonl(launcher_journal) if launcher_journal.exists() else []
        got["restarts"] = len(run.restarts())
        restarts = []
        for e in journal:
            if e["event"] != "fault":
                continue
            first = _first_step_after(journal, e["attempt"] + 1)
            restarts.append({
                "kind": e["kind"],
                "fault_to_first_step_s": None if first is None else round(first - e["t"], 3),
            })  # fmt: skip
        got["restart_times"] = restarts
        got["restart_costs"] = [e for e in events if e.get("event") == "restart_cost"]
        got["warm_local_ranks"] = [
            e.get("warm_local_ranks") for e in events if e.get("event") == "workers_started"
        ]
        try:
            assert_every_step_once(journal, steps, ranks=(0, 1))
            got["every_step_once"] = True
        except AssertionError as exc:
            got["every_step_once"] = False
            got["every_step_once_error"] = str(exc)[:1000]
        if got["exit_code"] != 0:
            print(f"--- {name}: ft_launcher log tail ---\n{run.log()[-6000:]}", flush=True)
    finally:
        problems = run.cleanup()
        got["left_behind"] = problems
    return got


def step_launcher(figures: Figures, budget: float) -> None:
    import torch

    gpus = torch.cuda.device_count()
    figures["gpus"] = gpus
    if gpus >= 2:
        backend, why = "nccl", "a GPU per rank"
    else:
        ok, why = nccl_on_one_gpu()
        figures["nccl_two_ranks_one_gpu"] = why
        backend = "nccl" if ok else "gloo"
    figures["backend"] = backend
    per_run = max(30.0, (budget - 40) / 2)  # the NCCL probe, then two runs
    with tempfile.TemporaryDirectory(prefix="gpu_check_launcher-") as tmp:
        for name, warm in (("cold", False), ("warm", True)):
            got = _launcher_run(name, backend, warm, pathlib.Path(tmp), per_run)
            figures[name] = got
            _check(figures, f"{name}_exit_0", got["exit_code"] == 0)
            _check(figures, f"{name}_two_restarts", got["restarts"] == 2)
            _check(figures, f"{name}_every_step_once", got["every_step_once"])
            _check(figures, f"{name}_nothing_left_behind", not got["left_behind"])
            if warm:
                ranks = got["warm_local_ranks"]
                _check(figures, "warm_restart_used_spares", len(ranks) > 1 and bool(ranks[1]))


# -- local checkpoints with GPU state -----------------------------------------------------


def step_local_ckpt(figures: Figures, budget: float) -> None:
    import importlib

    module = importlib.import_module("nvrx.ft.checkpointing.local")
    local_checkpoints: Any = getattr(module, "LocalCheckpoints", None)
    if local_checkpoints is None:
        raise NotAvailable("nvrx.ft.checkpointing.local.LocalCheckpoints does not exist yet")
    import torch
    import torch.distributed as dist
    from torch import nn

    from nvrx.ft.checkpointing.local import _contract

    base = pathlib.Path(tempfile.mkdtemp(prefix="nvrx-gpu-check-", dir="/dev/shm"))
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0",
            "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            _contract.ENV_DIR: str(base), _contract.ENV_JOB: "gpu-check",
            _contract.ENV_EVERY_N_STEPS: "1",
        }
    )  # fmt: skip
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)]).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(64, 2048, device="cuda")

        def state(step: int) -> dict[str, Any]:
            return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}

        def train() -> None:
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()
            torch.cuda.synchronize()

        nbytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3
        figures["state_mb"] = round(nbytes / 2**20, 1)
        local = local_checkpoints()
        plain, saving = [], []
        for _ in range(10):
            t0 = time.perf_counter()
            train()
            plain.append(time.perf_counter() - t0)
        for step in range(11, 31):
            t0 = time.perf_counter()
            train()
            local.maybe_save(step, state(step))
            saving.append(time.perf_counter() - t0)
        figures["step_ms"] = round(_median(plain) * 1e3, 3)
        figures["step_with_save_ms"] = round(_median(saving) * 1e3, 3)
        figures["save_cost_per_step_ms"] = round((_median(saving) - _median(plain)) * 1e3, 3)
        expected = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        with contextlib.suppress(Exception):
            local.close()
        t0 = time.perf_counter()
        again = local_checkpoints()
        restored = again.restore(state(0), global_iteration=None)
        figures["restore_s"] = round(time.perf_counter() - t0, 4)
        figures["restore_source"] = str(getattr(restored.source, "value", restored.source))
        got = restored.state
        _check(figures, "restored_a_snapshot", got is not None)
        if got is not None:
            figures["restored_step"] = int(got["step"])
            same = all(torch.equal(got["model"][k].cpu(), v) for k, v in expected.items())
            _check(figures, "restored_state_equals_saved", same)
            _check(figures, "restored_step_is_last", int(got["step"]) == 30)
        with contextlib.suppress(Exception):
            again.close()
    finally:
        dist.destroy_process_group()
        shutil.rmtree(base, ignore_errors=True)


# -- every test marked gpu ----------------------------------------------------------------


def gpu_test_paths() -> list[str]:
    """The test files with tests marked gpu, in each package's tests and the integration
    tests (as ``nox -s gpu_tests`` selects them; only these files are imported, so a
    test module needing what a GPU machine lacks, nox say, cannot stop the run)."""
    roots = [*(ROOT / "packages" / n / "tests" for n in PACKAGES), ITESTS]
    return [
        str(path)
        for root in roots
        for path in sorted(root.glob("test_*.py"))
        if "pytest.mark.gpu" in path.read_text() and path.name != "test_gpu_check.py"
    ]


def junit_counts(path: pathlib.Path) -> Figures:
    """Totals and the names of failed and skipped tests from a pytest JUnit XML file."""
    root = ET.parse(path).getroot()  # noqa: S314 - the file pytest just wrote
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed, skipped, slowest = [], [], []
    for suite in suites:
        for key in counts:
            counts[key] += int(suite.get(key, "0"))
        for case in suite.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            slowest.append((float(case.get("time", "0")), name))
            for child in case:
                if child.tag in ("failure", "error"):
                    failed.append(f"{name}: {(child.get('message') or '')[:300]}")
                elif child.tag == "skipped":
                    skipped.append(f"{name}: {(child.get('message') or '')[:300]}")
    slowest.sort(reverse=True)
    return {
        **counts,
        "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        "failed_tests": failed,
        "skipped_tests": skipped,
        "slowest_s": {n: round(t, 2) for t, n in slowest[:10]},
    }


def step_gpu_tests(figures: Figures, budget: float) -> None:
    with tempfile.TemporaryDirectory(prefix="gpu_check_tests-") as tmp:
        junit = pathlib.Path(tmp) / "junit.xml"
        argv = [
            sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
            "--rootdir", str(ROOT), *gpu_test_paths(), "-m", "gpu", "-p", "no:cacheprovider",
            f"--junitxml={junit}", "-q", "-rfEs",
        ]  # fmt: skip
        figures["command"] = " ".join(argv)
        try:
            code = subprocess.run(argv, cwd=ROOT, timeout=max(10.0, budget - 10)).returncode
        except subprocess.TimeoutExpired:
            code = None
        figures["pytest_exit_code"] = code
        if junit.exists():
            figures.update(junit_counts(junit))
    _check(figures, "pytest_finished", code is not None)
    _check(figures, "some_gpu_tests_ran", figures.get("tests", 0) > 0)
    _check(figures, "none_failed", figures.get("failures", 0) + figures.get("errors", 0) == 0)
    # A gpu test that skips on a GPU machine is a defect.
    _check(figures, "none_skipped", figures.get("skipped", 0) == 0)


STEPS: dict[str, Callable[[Figures, float], None]] = {
    "environment": step_environment,
    "straggler": step_straggler,
    "cuda_events": step_cuda_events,
    "nvml_reclaim": step_nvml_reclaim,
    "launcher": step_launcher,
    "local_ckpt": step_local_ckpt,
    "gpu_tests": step_gpu_tests,
}


@contextlib.contextmanager
def _result(path: pathlib.Path) -> Iterator[Figures]:
    """Write the step's result when it ends, however it ends (but a SIGKILL)."""
    figures: Figures = {}
    status, reason = "passed", None
    try:
        yield figures
    except NotAvailable as exc:
        status, reason = "not_available", str(exc)
    except BaseException as exc:
        status = "failed"
        reason = f"{type(exc).__name__}: {exc}"[:2000]
        traceback.print_exc()
    failed = [name for name, ok in figures.get("checks", {}).items() if not ok]
    if status == "passed" and failed:
        status, reason = "failed", "checks failed: " + ", ".join(failed)
    result = {"status": status, "reason": reason, "figures": _clean(figures)}
    path.write_text(json.dumps(result, default=str, allow_nan=False))


def _clean(value: Any) -> Any:
    """``value`` made JSON-ready: NaN and infinities as None, keys as text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _stopped(signum: int, frame: object) -> None:
    """SIGTERM from gpu_check.py at the end of the budget: unwind, so the step's
    ``finally`` blocks clean up and its figures so far are written."""
    raise SystemExit(f"stopped by signal {signum}: over its time budget")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("--result", type=pathlib.Path, required=True)
    parser.add_argument("--budget", type=float, default=60.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, _stopped)
    with _result(args.result) as figures:
        STEPS[args.step](figures, args.budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
