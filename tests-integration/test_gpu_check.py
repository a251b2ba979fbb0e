"""tools/gpu_check.py up to where it needs a GPU: options, the install plan, the result
and its schema, step isolation and budgets, and the whole run on a machine without one."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from types import ModuleType
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "tools" / "gpu_check.schema.json").read_text())


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gpu_check = _load("gpu_check")
gpu_steps = _load("_gpu_steps")

#: What the GPU machine lent here was seen to hold (KINDS.md, 2026-11): a CUDA 13.0
#: torch 2.11, nvidia-ml-py, lightning and the test tools; no cupti-python, no hatchling.
DEVICE_HAS: dict[str, str | None] = {
    "torch": "2.11.0+cu130",
    "cupti-python": None,
    "nvidia-ml-py": "13.580.82",
    "lightning": "2.6.6",
    "pytest": "9.0.1",
    "pytest-timeout": "2.4.0",
    "psutil": "7.1.3",
    "jsonschema": None,
    "isal": None,
    "hatchling": None,
    "editables": None,
    "setuptools": "80.9.0",
}


# -- options ------------------------------------------------------------------------------


def _exit_message(argv: list[str], capsys: pytest.CaptureFixture[str], **env: str) -> str:
    with pytest.raises(SystemExit) as info:
        gpu_check.parse_args(argv, env)
    assert info.value.code == 2
    return str(capsys.readouterr().err)


def test_defaults_run_every_step_within_eight_minutes() -> None:
    args = gpu_check.parse_args([], {})
    assert args.steps == gpu_check.STEP_NAMES
    assert not args.install
    assert not args.require_gpu
    assert args.total_budget <= 8 * 60
    assert [s.name for s in gpu_check.STEPS] == gpu_check.STEP_NAMES
    assert set(gpu_check.STEP_NAMES) == set(gpu_steps.STEPS)
    names = SCHEMA["properties"]["steps"]["items"]["properties"]["name"]["enum"]
    assert names == gpu_check.STEP_NAMES


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--steps", "straggler,bogus"], {}, "bogus"),
        (["--steps", ","], {}, "--steps"),
        (["--total-budget", "0"], {}, "--total-budget"),
        (["--total-budget", "soon"], {}, "soon"),
        (["--cuda", "13"], {}, "--cuda '13'"),
        (["--target-python", "py3"], {}, "--target-python"),
        ([], {"NVRX_REQUIRE_GPU": "yes"}, "NVRX_REQUIRE_GPU='yes'"),
        ([], {"NVRX_TORCH_INDEX": "cu130"}, "NVRX_TORCH_INDEX='cu130'"),
    ],
)
def test_a_bad_option_exits_2_naming_it(
    argv: list[str], env: dict[str, str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert named in _exit_message(argv, capsys, **env)


def test_wheels_need_install_and_an_existing_folder(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--wheels needs --install" in _exit_message(["--wheels", str(tmp_path)], capsys)
    missing = tmp_path / "absent"
    assert "no such folder" in _exit_message(["--install", "--wheels", str(missing)], capsys)
    args = gpu_check.parse_args(["--install", "--wheels", str(tmp_path)], {})
    assert args.wheels == tmp_path


def test_require_gpu_from_the_option_or_the_environment() -> None:
    assert gpu_check.parse_args(["--require-gpu"], {}).require_gpu
    assert gpu_check.parse_args([], {"NVRX_REQUIRE_GPU": "1"}).require_gpu
    assert not gpu_check.parse_args([], {"NVRX_REQUIRE_GPU": "0"}).require_gpu


# -- the install plan ---------------------------------------------------------------------


def _plan(
    have: dict[str, str | None],
    cuda: str | None,
    env: dict[str, str] | None = None,
    wheels: pathlib.Path | None = None,
) -> tuple[list[Any], list[str]]:
    commands, notes = gpu_check.install_plan(
        "py", have=have, torch_cuda=cuda, env=env or {}, wheels=wheels, root=pathlib.Path("/r")
    )
    return list(commands), list(notes)


def _requirement(command: Any) -> str:
    return str(command.argv[-1])


def test_offline_plan_for_the_lent_machine_keeps_its_torch(tmp_path: pathlib.Path) -> None:
    commands, notes = _plan(DEVICE_HAS, "13.0", wheels=tmp_path)
    editables = [f"{n} (editable, no dependencies)" for n in gpu_check.PACKAGES]
    assert [c.what for c in commands] == [
        "cupti-python", "jsonschema", "isal", "hatchling", "editables", *editables,
    ]  # fmt: skip
    assert _requirement(commands[0]) == "cupti-python~=13.0.0"  # its nvidia-cuda-cupti pin
    for command in commands:  # nothing reaches an index, nothing is required but torch
        assert command.argv[:3] == ("py", "-m", "pip")
        assert ("--no-index", "--find-links", str(tmp_path)) == tuple(
            command.argv[command.argv.index("--no-index") :][:3]
        ), command
        assert not command.required
    for command in commands[:5]:  # torch stays as it is
        assert command.argv[command.argv.index("-c") + 1] == "{constraints}"
    for name, command in zip(gpu_check.PACKAGES, commands[5:], strict=True):
        assert "--no-deps" in command.argv
        assert "--no-build-isolation" in command.argv
        assert command.argv[-2:] == ("-e", f"/r/packages/{name}")
    (note,) = notes
    assert "2.11.0+cu130" in note
    assert "torch==2.13.0" in note
    assert "torch>=2.12" in note


def test_torch_comes_from_nvrx_torch_index_first() -> None:
    env = {"NVRX_TORCH_INDEX": "https://download.pytorch.org/whl/cu130"}
    commands, notes = _plan({**DEVICE_HAS, "torch": None}, None, env)
    first = commands[0]
    assert first.what == "torch (NVRX_TORCH_INDEX)"
    assert first.required
    assert first.argv[-3:] == ("--index-url", env["NVRX_TORCH_INDEX"], "torch==2.13.0")
    assert notes == []
    assert _requirement(commands[1]) == "{cupti}"  # for the CUDA of the torch installed
    spec = {**env, "NVRX_TORCH_SPEC": "torch==2.13.1"}
    assert _requirement(_plan(DEVICE_HAS, "13.0", spec)[0][0]) == "torch==2.13.1"
    pypi = _plan(DEVICE_HAS, "13.0", {"NVRX_TORCH_INDEX": "pypi"})[0][0]
    assert "--index-url" not in pypi.argv
    assert pypi.argv[-1] == "torch==2.13.0"


def test_torch_from_wheels_when_they_hold_one(tmp_path: pathlib.Path) -> None:
    (tmp_path / "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    first = _plan(DEVICE_HAS, "13.0", wheels=tmp_path)[0][0]
    assert first.what == "torch (wheels)"
    assert first.required
    assert "--no-index" in first.argv
    assert first.argv[-1] == "torch==2.13.0"


def test_a_cpu_torch_or_none_is_said(tmp_path: pathlib.Path) -> None:
    commands, notes = _plan({**DEVICE_HAS, "torch": "2.13.0+cpu"}, None)
    assert not any(c.what.startswith(("torch", "cupti")) for c in commands)
    assert "not a CUDA build" in notes[0]
    assert "NVRX_TORCH_INDEX" in notes[0]
    assert notes[1] == "cupti-python is not installed: torch here is no CUDA build"
    commands, notes = _plan({**DEVICE_HAS, "torch": None}, None)
    assert commands[0].what == "torch"
    assert commands[0].required
    assert "NVRX_TORCH_INDEX is unset" in notes[0]


def test_a_matching_cuda_torch_and_tools_need_no_install() -> None:
    have: dict[str, str | None] = dict.fromkeys(DEVICE_HAS, "99.0")
    have.update({"torch": "2.13.0+cu130", "cupti-python": "13.0.1"})
    commands, notes = _plan(have, "13.0")
    assert [c.what for c in commands] == [
        f"{n} (editable, no dependencies)" for n in gpu_check.PACKAGES
    ]
    assert notes == ["keeping the installed torch 2.13.0+cu130 (CUDA 13.0)"]
    have["cupti-python"] = "13.4.0"  # built for another CUDA: the matching one is installed
    assert _requirement(_plan(have, "13.0")[0][0]) == "cupti-python~=13.0.0"


def test_version_rules() -> None:
    assert gpu_check.version_tuple("2.11.0+cu130") == (2, 11, 0)
    assert gpu_check.version_tuple("2.13.0rc1") == (2, 13, 0)
    assert gpu_check.satisfies("2.13.0+cu130", "torch==2.13.0")
    assert not gpu_check.satisfies("2.11.0+cu130", "torch==2.13.0")
    assert gpu_check.satisfies("2.13.1", "torch==2.13.*")
    assert gpu_check.satisfies("2.14.0", "torch>=2.12")
    assert gpu_check.satisfies("13.0.1", "cupti-python~=13.0.0")
    assert not gpu_check.satisfies("13.4.0", "cupti-python~=13.0.0")
    assert not gpu_check.satisfies("1.0", "torch<3")  # unknown forms never match
    assert gpu_check.cupti_spec("12.8") == "cupti-python>=12.8,<13"
    assert gpu_check.cupti_spec("13.2") == "cupti-python~=13.2.0"


def test_download_plan_fetches_small_binary_wheels_for_the_machine(tmp_path: pathlib.Path) -> None:
    (command,) = gpu_check.download_plan(
        tmp_path, python_version="3.12", cuda="13.0", env={}, with_torch=False, python="py"
    )
    argv = list(command.argv)
    assert argv[:4] == ["py", "-m", "pip", "download"]
    for flag in ("--no-deps", "--only-binary=:all:"):
        assert flag in argv
    assert argv[argv.index("--python-version") + 1] == "3.12"
    assert "manylinux_2_28_x86_64" in argv
    assert "manylinux2014_x86_64" in argv
    assert argv[argv.index("-d") + 1] == str(tmp_path)
    assert "cupti-python~=13.0.0" in argv
    assert "hatchling>=1.27" in argv
    assert not any(a.startswith("torch") for a in argv)
    with pytest.raises(ValueError, match="NVRX_TORCH_INDEX"):
        gpu_check.download_plan(tmp_path, python_version="3.12", cuda="13.0", env={},
                                with_torch=True)  # fmt: skip
    env = {"NVRX_TORCH_INDEX": "https://download.pytorch.org/whl/cu130"}
    _, torch_cmd = gpu_check.download_plan(
        tmp_path, python_version="3.12", cuda="13.0", env=env, with_torch=True
    )
    assert torch_cmd.argv[-3:] == ("--index-url", env["NVRX_TORCH_INDEX"], "torch==2.13.0")


def test_plan_option_prints_the_plan_and_installs_nothing(tmp_path: pathlib.Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--plan", "--wheels",
         str(tmp_path), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=90, check=True,
    )  # fmt: skip
    plan = json.loads(out.stdout)
    assert plan["commands"][-1]["what"] == "nvrx-ptl (editable, no dependencies)"
    assert all("--no-index" in c["argv"] for c in plan["commands"])
    assert not (tmp_path / "out").exists()


# -- steps: isolation and budgets ---------------------------------------------------------


def _fake(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _result_writer(status: str, **figures: Any) -> str:
    payload = json.dumps({"status": status, "reason": None, "figures": figures})
    return f"import sys, pathlib; pathlib.Path(sys.argv[1]).write_text({payload!r})"


def test_one_failing_crashing_or_hanging_step_does_not_stop_the_others(
    tmp_path: pathlib.Path,
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    hang = f"""
        import subprocess, sys, time, pathlib
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 start_new_session=True)
        pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))
        time.sleep(600)
    """
    partial = """
        import json, signal, sys, time
        def stop(*_):
            open(sys.argv[1], "w").write(json.dumps(
                {"status": "failed", "reason": "stopped", "figures": {"so_far": 1}}))
            sys.exit(1)
        signal.signal(signal.SIGTERM, stop)
        time.sleep(600)
    """
    programs = {
        "environment": _result_writer("passed", torch="x", checks={"ok": True}),
        "gpu_tests": partial,
        "straggler": "raise SystemExit(3)",
        "cuda_events": hang,
        "nvml_reclaim": _result_writer("not_available"),
        "launcher": "import os; os.kill(os.getpid(), 9)",
        "local_ckpt": _result_writer("passed"),
    }
    steps = [
        gpu_check.Step(
            name, 6 if name in ("cuda_events", "gpu_tests") else 60, name, needs_gpu=False
        )
        for name in programs
    ]
    log_path = tmp_path / "log"
    with log_path.open("w") as log:
        results = gpu_check.run_steps(
            steps, gpu=False, total_budget_s=300, log=log, env=dict(os.environ),
            command=lambda s, f, b: [*_fake(programs[s.name]), str(f)], workdir=tmp_path,
        )  # fmt: skip
    got = {r.name: (r.status, r.reason) for r in results}
    assert list(got) == list(programs)  # every step ran, in order
    assert got["environment"] == ("passed", None)
    assert results[0].figures == {"torch": "x", "checks": {"ok": True}}
    # Past its budget a step is told (SIGTERM) and what it measured so far is kept.
    assert got["gpu_tests"] == ("timed_out", "still running after its budget of 6 s")
    assert results[1].figures == {"so_far": 1}
    assert got["straggler"] == ("failed", "exited 3 without a result")
    assert got["cuda_events"][0] == "timed_out"
    assert got["nvml_reclaim"][0] == "not_available"
    assert got["launcher"] == ("failed", "exited -9 without a result")
    assert got["local_ckpt"] == ("passed", None)
    # What the hung step started in a session of its own went with it.
    grandchild = int(pid_file.read_text())
    assert not pathlib.Path(f"/proc/{grandchild}").exists() or _is_zombie(grandchild)
    assert results[3].figures["processes_left_behind"] == 1
    text = log_path.read_text()
    assert "===== step straggler" in text
    assert "timed_out" in text


def _is_zombie(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except OSError:
        return True


def test_gpu_steps_are_skipped_without_a_gpu_and_budgets_are_shared(
    tmp_path: pathlib.Path,
) -> None:
    steps = [
        gpu_check.Step("environment", 30, "env", needs_gpu=False),
        gpu_check.Step("straggler", 60, "gpu"),
    ]
    budgets: list[float] = []
    clock = iter([0.0, 0.0, 1000.0])

    def command(step: Any, result: pathlib.Path, budget: float) -> list[str]:
        budgets.append(budget)
        return [
            *_fake(_result_writer("passed") + f"; open({str(tmp_path / 'x')!r}, 'w')"),
            str(result),
        ]

    with (tmp_path / "log").open("w") as log:
        results = gpu_check.run_steps(
            steps, gpu=False, total_budget_s=20, log=log, env=dict(os.environ),
            command=command, workdir=tmp_path, clock=lambda: next(clock),
        )  # fmt: skip
    assert budgets == [20]  # its own 30 s capped by the 20 s left of the total
    assert [(r.status, r.reason) for r in results] == [
        ("passed", None),
        ("skipped", "no CUDA GPU visible to torch"),
    ]
    with (tmp_path / "log").open("w") as log:
        late = gpu_check.run_steps(
            steps[:1], gpu=True, total_budget_s=3, log=log, env=dict(os.environ),
            command=command, workdir=tmp_path,
        )  # fmt: skip
    assert late[0].status == "skipped"
    assert "budget" in (late[0].reason or "")


def test_a_step_result_says_what_happened(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "r.json"

    def outcome(body: Any) -> dict[str, Any]:
        with gpu_steps._result(path) as figures:
            body(figures)
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded

    def not_available(figures: dict[str, Any]) -> None:
        raise gpu_steps.NotAvailable("LocalCheckpoints does not exist yet")

    def a_check_fails(figures: dict[str, Any]) -> None:
        figures["score"] = float("nan")
        gpu_steps._check(figures, "fast_enough", False)
        gpu_steps._check(figures, "ran", True)

    def raises(figures: dict[str, Any]) -> None:
        figures["partial"] = 1
        raise RuntimeError("CUDA error")

    assert outcome(lambda f: gpu_steps._check(f, "ok", True)) == {
        "status": "passed", "reason": None, "figures": {"checks": {"ok": True}},
    }  # fmt: skip
    assert outcome(not_available)["status"] == "not_available"
    failed = outcome(a_check_fails)
    assert failed["status"] == "failed"
    assert failed["reason"] == "checks failed: fast_enough"
    assert failed["figures"]["score"] is None  # NaN is JSON's null
    crashed = outcome(raises)
    assert crashed == {
        "status": "failed", "reason": "RuntimeError: CUDA error", "figures": {"partial": 1},
    }  # fmt: skip


def test_junit_counts_name_failed_and_skipped_tests(tmp_path: pathlib.Path) -> None:
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="a" name="t1" time="1.5"/>'
        '<testcase classname="a" name="t2" time="0.1"><failure message="boom"/></testcase>'
        '<testcase classname="b" name="t3" time="0"><skipped message="needs a GPU"/></testcase>'
        "</testsuite></testsuites>"
    )
    counts = gpu_steps.junit_counts(xml)
    assert counts["passed"] == 1
    assert counts["failed_tests"] == ["a::t2: boom"]
    assert counts["skipped_tests"] == ["b::t3: needs a GPU"]
    assert next(iter(counts["slowest_s"])) == "a::t1"


# -- the result ---------------------------------------------------------------------------


def test_result_schema_rejects_what_it_should(tmp_path: pathlib.Path) -> None:
    step = gpu_check.StepResult("straggler", "passed", 60, 1.0, "s", None, {"checks": {"a": True}})
    result = {
        "schema_version": 1, "started": "2026-12-03T08:00:00+00:00", "wall_s": 1.0,
        "total_budget_s": 450.0, "machine": gpu_check.machine(), "gpu_visible": True,
        "torch_probe": "1 2.13.0 13.0",
        "install": {"requested": False, "notes": [], "ok": True, "commands": []},
        "steps": [step.to_json()], "outcome": "passed", "validation": None,
    }  # fmt: skip
    assert gpu_check.validate(result) is None
    path = gpu_check.write_result(tmp_path, result)
    assert json.loads(path.read_text()) == result
    bad_status = {**result, "steps": [{**step.to_json(), "status": "ok"}]}
    assert "status" in (gpu_check.validate(bad_status) or "")
    unexplained = {**result, "steps": [{**step.to_json(), "status": "failed"}]}
    assert gpu_check.validate(unexplained) is not None  # a failure must say why
    assert gpu_check.validate({**result, "extra": 1}) is not None


def test_exit_codes() -> None:
    assert gpu_check.exit_code({"outcome": "passed"}, True) == 0
    assert gpu_check.exit_code({"outcome": "failed"}, False) == 1
    assert gpu_check.exit_code({"outcome": "no_gpu"}, False) == 0
    assert gpu_check.exit_code({"outcome": "no_gpu"}, True) == 1


# -- the whole run without a GPU ----------------------------------------------------------


def _torch_sees_a_gpu() -> bool:
    torch = pytest.importorskip("torch")
    return bool(torch.cuda.is_available())


@pytest.mark.timeout(600)  # four interpreters import torch, on a loaded 2-core CI box too
@pytest.mark.skipif("_torch_sees_a_gpu()", reason="the no-GPU path needs a machine without one")
def test_without_a_gpu_every_gpu_step_is_skipped_and_the_result_is_valid(
    tmp_path: pathlib.Path,
) -> None:
    script = str(ROOT / "tools" / "gpu_check.py")
    env = {k: v for k, v in os.environ.items() if k != "NVRX_REQUIRE_GPU"}
    out = subprocess.run(
        [sys.executable, script, "--out", str(tmp_path), "--steps", "environment,straggler"],
        capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    jsonschema.validate(result, SCHEMA)
    assert result["validation"] is None
    assert result["outcome"] == "no_gpu"
    assert result["gpu_visible"] is False
    environment, straggler = result["steps"]
    assert environment["status"] == "passed", environment
    assert environment["figures"]["cuda_available"] is False
    assert environment["figures"]["torch"]
    assert straggler["status"] == "skipped"
    assert straggler["reason"] == "no CUDA GPU visible to torch"
    assert "===== step environment" in (tmp_path / "gpu_check.log").read_text()
    assert "gpu_check: no_gpu: 1 passed, 1 skipped" in out.stdout

    required = subprocess.run(
        [sys.executable, script, "--out", str(tmp_path), "--steps", "straggler",
         "--require-gpu"],
        capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    assert required.returncode == 1
    assert json.loads((tmp_path / "gpu_check.json").read_text())["outcome"] == "no_gpu"


def test_list_names_every_step_with_its_budget() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--list"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == gpu_check.STEP_NAMES
    total = sum(s.budget_s for s in gpu_check.STEPS)
    assert total >= gpu_check.DEFAULT_TOTAL_BUDGET_S  # the total, not the sum, bounds a run


# -- every GPU path has a gpu test --------------------------------------------------------


def test_every_gpu_path_has_a_test_marked_gpu() -> None:
    noxfile = _load_noxfile()
    local_ckpt = importlib.import_module("nvrx.ft.checkpointing.local")
    for path, files in noxfile.GPU_TESTS.items():
        for name in files:
            test_file = ROOT / name
            if not test_file.exists() and not hasattr(local_ckpt, "LocalCheckpoints"):
                assert path == "local-checkpoint device-to-host copy", name
                continue  # that feature and its gpu test arrive together
            text = test_file.read_text()
            assert "pytest.mark.gpu" in text, f"{name} ({path}) has no test marked gpu"
            assert "def test_" in text, name
    # Every file with a gpu test is listed under the path it exercises.
    listed = {name for files in noxfile.GPU_TESTS.values() for name in files}
    roots = [ROOT / "tests-integration", *(ROOT / "packages").glob("*/tests")]
    marked = {
        str(p.relative_to(ROOT))
        for root in roots
        for p in root.glob("test_*.py")
        if "pytest.mark.gpu" in p.read_text() and p.name != "test_gpu_check.py"
    }
    assert marked <= listed, f"gpu tests not in noxfile.GPU_TESTS: {sorted(marked - listed)}"


def _load_noxfile() -> Any:
    """noxfile.py as a module: the one test_packaging.py loaded, if any (nox warns when
    its sessions are registered twice), else loaded here once."""
    pytest.importorskip("nox")
    loaded = sys.modules.get("noxfile")
    if loaded is None or getattr(loaded, "__file__", None) != str(ROOT / "noxfile.py"):
        loaded = _load_path("noxfile", ROOT / "noxfile.py")
        sys.modules["noxfile"] = loaded
    return loaded


def _load_path(name: str, path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_tests_step_collects_every_gpu_test_file() -> None:
    noxfile = _load_noxfile()
    listed = {str(ROOT / n) for files in noxfile.GPU_TESTS.values() for n in files}
    found = set(gpu_steps.gpu_test_paths())
    assert found <= listed
    assert {p for p in listed if pathlib.Path(p).exists()} == found


def test_publishing_cpu_benchmarks_keeps_the_gpu_section(tmp_path: pathlib.Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        run = _load_path("bench_run_for_gpu_check", ROOT / "benchmarks" / "run.py")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    page = tmp_path / "benchmarks.md"
    run.publish(page, {"cpus": 2}, "| table |")
    assert "## GPU" not in page.read_text()
    gpu = "\n## GPU\n\nH200, 2026-12-03: figures.\n"
    page.write_text(page.read_text() + gpu)
    run.publish(page, {"cpus": 4}, "| new table |")
    text = page.read_text()
    assert "| new table |" in text
    assert "| table |" not in text
    assert text.endswith(gpu)
    real = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "\n## GPU\n" in real  # the page has its GPU heading
    assert "tools/gpu_check.py" in real[real.index("\n## GPU\n") :]


@pytest.mark.parametrize("cuda", ["13.0", "13.2", "12.8", "12.4", "None"])
def test_nox_gpu_tests_and_gpu_check_choose_the_same_cupti_python(cuda: str) -> None:
    noxfile = _load_noxfile()
    expected = gpu_check.cupti_spec(None if cuda == "None" else cuda)
    assert noxfile.cupti_requirement(cuda) == expected
