"""Run every ``benchmarks/bench_*.py`` and write one JSON file and a table.

    python benchmarks/run.py [--quick] [--only AREA ...] [--merge] [--output PATH]
                             [--publish PAGE]

Results go to ``benchmarks/results/latest.json`` by default, with the machine
they ran on. The same table is printed and written as Markdown next to it;
``--publish docs/benchmarks.md`` also writes the docs page that shows it.
``--merge`` (with ``--only``) keeps the other areas' figures from the existing output,
each with the date of the run that measured it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import sys
import traceback

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import Metric  # noqa: E402


def machine() -> dict[str, object]:
    import torch

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def discover(only: list[str]) -> list[pathlib.Path]:
    found = sorted(HERE.glob("bench_*.py"))
    if only:
        found = [p for p in found if p.stem.removeprefix("bench_") in only]
    return found


def run_module(path: pathlib.Path, quick: bool) -> list[Metric]:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    metrics: list[Metric] = module.run(quick)
    return metrics


def table(metrics: list[Metric]) -> str:
    rows = [
        "| area | metric | median | unit | samples | target | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in metrics:
        target = "" if m.target is None else f"{m.target:g}"
        ok = {None: "", True: "yes", False: "NO"}[m.within_target]
        rows.append(
            f"| {m.area} | {m.name} | {m.value:.4g} | {m.unit} | {m.samples} | {target} | {ok} |"
        )
    return "\n".join(rows)


#: The page's hand-kept section of GPU figures (tools/gpu_check.py), kept by ``publish``.
GPU_HEADING = "\n## GPU\n"


def publish(page: pathlib.Path, machine_info: dict[str, object], text: str) -> None:
    """Write the docs page: the table and the machine it ran on, then the page's GPU
    section as it was (its figures come from tools/gpu_check.py, not from this run)."""
    about = ", ".join(f"{k} {v}" for k, v in machine_info.items())
    earlier = page.read_text() if page.exists() else ""
    gpu = earlier[earlier.index(GPU_HEADING) :] if GPU_HEADING in earlier else ""
    page.write_text(
        "# Benchmarks\n\n"
        "The latest `nox -s bench` run (`python benchmarks/run.py --publish docs/benchmarks.md`). "
        "Each figure is a median over many samples; `target` is the budget the project "
        "set for it, in the same unit. Per-phase breakdowns and ratios are in "
        "`benchmarks/results/latest.json`: for crash and hang recovery it splits the "
        "launcher's own phases (detect, stop, rendezvous, spawn) from the ranks' start-up "
        "(Python, `import torch`, process group, first step), and `bare_start_floor` is "
        "that start-up alone. Launcher metrics ending in `_warm` ran with "
        "`ft_launcher --warm-spares`, whose restarted ranks skip that start-up. "
        "The `local_ckpt_recovery` area is a fault -> the training back at the step the "
        "fault hit (a crash: SIGKILL; a hang: SIGSTOP) with a disk checkpoint every 20 "
        "steps, as jobs do today, against an in-memory local snapshot every step; `detail` "
        "has the steps recomputed and the restore time. The `local_ckpt` area is what a "
        "local snapshot costs: the save call on the training thread against a plain copy "
        "of the same state, a step loop's slowdown with a save every step, and the restore "
        "from the rank's own node and from a peer. `learned` is a hang's detection on a "
        "job's first run with learned timeouts; `culprit` names the hung rank and the "
        "collective on injected hangs; `run_nonce` is what the run nonce's liveness "
        "challenge costs the rendezvous store and a joining launcher. "
        "Wall-clock figures move with the machine's load; ratios to "
        "a baseline measured in the same run (torchrun, a bare contextmanager) move less."
        "\n\n"
        f"Machine: {about}.\n\n{text}\n{gpu}"
    )


def merged(earlier: dict[str, object], rerun: set[str]) -> tuple[list[Metric], dict[str, object]]:
    """The figures of an earlier output whose areas were not run again, and their dates."""
    machine_info = earlier.get("machine")
    default = machine_info.get("date") if isinstance(machine_info, dict) else None
    raw_dates = earlier.get("area_dates")
    known = raw_dates if isinstance(raw_dates, dict) else {}
    raw = earlier.get("metrics")
    kept = [Metric(**m) for m in (raw if isinstance(raw, list) else []) if m["area"] not in rerun]
    return kept, {m.area: known.get(m.area, default) for m in kept}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, for smoke runs")
    parser.add_argument("--only", nargs="*", default=[], help="areas to run (bench_<area>.py)")
    parser.add_argument("--output", type=pathlib.Path, default=HERE / "results" / "latest.json")
    parser.add_argument("--publish", type=pathlib.Path, help="also write this docs page")
    parser.add_argument(
        "--merge", action="store_true", help="keep the other areas' figures from --output"
    )
    args = parser.parse_args(argv)

    metrics: list[Metric] = []
    failed: list[str] = []
    for path in discover(args.only):
        print(f"== {path.stem}", flush=True)
        try:
            metrics.extend(run_module(path, args.quick))
        except Exception:
            traceback.print_exc()
            failed.append(path.stem)

    args.output.parent.mkdir(parents=True, exist_ok=True)
    about = machine()
    dates = dict.fromkeys({m.area for m in metrics}, about["date"])
    if args.merge and args.output.exists():
        kept, kept_dates = merged(json.loads(args.output.read_text()), {m.area for m in metrics})
        metrics = kept + metrics
        dates = kept_dates | dates
    report = {
        "machine": about,
        "metrics": [dataclasses.asdict(m) for m in metrics],
        "area_dates": dates,
        "failed": failed,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    text = table(metrics)
    args.output.with_suffix(".md").write_text(text + "\n")
    print(text)
    print(f"\nwrote {args.output}")
    if args.publish is not None:
        if len(set(dates.values())) > 1:
            about = {**about, "date": "; ".join(f"{a} {d}" for a, d in sorted(dates.items()))}
        publish(args.publish, about, text)
        print(f"wrote {args.publish}")
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or not metrics else 0


if __name__ == "__main__":
    sys.exit(main())
