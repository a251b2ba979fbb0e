"""Every task the project runs: lint, typecheck, tests, integration, build, docs, bench.

``nox -s ci`` runs everything CI needs. ``nox -l`` lists the sessions.

torch is installed first in every venv that needs it and then pinned with a
constraints file, so no later install can swap in another build (a CUDA wheel of
several GB, say). ``NVRX_TORCH_SPEC`` chooses the torch requirement (default
``torch==2.13.0``) and ``NVRX_TORCH_INDEX`` the index it comes from: a wheel pip finds
on this machine (its find-links) is used as it is; otherwise, on Linux, torch comes
from PyTorch's CPU wheel index rather than PyPI's CUDA build (see ``torch_index``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import zipfile

import nox

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["ci"]

ROOT = pathlib.Path(__file__).resolve().parent
TORCH_SPEC = os.environ.get("NVRX_TORCH_SPEC", "torch==2.13.0")
#: pip byte-compiles what it installs by default. Skipped where a venv imports torch once
#: or twice (``build``): over half of torch's install time (47 s -> 20 s without). Not where
#: tests start processes that import torch: with PYTHONDONTWRITEBYTECODE=1 (set on the CI
#: machine) nothing compiled at import is kept, and every process compiled torch again
#: (``import torch`` 2.5 -> 5.5 s of CPU, ``import lightning`` 5 -> 11.5 s, 2026-12-03).
NO_COMPILE = "--no-compile"
#: PyTorch's documented index for CPU-only wheels (``pip install torch --index-url ...``).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: The CPythons the packages claim (their classifiers, the same in each, which
#: tools/check_dist.py checks); ``hotpath_matrix`` builds and tests on each.
PYTHONS = [
    c.rsplit(" :: ", 1)[1]
    for c in nox.project.load_toml(ROOT / "packages" / "nvrx-straggler" / "pyproject.toml")[
        "project"
    ]["classifiers"]
    if c.startswith("Programming Language :: Python :: 3.")
]
#: nvrx-straggler's tests of its C hot path that run without torch, and what they need.
HOTPATH_TESTS = [str(ROOT / "packages" / "nvrx-straggler" / "tests" / "test_hotpath_parity.py")]
HOTPATH_TEST_TOOLS = ["pytest>=8", "pytest-timeout>=2.3"]

# Each distribution and the siblings it declares, in install order.
PACKAGES: dict[str, list[str]] = {
    "nvrx-ft-core": [],
    "nvrx-ft-launcher": ["nvrx-ft-core"],
    "nvrx-straggler": [],
    "nvrx-ptl": ["nvrx-ft-core", "nvrx-ft-launcher", "nvrx-straggler"],
}
IMPORT_NAMES = {
    "nvrx-ft-core": "nvrx.ft",
    "nvrx-ft-launcher": "nvrx.launcher",
    "nvrx-straggler": "nvrx.straggler",
    "nvrx-ptl": "nvrx.ptl",
}
#: The suites mostly wait (real monitors, ranks and launchers: rendezvous, timeouts,
#: restarts), so two pytest-xdist workers run them in about 2/3 of the time or less (on
#: 2026-12-01, 2 cores: launcher 434 -> 298 s, integration 460 -> 290 s; 2026-12-03:
#: ft-core 266 -> 156 s, ptl 269 -> 195-213 s, ptl's fast tests (ptl_lowest) 112 ->
#: 81-89 s). ``-n 0`` in the session's arguments runs one serially (integration:
#: ``-- -n 0 tests-integration``). Work stealing: tests last from 0.1 s to 2 min, and a
#: worker that ends its share early takes tests from the other instead of waiting for the
#: last long one.
PARALLEL_TESTS = ["-n", "2", "--dist", "worksteal"]
XDIST = "pytest-xdist>=3.5"
#: nvrx-straggler's suite is short and busy (gloo ranks computing): two workers gained
#: nothing (2026-12-03: C path 28.5 -> 26-28 s, Python path 24.7 -> 25-29 s).
SERIAL_PACKAGES = {"nvrx-straggler"}
# What every session that runs the whole stack needs beside the four packages.
#: The lowest Lightning nvrx-ptl declares; nox -s ptl_lowest tests it in CI.
LIGHTNING_LOWEST = "lightning==2.4.*"
STACK_EXTRAS = [
    "lightning>=2.4",
    "omegaconf>=2.3",
    "psutil>=5.9",  # the integration harness and benchmarks find stray processes with it
    "pytest>=8",
    "pytest-timeout>=2.3",
]
CI_SESSIONS = [
    "lint",
    "typecheck",
    *(f"tests(package='{name}')" for name in PACKAGES),
    "ptl_lowest",
    "integration",
    "build",
    "docs",
]


def _pkg_dir(name: str) -> str:
    return str(ROOT / "packages" / name)


def torch_index(python: str, env: dict[str, str] | os._Environ[str] = os.environ) -> list[str]:
    """pip arguments that choose where torch comes from, for the interpreter ``python``.

    ``NVRX_TORCH_INDEX`` unset: a wheel matching ``NVRX_TORCH_SPEC`` that pip finds
    without any index (its find-links, as on a machine with a local wheel cache) is
    used through pip's own configuration; failing that, Linux gets PyTorch's CPU index,
    since PyPI's Linux torch is the CUDA build with several GB of CUDA libraries.
    ``NVRX_TORCH_INDEX=<url>`` uses that index (``.../whl/cu128`` for a GPU machine);
    ``NVRX_TORCH_INDEX=pypi`` uses pip's own configuration unchanged.
    """
    chosen = env.get("NVRX_TORCH_INDEX", "").strip()
    if chosen == "pypi":
        return []
    if chosen:
        if not chosen.startswith(("https://", "http://", "file://")):
            raise ValueError(
                f"NVRX_TORCH_INDEX={chosen!r} is not valid: give an index URL or 'pypi'"
            )
        return ["--index-url", chosen]
    if platform.system() != "Linux":
        return []  # PyPI's macOS and Windows wheels are CPU builds already
    probe = [python, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index", "-q"]
    found = subprocess.run([*probe, TORCH_SPEC], capture_output=True, check=False)
    return [] if found.returncode == 0 else ["--index-url", TORCH_CPU_INDEX]


def install_torch(session: nox.Session) -> str:
    """Install torch from ``NVRX_TORCH_SPEC`` and return a constraints file that pins it."""
    index = torch_index_or_error(session, session_python(session))
    share_torch(session, session_python(session), index)
    # Satisfied by the shared folder; installs only what the venv needs newer (setuptools).
    session.install(*index, TORCH_SPEC)
    out = session.run(
        "python", "-c", "import torch; print(torch.__version__)", silent=True, log=False
    )
    version = str(out).strip().splitlines()[-1]
    constraints = pathlib.Path(session.create_tmp()) / "constraints.txt"
    constraints.write_text(f"torch=={version}\n")
    return str(constraints)


#: torch and its dependencies installed and byte-compiled once for all sessions (one folder
#: per spec, index and interpreter), which each venv reads through a .pth file, after its
#: own site-packages: the same torch every session installed, 20-25 s of unpacking each on
#: an idle 2-core machine, over a minute when it is loaded. ``pip install torch`` in a venv
#: then finds it installed; a package that needs another version of one of its
#: dependencies (jinja2, typing-extensions...) gets it in the venv, which comes first.
SHARED_TORCH = ROOT / ".nox" / "_shared-torch"
_PYTHON_TAG = (
    "import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform()); "
    "print(sysconfig.get_path('purelib'))"
)


def share_torch(
    session: nox.Session, python: str, index: list[str], *, external: bool = False
) -> pathlib.Path:
    """Make the shared torch importable for ``python`` (a venv's interpreter), unpacking it
    into ``SHARED_TORCH`` the first time; returns its folder."""
    lines = str(session.run(python, "-c", _PYTHON_TAG, silent=True, log=False, external=external))
    tag, purelib = lines.strip().splitlines()[-2:]
    key = hashlib.sha256(json.dumps([TORCH_SPEC, index, tag]).encode()).hexdigest()[:16]
    folder = SHARED_TORCH / key
    if not folder.is_dir():  # only a complete install is ever renamed to this name
        partial = folder.with_name(f"{key}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        target = [*index, "--target", str(partial), TORCH_SPEC]
        session.run(python, "-m", "pip", "install", "-q", *target, external=external)
        partial.rename(folder)
    (pathlib.Path(purelib) / "_nvrx_shared_torch.pth").write_text(f"{folder}\n")
    return folder


def session_python(session: nox.Session) -> str:
    """The interpreter of the session's venv."""
    return str(pathlib.Path(session.bin) / "python")


def torch_index_or_error(session: nox.Session, python: str) -> list[str]:
    """``torch_index`` for ``python``, or the session fails naming the bad value."""
    try:
        return torch_index(python)
    except ValueError as exc:
        session.error(str(exc))


def install_packages(session: nox.Session, names: list[str], *extra: str) -> str:
    """Install torch, then ``names`` (editable, in order) and ``extra`` requirements."""
    constraints = install_torch(session)
    editable = [arg for name in names for arg in ("-e", _pkg_dir(name))]
    # setuptools (nvrx-straggler) then adds src/ to sys.path, as hatchling does, instead
    # of an import hook that mypy cannot follow; hatchling ignores the setting.
    compat = ["--config-settings", "editable_mode=compat"]
    session.install("-c", constraints, *compat, *editable, *extra)
    return constraints


def test_group(name: str) -> tuple[str, ...]:
    """The ``test`` dependency group of one package's pyproject.toml."""
    return nox.project.dependency_groups(
        nox.project.load_toml(ROOT / "packages" / name / "pyproject.toml"), "test"
    )


def pytest_args(session: nox.Session, *paths: str) -> list[str]:
    return ["pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), *paths]


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint and format check, one version, Markdown links, declared = imported deps."""
    session.install("ruff>=0.6", "tomli>=2; python_version < '3.11'")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("python", "tools/version.py", "--check")
    session.run("python", "tools/check_ci_command.py")
    session.run("python", "tools/check_links.py")
    session.run("python", "tools/check_commit_subjects.py")
    session.run("python", "tools/check_deps.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over each package and its tests, the integration tests and tools."""
    install_packages(
        session,
        list(PACKAGES),
        *STACK_EXTRAS,
        "mypy>=1.10",
        "nox>=2024.4.15",
        "tomli>=2",  # tools/check_deps.py on Python 3.10, which mypy targets
        "types-PyYAML",
        "types-psutil",
        # Test-only imports the packages' tests make (their test groups), so mypy sees
        # them; cupti-python stays out: the straggler code types it through a Protocol.
        "hypothesis>=6.100",
        "jsonschema>=4.18",
        "prometheus-client>=0.20",
    )
    config = str(ROOT / "pyproject.toml")
    env = {
        "MYPYPATH": os.pathsep.join(str(ROOT / "packages" / n / "src") for n in PACKAGES),
        # One cache for every run below: torch is analysed once, not once per folder.
        "MYPY_CACHE_DIR": str(ROOT / ".mypy_cache"),
    }
    for name in PACKAGES:
        session.chdir(_pkg_dir(name))
        session.run("mypy", "--config-file", config, "src", "tests", env=env)
    examples = sorted(p for p in (ROOT / "examples").iterdir() if p.is_dir())
    for folder in [ROOT / "tests-integration", ROOT / "benchmarks", *examples]:
        session.chdir(folder)
        # A folder's scripts/ run as scripts (their own folder first on sys.path), so their
        # shared modules are top-level imports there.
        scripts = folder / "scripts"
        paths = [env["MYPYPATH"], *([str(scripts)] if scripts.is_dir() else [])]
        folder_env = {**env, "MYPYPATH": os.pathsep.join(paths)}
        session.run("mypy", "--config-file", config, ".", env=folder_env)
    session.chdir(ROOT)
    session.run("mypy", "--config-file", config, "noxfile.py", "tools", env=env)


def ensure_etcd(session: nox.Session) -> dict[str, str]:
    """An etcd server for the launcher's etcd tests: on PATH, or from Debian's packages.

    Once it is there the tests are told to fail, not skip, if they cannot use it.
    """
    if shutil.which("etcd") is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "etcd-server"]
        try:
            session.run(*install, external=True, env=env)
        except nox.command.CommandFailed:  # stale package lists
            session.run("apt-get", "update", "-q", external=True, env=env)
            session.run(*install, external=True, env=env)
    if shutil.which("etcd") is None:
        session.warn("no etcd server here: the launcher's etcd tests will be skipped")
        return {}
    return {"NVRX_REQUIRE_ETCD": "1"}


@nox.session
@nox.parametrize("package", list(PACKAGES))
def tests(session: nox.Session, package: str) -> None:
    """One package's tests, in a venv holding only it, its declared deps and test tools."""
    serial = package in SERIAL_PACKAGES
    tools = [*test_group(package), *([] if serial else [XDIST])]
    install_packages(session, [*PACKAGES[package], package], *tools)
    env = ensure_etcd(session) if package == "nvrx-ft-launcher" else {}
    tests_dir = str(ROOT / "packages" / package / "tests")
    parallel = [] if serial else PARALLEL_TESTS
    args = [*pytest_args(session, tests_dir), "-m", "not gpu", *parallel, *session.posargs]
    if package != "nvrx-straggler":
        session.run(*args, env=env)
        return
    # Once with the C hot path (it must have been built), once with the Python one.
    session.run(*args, env={"NVRX_REQUIRE_HOTPATH": "1"})
    session.run(*args, env={"NVRX_STRAGGLER_PURE_PYTHON": "1"})


@nox.session
def ptl_lowest(session: nox.Session) -> None:
    """nvrx-ptl's tests on the lowest Lightning it declares (the newest runs in tests)."""
    lowest = [LIGHTNING_LOWEST, LIGHTNING_LOWEST.replace("lightning", "pytorch-lightning", 1)]
    extras = [*test_group("nvrx-ptl"), *lowest, XDIST]
    install_packages(session, [*PACKAGES["nvrx-ptl"], "nvrx-ptl"], *extras)
    tests_dir = str(ROOT / "packages" / "nvrx-ptl" / "tests")
    # The slow tests (real subprocess fits, ft_launcher runs) ran on 2.4 when the floor
    # was set (2026-12-03: 18 passed); CI keeps to the fast ones to stay within its time.
    marks = "not gpu and not slow"
    session.run(*pytest_args(session, tests_dir), "-m", marks, *PARALLEL_TESTS, *session.posargs)


@nox.session
def integration(session: nox.Session) -> None:
    """Cross-package tests: real ft_launcher runs, Lightning, the fault matrix."""
    # nox: the tests of noxfile.py's own helpers (tests-integration/test_packaging.py).
    # jsonschema: tests-integration/test_gpu_check.py validates tools/gpu_check.py's result.
    extras = [*STACK_EXTRAS, "nox>=2024.4.15", XDIST, "jsonschema>=4.18"]
    install_packages(session, list(PACKAGES), *extras)
    paths = session.posargs or [str(ROOT / "tests-integration")]
    session.run(*pytest_args(session), "-m", "not gpu", *PARALLEL_TESTS, *paths)


@nox.session
def build(session: nox.Session) -> None:
    """Every wheel and sdist built, checked (metadata, contents, twine) and installed alone.

    hatch builds them (nvrx-straggler's through setuptools, for its C extension);
    tools/check_dist.py and ``twine check --strict`` check them; each wheel is installed
    alone and imported, and nvrx-straggler's sdist where no C compiler works.
    """
    session.install("hatch>=1.9", "twine>=6.1")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for name in PACKAGES:
        session.chdir(_pkg_dir(name))
        session.run("hatch", "build", str(dist))
    session.chdir(ROOT)
    artifacts = sorted(str(p) for p in dist.iterdir())
    session.run("python", "tools/check_dist.py", str(dist), "--expect-hotpath")
    session.run("twine", "check", "--strict", *artifacts)
    constraints = pathlib.Path(session.create_tmp()) / "constraints.txt"
    constraints.write_text(f"{TORCH_SPEC}\n")
    # One venv with torch alone; after each wheel every distribution torch did not bring
    # is removed again, so each wheel is checked beside torch only (one torch install,
    # not one per wheel: about 45 s each here).
    venv = pathlib.Path(session.create_tmp()) / "alone"
    shutil.rmtree(venv, ignore_errors=True)
    session.run(sys.executable, "-m", "venv", str(venv), external=True)
    python = str(venv / "bin" / "python")
    index = torch_index_or_error(session, python)
    share_torch(session, python, index, external=True)
    install = [python, "-m", "pip", "install", "-q", NO_COMPILE, *index, TORCH_SPEC]
    session.run(*install, external=True)
    with_torch = installed_distributions(python)
    for name in PACKAGES:
        wheel = next(dist.glob(f"{name.replace('-', '_')}-*.whl"))
        session.run(
            python, "-m", "pip", "install", "-q", "-c", str(constraints),
            "--find-links", str(dist), str(wheel), external=True,
        )  # fmt: skip
        check = f"import {IMPORT_NAMES[name]} as m; print(m.__name__, m.__version__)"
        if name == "nvrx-straggler":
            # The wheel carries the compiled hot path, not only its Python fallback.
            check += "; from nvrx.straggler.sections import HOT_PATH; assert HOT_PATH == 'c'"
        session.run(python, "-c", check, external=True)
        added = sorted({n for n, _ in installed_distributions(python) - with_torch})
        session.run(python, "-m", "pip", "uninstall", "-q", "-y", *added, external=True)
        if installed_distributions(python) != with_torch:  # e.g. a dependency torch brought
            session.error(f"{name}: the venv did not go back to torch alone")  # was upgraded
    shutil.rmtree(venv)
    sdist_without_compiler(session, next(dist.glob("nvrx_straggler-*.tar.gz")))


def installed_distributions(python: str) -> set[tuple[str, str]]:
    """(name, version) of each distribution installed for ``python`` (pip's own included)."""
    listing = subprocess.run(
        [python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {(entry["name"].lower(), entry["version"]) for entry in json.loads(listing)}


# Run where nvrx-straggler was installed without its extension: the Python path runs,
# and one WARNING at import says so (the fix is the user's: a wheel or a compiler).
_PYTHON_PATH_CHECK = """
import logging
records = []
handler = logging.Handler(logging.INFO)
handler.emit = records.append
logging.getLogger("nvrx.straggler").addHandler(handler)
logging.getLogger("nvrx.straggler").setLevel(logging.INFO)
from nvrx.straggler import sections, statistics
assert sections.HOT_PATH == "python", sections.HOT_PATH
said = [r for r in records if "pure-Python path" in r.getMessage()]
assert len(said) == 1 and said[0].levelno == logging.WARNING, [r.getMessage() for r in records]
print("without a compiler: HOT_PATH == 'python', said once as a warning")
"""


def sdist_without_compiler(session: nox.Session, sdist: pathlib.Path) -> None:
    """nvrx-straggler's sdist installs where no C compiler works (``CC=false``) and
    runs its Python path, warning once at import (no torch needed for that part)."""
    venv = pathlib.Path(session.create_tmp()) / "no-compiler"
    shutil.rmtree(venv, ignore_errors=True)
    session.run(sys.executable, "-m", "venv", str(venv), external=True)
    python = str(venv / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", "--no-deps", str(sdist)]
    session.run(*install, env={"CC": "false"}, external=True)
    session.run(python, "-c", _PYTHON_PATH_CHECK, external=True)
    shutil.rmtree(venv)


def find_python(version: str) -> str | None:
    """An interpreter of CPython ``version``: ``python<version>`` on PATH, else one pyenv
    installed (its shims only run the versions pyenv was told to activate)."""
    pyenv = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(map(str, pyenv.glob(f"versions/{version}.*/bin/python{version}")))
    check = "import sys; print('%d.%d' % sys.version_info[:2])"
    for candidate in filter(None, candidates):
        out = subprocess.run([candidate, "-c", check], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    return None


@nox.session(venv_backend="none")
def hotpath_matrix(session: nox.Session) -> None:
    """nvrx-straggler's C hot path built and parity-tested on every CPython we claim."""
    # One venv per CPython, without torch (the hot path and its parity tests do not
    # need it), holding nvrx-straggler installed as a user would: built from source.
    missing = [v for v in PYTHONS if find_python(v) is None]
    if missing:
        session.error(f"no CPython {', '.join(missing)} on PATH or in pyenv")
    for version in PYTHONS:
        python = find_python(version)
        assert python is not None
        venv = pathlib.Path(session.create_tmp()) / f"hotpath-{version}"
        shutil.rmtree(venv, ignore_errors=True)
        session.run(python, "-m", "venv", str(venv), external=True)
        vpython = str(venv / "bin" / "python")
        install = [vpython, "-m", "pip", "install", "-q"]
        session.run(*install, *HOTPATH_TEST_TOOLS, external=True)
        session.run(*install, "--no-deps", _pkg_dir("nvrx-straggler"), external=True)
        session.run(
            vpython, "-m", *pytest_args(session, *HOTPATH_TESTS), *session.posargs,
            env={"NVRX_REQUIRE_HOTPATH": "1"}, external=True,
        )  # fmt: skip
        shutil.rmtree(venv)


@nox.session
def docs(session: nox.Session) -> None:
    """Sphinx HTML docs, warnings as errors."""
    install_packages(session, list(PACKAGES), *STACK_EXTRAS, "sphinx>=7", "myst-parser>=3")
    out = ROOT / "docs" / "_build" / "html"
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", str(out))


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark of the four packages: one JSON file, a table and docs/benchmarks.md."""
    install_packages(session, list(PACKAGES), *STACK_EXTRAS)
    args = session.posargs or ["--publish", "docs/benchmarks.md"]
    session.run("python", "benchmarks/run.py", *args, env=nvrx_reference(session))


def nvrx_reference(session: nox.Session) -> dict[str, str]:
    """NVRx 0.4.1 unpacked beside the venv (not installed: its own ``ft_launcher`` script
    would replace ours), so bench_straggler.py times NVRx's generate_report in the same
    run; ``NVRX_REFERENCE_PATH`` tells it where. Without it (no network, or no wheel for
    this CPython: NVRx ships one for 3.11 only) the bench scales the issue's figures."""
    ref = pathlib.Path(session.create_tmp()) / "nvrx-reference"
    if not any(ref.glob("nvidia_resiliency_ext-*.dist-info")):
        download = ["python", "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        try:
            session.run(*download, "-d", str(ref / "wheel"), "nvidia-resiliency-ext==0.4.1")
        except nox.command.CommandFailed:
            session.warn("nvidia-resiliency-ext 0.4.1 cannot be downloaded: no NVRx baseline")
            return {}
        for wheel in (ref / "wheel").glob("*.whl"):
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(ref)
    return {"NVRX_REFERENCE_PATH": str(ref)}


def gpu_required(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether ``NVRX_REQUIRE_GPU`` says this machine must have a GPU (``1``) or not
    (``0`` or unset); any other value is refused, naming it."""
    value = env.get("NVRX_REQUIRE_GPU", "0").strip()
    if value not in ("0", "1", ""):
        raise ValueError(f"NVRX_REQUIRE_GPU={value!r} is not valid: use 1 or 0")
    return value == "1"


def no_gpu_outcome(required: bool) -> tuple[bool, str]:
    """What ``gpu_tests`` does where torch sees no GPU: (fail?, the message it gives)."""
    if required:
        return True, "NVRX_REQUIRE_GPU=1 but torch sees no CUDA GPU: no gpu test could run"
    return False, "no CUDA GPU visible to torch: no gpu tests were run"


def visible_gpus(session: nox.Session) -> int:
    """How many CUDA devices torch sees in the session's venv."""
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    out = str(session.run("python", "-c", probe, silent=True, log=False)).strip()
    return int(out.splitlines()[-1]) if out else 0


@nox.session
def gpu_tests(session: nox.Session) -> None:
    """Tests marked gpu; without a GPU, fails if NVRX_REQUIRE_GPU=1, else runs nothing."""
    try:
        required = gpu_required()
    except ValueError as exc:
        session.error(str(exc))
    constraints = install_packages(session, list(PACKAGES), *STACK_EXTRAS)
    if visible_gpus(session) == 0:
        fail, message = no_gpu_outcome(required)
        if fail:
            session.error(message)
        session.skip(message)  # nox then reports "skipped", never "successful"
    # cupti-python pins nvidia-cuda-cupti to its own CUDA minor: match torch's CUDA.
    cuda = str(session.run("python", "-c", "import torch; print(torch.version.cuda)", silent=True))
    session.install("-c", constraints, cupti_requirement(cuda.strip().splitlines()[-1]))
    tests_dirs = [str(ROOT / "packages" / n / "tests") for n in PACKAGES]
    args = pytest_args(session, *tests_dirs, str(ROOT / "tests-integration"))
    # Exit code 5 (nothing collected) fails the session: gpu tests must exist.
    session.run(*args, "-m", "gpu", *session.posargs)


#: Each GPU path and the tests marked ``gpu`` that exercise it on a real GPU (run by
#: ``gpu_tests``; tests-integration/test_gpu_check.py checks each file exists and is
#: marked). The local-checkpoint one is required once ``LocalCheckpoints`` exists.
GPU_TESTS: dict[str, list[str]] = {
    "CUPTI kernel timing": ["packages/nvrx-straggler/tests/test_gpu.py"],
    "CUDA-event section timing": ["packages/nvrx-straggler/tests/test_gpu_events.py"],
    "NVML health check": [
        "packages/nvrx-ft-core/tests/test_gpu.py",
        "packages/nvrx-ft-launcher/tests/test_node_health.py",
    ],
    "GPU memory reclaim": [
        "packages/nvrx-ft-launcher/tests/test_gpu_memory.py",
        "packages/nvrx-ft-launcher/tests/test_gpu_memory_watch.py",
    ],
    "NVML NVLink domain (segment id)": ["packages/nvrx-ft-launcher/tests/test_segments.py"],
    "NCCL under ft_launcher restarts and warm spares": ["tests-integration/test_gpu_launcher.py"],
    "local-checkpoint device-to-host copy": ["packages/nvrx-ft-core/tests/test_local_ckpt_gpu.py"],
}


def cupti_requirement(cuda: str) -> str:
    """The cupti-python for torch's CUDA ``X.Y`` (as tools/gpu_check.py chooses it)."""
    parts = cuda.split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return "cupti-python>=12.8"
    if int(parts[0]) >= 13:
        return f"cupti-python~={parts[0]}.{parts[1]}.0"
    return "cupti-python>=12.8,<13"


@nox.session
def gpu_check(session: nox.Session) -> None:
    """tools/gpu_check.py: every GPU path on this machine's GPU, one JSON result and a log.

    torch comes from ``NVRX_TORCH_INDEX`` (a CUDA index on a GPU machine); the script
    then installs cupti-python for that torch's CUDA. Arguments after ``--`` go to the
    script (default ``--out gpu-check-output``). Without a GPU the session is skipped,
    or fails with ``NVRX_REQUIRE_GPU=1``.
    """
    try:
        required = gpu_required()
    except ValueError as exc:
        session.error(str(exc))
    install_packages(session, list(PACKAGES), *STACK_EXTRAS, "jsonschema>=4.18")
    args = session.posargs or ["--out", str(ROOT / "gpu-check-output")]
    out = pathlib.Path(args[args.index("--out") + 1]) if "--out" in args else None
    session.run("python", str(ROOT / "tools" / "gpu_check.py"), "--install", *args)
    if out is not None and not required:
        result = json.loads((out / "gpu_check.json").read_text())
        if result["outcome"] == "no_gpu":
            session.skip(no_gpu_outcome(False)[1])  # reported "skipped", not "successful"


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: a Lightning run under ft_launcher with injected faults."""
    install_packages(session, list(PACKAGES), "lightning>=2.4")
    session.run("python", "examples/demo/run_demo.py", *session.posargs)


@nox.session(venv_backend="none")
def ci(session: nox.Session) -> None:
    """Everything CI needs, in order: lint, typecheck, tests, integration, build, docs."""
    # A parametrized session must be notified once per parameter: notifying the bare
    # name runs only its first parametrization.
    for name in CI_SESSIONS:
        session.notify(name)
