"""Check every GPU path of nvrx on a real GPU: one JSON result and one log.

On a fresh GPU machine (see CONTRIBUTING.md, "Checking on a GPU")::

    python3 tools/gpu_check.py --install --out OUT            # from an index
    python3 tools/gpu_check.py --install --wheels .whl --out OUT   # offline, from wheels
    python3 tools/gpu_check.py --download-wheels .whl          # fetch those wheels here

``--install`` installs what the check needs (a CUDA torch through ``NVRX_TORCH_INDEX``,
cupti-python, nvidia-ml-py, lightning, the test tools, the four packages), then the
steps below run, each in its own process with its own time budget, so one that fails,
crashes or hangs does not stop the others. ``OUT/gpu_check.json`` (schema:
``tools/gpu_check.schema.json``) holds each step's status and figures and
``OUT/gpu_check.log`` everything the steps printed.

Exit status: 0 when every step passed (or reported its feature as not available), 1
when one failed or ran out of time, or when ``--require-gpu`` (or
``NVRX_REQUIRE_GPU=1``) is given and torch sees no GPU; 2 for a bad option. Without a
GPU every step is ``skipped`` and the exit status is 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEPS_SCRIPT = ROOT / "tools" / "_gpu_steps.py"
SCHEMA_PATH = ROOT / "tools" / "gpu_check.schema.json"
SCHEMA_VERSION = 1
RESULT_NAME = "gpu_check.json"
LOG_NAME = "gpu_check.log"
#: The whole run's budget (the issue's 8 minutes, less a margin for start-up and install).
DEFAULT_TOTAL_BUDGET_S = 450.0
#: Every descendant of a step carries this variable, so what a step leaves is found.
MARKER_ENV = "NVRX_GPU_CHECK_RUN"
PACKAGES = ["nvrx-ft-core", "nvrx-ft-launcher", "nvrx-straggler", "nvrx-ptl"]
#: What the check needs beside torch and cupti-python: (distribution, requirement). Only
#: torch is required: without one of these, the steps that need it say so.
EXTRAS: list[tuple[str, str]] = [
    ("nvidia-ml-py", "nvidia-ml-py>=12"),
    ("lightning", "lightning>=2.1"),
    ("pytest", "pytest>=8"),
    ("pytest-timeout", "pytest-timeout>=2.3"),
    ("psutil", "psutil>=5.9"),
    ("jsonschema", "jsonschema>=4.18"),  # the result is validated when present
    ("isal", "isal>=1.6"),  # nvrx-ft-core's CRC-32 (installed with --no-deps below)
    # What builds the packages' editable installs without build isolation (offline).
    ("hatchling", "hatchling>=1.27"),
    ("editables", "editables>=0.3"),
    ("setuptools", "setuptools>=77"),
]
#: Wheels ``--download-wheels`` fetches for a machine that has torch, nvidia-ml-py and
#: lightning but cannot reach an index (the GPU machine lent here): cupti-python and
#: what builds and validates, each without its dependencies (see ``download_plan``).
OFFLINE_WHEELS = [
    "hatchling>=1.27",
    "editables>=0.3",
    "setuptools>=77",
    "attrs>=22.2",
    "pathspec>=0.10.1",
    "trove-classifiers",
    "tomlkit>=0.11.1",
    "jsonschema>=4.18",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "isal>=1.6",
]
#: The most one device call carries (its working tree, wheels included).
CARRY_LIMIT_BYTES = 64 * 1024 * 1024
STATUSES = ("passed", "failed", "timed_out", "skipped", "not_available")
#: How long a step past its budget has, after SIGTERM, to write its figures so far.
TERM_GRACE_S = 10.0


@dataclasses.dataclass(frozen=True)
class Command:
    """One install command: what it is for, its argv, and whether the check needs it."""

    what: str
    argv: tuple[str, ...]
    required: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "argv": list(self.argv), "required": self.required}


@dataclasses.dataclass(frozen=True)
class Step:
    """One isolated step: its name, time budget, and whether it needs a GPU."""

    name: str
    budget_s: float
    summary: str
    needs_gpu: bool = True


#: The steps, in the order they run: the figures first, the whole gpu suite last.
STEPS: list[Step] = [
    Step("environment", 30, "torch, CUDA, the GPU, driver and package versions", False),
    Step("straggler", 60, "CUPTI kernel timing and section scores around real kernels"),
    Step("cuda_events", 30, "cuda_event_timing GPU times against host times, async section"),
    Step("nvml_reclaim", 60, "NVML health checks; memory reclaim after a killed holder"),
    Step("launcher", 180, "ft_launcher, 2 ranks on the GPU: SIGKILL/SIGSTOP, cold and warm"),
    Step("local_ckpt", 45, "local checkpoint save cost per step and restore, GPU state"),
    Step("gpu_tests", 200, "every test marked gpu (nox -s gpu_tests)"),
]
STEP_NAMES = [s.name for s in STEPS]


# -- options ------------------------------------------------------------------------------


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (0 < value < 86400):
        raise argparse.ArgumentTypeError(f"must be above 0 and below 86400 s: {text!r}")
    return value


def step_list(text: str) -> list[str]:
    """An argparse type: comma-separated step names, each known."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in STEP_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown step(s) {unknown or text!r}; the steps are {', '.join(STEP_NAMES)}"
        )
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=ROOT / "gpu-check-output",
        help="folder for gpu_check.json and gpu_check.log (default: %(default)s)",
    )
    p.add_argument(
        "--install",
        action="store_true",
        help="install what the check needs first (see --wheels, NVRX_TORCH_INDEX)",
    )
    p.add_argument(
        "--wheels",
        type=pathlib.Path,
        help="with --install: install from this folder of wheels only (no index)",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the install plan as JSON and exit (installs nothing)",
    )
    p.add_argument(
        "--download-wheels",
        type=pathlib.Path,
        metavar="DIR",
        help="download the wheels an offline GPU machine needs into DIR and exit",
    )
    p.add_argument(
        "--target-python",
        default="3.12",
        metavar="X.Y",
        help="with --download-wheels: the GPU machine's CPython (default 3.12)",
    )
    p.add_argument(
        "--cuda",
        default="13.0",
        metavar="X.Y",
        help="with --download-wheels: the GPU machine torch's CUDA (default 13.0)",
    )
    p.add_argument(
        "--with-torch",
        action="store_true",
        help="with --download-wheels: also the CUDA torch of NVRX_TORCH_INDEX",
    )
    p.add_argument(
        "--steps",
        type=step_list,
        default=list(STEP_NAMES),
        help=f"comma-separated steps to run (default all: {','.join(STEP_NAMES)})",
    )
    p.add_argument(
        "--total-budget",
        type=positive_seconds,
        default=DEFAULT_TOTAL_BUDGET_S,
        help="seconds for all steps together (default %(default)s)",
    )
    p.add_argument(
        "--require-gpu",
        action="store_true",
        help="fail when torch sees no GPU (also NVRX_REQUIRE_GPU=1)",
    )
    p.add_argument("--list", action="store_true", help="list the steps and exit")
    return p  # fmt: skip


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    """The options; exit 2 naming a bad option or value (argparse's own rule)."""
    p = parser()
    args = p.parse_args(argv)
    if args.wheels is not None and not args.install and not args.plan:
        p.error("--wheels needs --install (or --plan)")
    if args.wheels is not None and not args.wheels.is_dir():
        p.error(f"--wheels {str(args.wheels)!r}: no such folder")
    for name in ("target_python", "cuda"):
        if not re.fullmatch(r"\d+\.\d+", getattr(args, name)):
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)!r}: expected X.Y")
    required = env.get("NVRX_REQUIRE_GPU", "0").strip()
    if required not in ("0", "1", ""):
        p.error(f"NVRX_REQUIRE_GPU={required!r} is not valid: use 1 or 0")
    args.require_gpu = args.require_gpu or required == "1"
    try:
        torch_index_args(env)
    except ValueError as exc:
        p.error(str(exc))
    return args


# -- the install plan ---------------------------------------------------------------------


def torch_spec(env: Mapping[str, str]) -> str:
    """The torch requirement: ``NVRX_TORCH_SPEC`` (as noxfile.py), default torch==2.13.0."""
    return env.get("NVRX_TORCH_SPEC", "torch==2.13.0").strip() or "torch==2.13.0"


def torch_index_args(env: Mapping[str, str]) -> list[str] | None:
    """pip's index arguments for torch from ``NVRX_TORCH_INDEX`` (None: unset).

    A URL (``.../whl/cu130`` for a CUDA build) is used as the index; ``pypi`` means
    pip's own configuration. Anything else is refused, naming the value.
    """
    chosen = env.get("NVRX_TORCH_INDEX", "").strip()
    if not chosen:
        return None
    if chosen == "pypi":
        return []
    if not chosen.startswith(("https://", "http://", "file://")):
        raise ValueError(f"NVRX_TORCH_INDEX={chosen!r} is not valid: give an index URL or 'pypi'")
    return ["--index-url", chosen]


def version_tuple(version: str) -> tuple[int, ...]:
    """``2.11.0+cu130`` -> (2, 11, 0); unparsable parts end the tuple."""
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def satisfies(version: str, spec: str) -> bool:
    """Whether ``version`` meets a simple ``name==X.Y[.Z]`` / ``name>=X.Y`` requirement."""
    match = re.fullmatch(r"[A-Za-z0-9_.-]+\s*(==|>=|~=)\s*([0-9.*]+)", spec.strip())
    if match is None:
        return False
    op, wanted = match.groups()
    have, want = version_tuple(version), version_tuple(wanted.rstrip(".*"))
    if op == ">=":
        return have >= want
    if op == "~=":
        return have[: len(want) - 1] == want[:-1] and have >= want
    return have[: len(want)] == want


#: In a plan that installs torch: the cupti-python for the CUDA of the torch installed.
CUPTI_AFTER_TORCH = "{cupti}"


def cupti_spec(cuda: str | None) -> str:
    """The cupti-python that matches torch's CUDA (its ``nvidia-cuda-cupti`` pin)."""
    if cuda is None:
        return "cupti-python>=12.8"
    major, minor = version_tuple(cuda)[:2]
    if major >= 13:
        return f"cupti-python~={major}.{minor}.0"
    return "cupti-python>=12.8,<13"


def installed(names: Sequence[str]) -> dict[str, str | None]:
    """The installed version of each distribution, None where absent."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def install_plan(
    python: str,
    *,
    have: Mapping[str, str | None],
    torch_cuda: str | None,
    env: Mapping[str, str],
    wheels: pathlib.Path | None = None,
    constraints: str = "{constraints}",
    root: pathlib.Path = ROOT,
) -> tuple[list[Command], list[str]]:
    """The commands that make this interpreter ready for the check, and notes on them.

    ``have`` maps distribution names to installed versions (None: absent);
    ``torch_cuda`` is the installed torch's CUDA version (None: a CPU build or none).
    cupti-python matches that CUDA (once a torch the plan installs is there; not at all
    for a CPU torch). torch comes from ``NVRX_TORCH_INDEX`` when it is set, else from
    ``wheels`` when they hold one; otherwise an installed CUDA torch is kept (with a note when it
    misses ``NVRX_TORCH_SPEC``). Every later command is constrained to the torch then
    installed (``constraints`` names that file), so nothing swaps it. The packages are
    installed editable without dependencies (each on its own), so an older
    preinstalled torch stays.
    """
    pip = (python, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check")
    source = ("--no-index", "--find-links", str(wheels)) if wheels is not None else ()
    spec = torch_spec(env)
    index = torch_index_args(env)
    commands: list[Command] = []
    notes: list[str] = []
    torch_version = have.get("torch")
    wheel_torch = wheels is not None and any(wheels.glob("torch-*.whl"))
    if index is not None:
        commands.append(Command("torch (NVRX_TORCH_INDEX)", (*pip, *index, spec)))
    elif wheel_torch:
        commands.append(Command("torch (wheels)", (*pip, *source, spec)))
    elif torch_version is None:
        notes.append("no torch here and NVRX_TORCH_INDEX is unset: pip's own index is used")
        commands.append(Command("torch", (*pip, *source, spec)))
    elif torch_cuda is None:
        notes.append(
            f"the installed torch {torch_version} is not a CUDA build: set NVRX_TORCH_INDEX "
            "to a CUDA index (e.g. https://download.pytorch.org/whl/cu130)"
        )
    elif not satisfies(torch_version, spec):
        notes.append(
            f"keeping the installed torch {torch_version} (CUDA {torch_cuda}); it misses "
            f"{spec} and ft_launcher declares torch>=2.12: its figures are for this torch"
        )
    else:
        notes.append(f"keeping the installed torch {torch_version} (CUDA {torch_cuda})")
    pin = ("-c", constraints)
    cupti = CUPTI_AFTER_TORCH if commands else cupti_spec(torch_cuda)
    if commands or torch_cuda is not None:  # a CUDA torch is there, or on its way
        if have.get("cupti-python") is None or not satisfies(have["cupti-python"] or "", cupti):
            commands.append(Command("cupti-python", (*pip, *source, *pin, cupti), required=False))
    else:
        notes.append("cupti-python is not installed: torch here is no CUDA build")
    for name, requirement in EXTRAS:
        version = have.get(name)
        if version is None or not satisfies(version, requirement):
            commands.append(Command(name, (*pip, *source, *pin, requirement), required=False))
    for name in PACKAGES:  # one by one: a package that fails leaves the others
        commands.append(
            Command(
                f"{name} (editable, no dependencies)",
                (*pip, *source, "--no-deps", "--no-build-isolation",
                 "--config-settings", "editable_mode=compat", "-e", str(root / "packages" / name)),
                required=False,
            )
        )  # fmt: skip
    return commands, notes


def download_plan(
    dest: pathlib.Path,
    *,
    python_version: str,
    cuda: str,
    env: Mapping[str, str],
    with_torch: bool,
    python: str = sys.executable,
) -> list[Command]:
    """``pip download`` commands for the wheels an offline GPU machine needs.

    Binary wheels for CPython ``python_version`` on x86-64 manylinux, each without its
    dependencies (the machine already has torch's and numpy's): cupti-python for
    ``cuda`` and :data:`OFFLINE_WHEELS`. ``with_torch`` adds ``NVRX_TORCH_SPEC`` from
    ``NVRX_TORCH_INDEX`` (a CUDA torch is several hundred MB, its CUDA libraries GBs).
    """
    platforms = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 39)] + [
        "manylinux2014_x86_64",
        "manylinux1_x86_64",
    ]
    base = [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", python_version, "--implementation", "cp"]  # fmt: skip
    for plat in platforms:
        base += ["--platform", plat]
    base += ["-d", str(dest)]
    commands = [Command("wheels", (*base, cupti_spec(cuda), *OFFLINE_WHEELS))]
    if with_torch:
        index = torch_index_args(env)
        if index is None:
            raise ValueError("--with-torch needs NVRX_TORCH_INDEX (a CUDA torch index)")
        commands.append(Command("torch", (*base, *index, torch_spec(env))))
    return commands


# -- running the steps --------------------------------------------------------------------


@dataclasses.dataclass
class StepResult:
    """What one step did."""

    name: str
    status: str
    budget_s: float
    wall_s: float
    summary: str
    reason: str | None = None
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``MARKER_ENV=marker`` (Linux /proc)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in pathlib.Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return [pid for pid in found if pid != os.getpid()]


def kill_marked(marker: str) -> int:
    """SIGKILL every process carrying ``marker``; how many there were."""
    pids = marked_pids(marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def run_step(
    step: Step,
    argv: Sequence[str],
    *,
    budget_s: float,
    log: Any,
    env: Mapping[str, str],
    result_file: pathlib.Path,
) -> StepResult:
    """Run one step's process with its budget; never raises for what the step does.

    The process writes ``{"status", "figures", "reason"}`` to ``result_file``. It runs
    in its own session; at the end (on time or not) every process carrying the step's
    marker is killed, so nothing a step started outlives it.
    """
    marker = f"{step.name}-{uuid.uuid4().hex}"
    step_env = {**env, MARKER_ENV: marker, "PYTHONUNBUFFERED": "1"}
    result_file.unlink(missing_ok=True)
    log.write(f"\n===== step {step.name} (budget {budget_s:.0f} s): {shlex.join(argv)}\n")
    log.flush()
    start = time.monotonic()
    status: str | None = None
    reason: str | None = None
    try:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=step_env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        return StepResult(step.name, "failed", budget_s, 0.0, step.summary, f"cannot start: {exc}")
    try:
        code = proc.wait(budget_s)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the step then writes what it measured so far (its figures).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        code = None
        status, reason = "timed_out", f"still running after its budget of {budget_s:.0f} s"
    wall = time.monotonic() - start
    left = kill_marked(marker)
    figures: dict[str, Any] = {}
    written: dict[str, Any] | None = None
    with contextlib.suppress(OSError, ValueError):
        loaded = json.loads(result_file.read_text())
        written = loaded if isinstance(loaded, dict) else None
    if written is not None:
        figures = written.get("figures") or {}
        if status is None:
            status = written.get("status")
            reason = written.get("reason")
    if status is None or status not in STATUSES:
        status = "failed"
        reason = f"exited {code} without a result" if code else "wrote no result"
    elif code not in (0, None) and status == "passed":
        status, reason = "failed", f"exited {code} after reporting success"
    if left:
        figures["processes_left_behind"] = left
    log.write(
        f"===== step {step.name}: {status} in {wall:.1f} s" + (f" ({reason})\n" if reason else "\n")
    )
    log.flush()
    return StepResult(step.name, status, budget_s, round(wall, 3), step.summary, reason, figures)


def step_command(step: Step, result_file: pathlib.Path, python: str, budget_s: float) -> list[str]:
    """The argv of a step's process (``tools/_gpu_steps.py NAME``)."""
    return [python, str(STEPS_SCRIPT), step.name, "--result", str(result_file),
            "--budget", f"{budget_s:.0f}"]  # fmt: skip


def run_steps(
    steps: Sequence[Step],
    *,
    gpu: bool,
    total_budget_s: float,
    log: Any,
    env: Mapping[str, str],
    command: Callable[[Step, pathlib.Path, float], Sequence[str]],
    workdir: pathlib.Path,
    clock: Callable[[], float] = time.monotonic,
) -> list[StepResult]:
    """Run ``steps`` in order, each isolated, within ``total_budget_s`` together.

    A step gets its own budget or what is left of the total, whichever is less; one
    with under 5 s left, or needing a GPU where there is none, is ``skipped``.
    """
    results: list[StepResult] = []
    deadline = clock() + total_budget_s
    for step in steps:
        left = deadline - clock()
        budget = min(step.budget_s, left)
        if step.needs_gpu and not gpu:
            results.append(
                StepResult(step.name, "skipped", step.budget_s, 0.0, step.summary,
                           "no CUDA GPU visible to torch")
            )  # fmt: skip
            continue
        if budget < 5:
            results.append(
                StepResult(step.name, "skipped", step.budget_s, 0.0, step.summary,
                           f"the total budget of {total_budget_s:.0f} s was used up")
            )  # fmt: skip
            continue
        result_file = workdir / f"{step.name}.result.json"
        argv = command(step, result_file, budget)
        results.append(
            run_step(step, argv, budget_s=budget, log=log, env=env, result_file=result_file)
        )
        print(f"gpu_check: {step.name}: {results[-1].status} ({results[-1].wall_s:.1f} s)"
              + (f": {results[-1].reason}" if results[-1].reason else ""), flush=True)  # fmt: skip
    return results


# -- the result ---------------------------------------------------------------------------


def outcome(results: Sequence[StepResult], gpu: bool) -> str:
    """``no_gpu``, ``failed`` (a step failed or timed out) or ``passed``."""
    if any(r.status in ("failed", "timed_out") for r in results):
        return "failed"
    if not gpu:
        return "no_gpu"
    return "passed"


def exit_code(result: Mapping[str, Any], require_gpu: bool) -> int:
    if result["outcome"] == "failed":
        return 1
    if result["outcome"] == "no_gpu" and require_gpu:
        return 1
    return 0


def validate(result: Mapping[str, Any], schema_path: pathlib.Path = SCHEMA_PATH) -> str | None:
    """Validate ``result`` against the schema: None when valid or jsonschema is absent
    (the reason is then said in the result), else the first error."""
    try:
        import jsonschema  # type: ignore[import-untyped]
    except ImportError:
        return None
    schema = json.loads(schema_path.read_text())
    try:
        jsonschema.validate(result, schema)
    except jsonschema.ValidationError as exc:
        return f"{'/'.join(map(str, exc.absolute_path)) or '<root>'}: {exc.message}"
    return None


def write_result(out: pathlib.Path, result: dict[str, Any]) -> pathlib.Path:
    """Write ``OUT/gpu_check.json`` atomically; return its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULT_NAME
    tmp = path.with_name(f".{RESULT_NAME}.tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def probe_gpu(python: str, env: Mapping[str, str]) -> tuple[bool, str]:
    """(does torch see a CUDA GPU, what it said) from a fresh process."""
    code = (
        "import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; "
        "print(n, torch.__version__, torch.version.cuda)"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=120, env=dict(env)
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"cannot ask torch: {exc}"
    if out.returncode != 0:
        return False, f"import torch failed: {out.stderr.strip()[-500:]}"
    words = out.stdout.split()
    return bool(words) and words[0] != "0", out.stdout.strip()


def torch_cuda_here(python: str) -> str | None:
    """The CUDA version the installed torch was built for (None: CPU build or none)."""
    code = "import torch; print(torch.version.cuda or '')"
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return None


def run_install(
    commands: Sequence[Command], log: Any, python: str, workdir: pathlib.Path
) -> dict[str, Any]:
    """Run the install plan; a required command that fails ends the install."""
    constraints = workdir / "constraints.txt"
    done: list[dict[str, Any]] = []
    ok = True
    for command in commands:
        if "{constraints}" in command.argv and not constraints.exists():
            version = installed(["torch"])["torch"]
            constraints.write_text(f"torch=={version}\n" if version else "")
        argv = [str(constraints) if a == "{constraints}" else a for a in command.argv]
        if CUPTI_AFTER_TORCH in argv:
            cuda = torch_cuda_here(python)
            if cuda is None:
                print(f"gpu_check: install {command.what}: skipped, torch is no CUDA build")
                continue
            argv = [cupti_spec(cuda) if a == CUPTI_AFTER_TORCH else a for a in argv]
        log.write(f"\n===== install {command.what}: {shlex.join(argv)}\n")
        log.flush()
        start = time.monotonic()
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
        done.append(
            {**command.to_json(), "exit_code": code, "wall_s": round(time.monotonic() - start, 3)}
        )
        print(f"gpu_check: install {command.what}: exit {code}", flush=True)
        if code != 0 and command.required:
            ok = False
            break
    return {"commands": done, "ok": ok}


def machine() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpus": os.cpu_count() or 0,
    }


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    args = parse_args(argv, env)
    if args.list:
        for step in STEPS:
            print(f"{step.name:14} {step.budget_s:5.0f} s  {step.summary}")
        return 0
    python = sys.executable
    if args.download_wheels is not None:
        return download(args, env, python)
    have = installed(["torch", "cupti-python", *(n for n, _ in EXTRAS)])
    commands, notes = install_plan(
        python, have=have, torch_cuda=torch_cuda_here(python), env=env, wheels=args.wheels
    )
    if args.plan:
        print(json.dumps({"commands": [c.to_json() for c in commands], "notes": notes}, indent=2))
        return 0
    started = datetime.datetime.now(datetime.timezone.utc)
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    with (
        (args.out / LOG_NAME).open("w", buffering=1) as log,
        tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp,
    ):
        workdir = pathlib.Path(tmp)
        install: dict[str, Any] = {"requested": args.install, "notes": notes, "ok": True}
        if args.install:
            install.update(run_install(commands, log, python, workdir))
        else:
            install["commands"] = []
        for note in notes:
            print(f"gpu_check: note: {note}", flush=True)
        envs = dict(env)
        gpu, probe = probe_gpu(python, envs)
        log.write(f"torch probe: {probe}\n")
        chosen = [s for s in STEPS if s.name in args.steps]
        if not install["ok"]:
            results = [
                StepResult(s.name, "skipped", s.budget_s, 0.0, s.summary, "the install failed")
                for s in chosen
            ]
        else:
            results = run_steps(
                chosen, gpu=gpu, total_budget_s=args.total_budget, log=log, env=envs,
                command=lambda s, f, b: step_command(s, f, python, b), workdir=workdir,
            )  # fmt: skip
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "started": started.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - start, 3),
        "total_budget_s": args.total_budget,
        "machine": machine(),
        "gpu_visible": gpu,
        "torch_probe": probe,
        "install": install,
        "steps": [r.to_json() for r in results],
        "outcome": "failed" if not install["ok"] else outcome(results, gpu),
        "validation": None,
    }
    result["validation"] = validate(result)
    path = write_result(args.out, result)
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    said = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    print(f"gpu_check: {result['outcome']}: {said}; wrote {path} and {args.out / LOG_NAME}")
    if result["validation"]:
        print(f"gpu_check: the result does not match its schema: {result['validation']}")
        return 1
    return exit_code(result, args.require_gpu)


def download(args: argparse.Namespace, env: Mapping[str, str], python: str) -> int:
    """``--download-wheels``: fetch the offline wheels and say what they weigh."""
    dest: pathlib.Path = args.download_wheels
    try:
        commands = download_plan(
            dest, python_version=args.target_python, cuda=args.cuda, env=env,
            with_torch=args.with_torch, python=python,
        )  # fmt: skip
    except ValueError as exc:
        print(f"gpu_check.py: error: {exc}", file=sys.stderr)
        return 2
    dest.mkdir(parents=True, exist_ok=True)
    for command in commands:
        print(f"gpu_check: {command.what}: {shlex.join(command.argv)}", flush=True)
        if subprocess.run(command.argv).returncode != 0:
            print(f"gpu_check: downloading {command.what} failed", file=sys.stderr)
            return 1
    total = sum(p.stat().st_size for p in dest.glob("*.whl"))
    print(f"gpu_check: {dest}: {len(list(dest.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")
    if total > CARRY_LIMIT_BYTES:
        limit = CARRY_LIMIT_BYTES // 2**20
        print(
            f"gpu_check: warning: over the {limit} MiB a device call carries: leave out "
            "--with-torch and use the machine's own CUDA torch"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
