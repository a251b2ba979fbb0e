"""The packaging rules: declared dependencies = imports (tools/check_deps.py), uploadable
artifacts (tools/check_dist.py), and noxfile.py's GPU and torch-index choices."""

from __future__ import annotations

import importlib.util
import io
import pathlib
import sys
import tarfile
import textwrap
import zipfile
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load(path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check_deps = load(ROOT / "tools" / "check_deps.py")
check_dist = load(ROOT / "tools" / "check_dist.py")
noxfile = load(ROOT / "noxfile.py")

# --- tools/check_deps.py ---------------------------------------------------------------


def make_package(
    root: pathlib.Path,
    code: str,
    dependencies: list[str],
    extras: dict[str, list[str]] | None = None,
    name: str = "nvrx-demo",
) -> pathlib.Path:
    """A package directory with one source file ``code`` and the given dependencies."""
    pkg = root / name
    src = pkg / "src" / "nvrx" / "demo"
    src.mkdir(parents=True)
    (src / "mod.py").write_text(textwrap.dedent(code))
    lines = [f'[project]\nname = "{name}"\nversion = "0"']
    lines.append("dependencies = [" + ", ".join(f'"{d}"' for d in dependencies) + "]")
    if extras:
        lines.append("[project.optional-dependencies]")
        lines += [f"{k} = [" + ", ".join(f'"{d}"' for d in v) + "]" for k, v in extras.items()]
    (pkg / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return pkg


def test_the_repository_declares_exactly_what_it_imports() -> None:
    assert check_deps.main([]) == 0


def test_clean_package_has_no_problems(tmp_path: pathlib.Path) -> None:
    code = """
        import os
        import yaml
        import nvrx.ft
        from nvrx.demo import other
        try:
            import pynvml
        except ImportError:
            pynvml = None
    """
    deps = ["pyyaml>=6", "nvrx-ft-core==1", "nvidia-ml-py"]
    assert check_deps.problems(make_package(tmp_path, code, deps)) == []


def test_undeclared_import_is_reported(tmp_path: pathlib.Path) -> None:
    pkg = make_package(tmp_path, "import psutil\nfrom nvrx import straggler\n", [])
    found = check_deps.problems(pkg)
    assert len(found) == 2
    assert "imports `psutil`" in found[0]
    assert "imports `nvrx.straggler`" in found[1]


def test_declared_but_never_imported_is_reported(tmp_path: pathlib.Path) -> None:
    pkg = make_package(tmp_path, "import torch\n", ["torch>=2", "psutil>=5.9"])
    assert check_deps.problems(pkg) == [
        "nvrx-demo: declares dependency 'psutil', which nothing in src imports"
    ]


def test_extra_import_must_be_guarded(tmp_path: pathlib.Path) -> None:
    code = """
        def timer():
            from cupti import cupti
            return cupti
    """
    pkg = make_package(tmp_path, code, [], {"cupti": ["cupti-python>=12"]})
    (problem,) = check_deps.problems(pkg)
    assert "`cupti` comes only from an extra" in problem
    guarded = """
        def timer():
            try:
                from cupti import cupti
            except (ImportError, OSError):
                return None
            return cupti
    """
    pkg = make_package(tmp_path / "ok", guarded, [], {"cupti": ["cupti-python>=12"]})
    assert check_deps.problems(pkg) == []


def test_type_checking_and_by_name_imports_count_as_use_only(tmp_path: pathlib.Path) -> None:
    code = """
        import importlib
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from lightning.pytorch import Trainer
            import omegaconf
        FLAVOURS = {"pytorch_lightning": "pytorch_lightning"}
        def flavour(name):
            return importlib.import_module(FLAVOURS[name])
    """
    extras = {"lightning": ["lightning>=2"], "pl": ["pytorch-lightning>=2"]}
    # omegaconf is imported only for type checking: not a runtime import, no problem.
    assert check_deps.problems(make_package(tmp_path, code, [], extras)) == []
    # Without the importlib call, the string no longer marks a use.
    no_call = code.replace("return importlib.import_module(FLAVOURS[name])", "return name")
    (problem,) = check_deps.problems(make_package(tmp_path / "b", no_call, [], extras))
    assert "'pytorch-lightning'" in problem


def test_exceptions_table_must_stay_true(tmp_path: pathlib.Path) -> None:
    name = "nvrx-ft-launcher"
    pkg = make_package(tmp_path, "import torch\n", ["torch"], name=name)
    (problem,) = check_deps.problems(pkg)
    assert "lists 'python-etcd', which it does not declare" in problem
    guarded = "try:\n    import etcd\nexcept ImportError:\n    etcd = None\n"
    pkg = make_package(tmp_path / "b", guarded, [], {"etcd": ["python-etcd"]}, name)
    (problem,) = check_deps.problems(pkg)
    assert "is imported now" in problem


# --- tools/check_dist.py ---------------------------------------------------------------

GOOD_METADATA = """\
Metadata-Version: 2.4
Name: nvrx-demo
Version: 0.1.0
Requires-Python: >=3.10
License-Expression: Apache-2.0
License-File: LICENSE
Classifier: Programming Language :: Python :: 3.10
Classifier: Programming Language :: Python :: 3.11
Classifier: Programming Language :: Python :: 3.12
Classifier: Programming Language :: Python :: 3.13
Description-Content-Type: text/markdown

# nvrx-demo

See the [guide](https://nvrx.github.io/nvrx/guides/) and [below](#usage).
"""


def write_wheel(dist: pathlib.Path, metadata: str, license_text: bytes | None) -> None:
    with zipfile.ZipFile(dist / "nvrx_demo-0.1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("nvrx/demo/__init__.py", "")
        zf.writestr("nvrx/demo/py.typed", "")
        zf.writestr("nvrx_demo-0.1.0.dist-info/METADATA", metadata)
        if license_text is not None:
            zf.writestr("nvrx_demo-0.1.0.dist-info/licenses/LICENSE", license_text)


def wheel_problems(tmp_path: pathlib.Path, metadata: str, lic: bytes | None) -> list[str]:
    write_wheel(tmp_path, metadata, lic)
    art = check_dist.read_wheel(next(tmp_path.glob("*.whl")))
    found: list[str] = check_dist.metadata_problems(art, b"the license")
    found += check_dist.content_problems(art, expect_hotpath=True)
    return found


def test_sound_wheel_passes(tmp_path: pathlib.Path) -> None:
    assert wheel_problems(tmp_path, GOOD_METADATA, b"the license") == []


def test_each_metadata_fault_is_named(tmp_path: pathlib.Path) -> None:
    bad = (
        GOOD_METADATA.replace("License-File: LICENSE\n", "")
        .replace(
            "Requires-Python", "Project-URL: Issues, https://example.org/issues\nRequires-Python"
        )
        .replace("Classifier: Programming Language :: Python :: 3.11\n", "")
        .replace(
            "Classifier: Programming",
            "Classifier: License :: OSI Approved :: Apache Software License\n"
            "Classifier: Programming",
            1,
        )
        .replace("(#usage)", "(docs/guides/usage.md)")
    )
    found = wheel_problems(tmp_path, bad, b"another license")
    assert found == [
        "no License-File: LICENSE",
        "its LICENSE differs from the repository's",
        "deprecated classifier 'License :: OSI Approved :: Apache Software License'",
        "no classifier for CPython 3.11",
        "Project-URL 'Issues': nvrx has no public home yet",
        "repository-relative link 'docs/guides/usage.md' in the long description "
        "(it breaks on PyPI)",
    ]


def test_missing_license_and_missing_artifacts(tmp_path: pathlib.Path) -> None:
    assert "the LICENSE file is missing from the archive" in wheel_problems(
        tmp_path, GOOD_METADATA, None
    )
    problems = check_dist.check(tmp_path, expect_hotpath=False)
    assert "nvrx-straggler: no wheel in " + str(tmp_path) in problems
    assert not any("claim different CPythons" in p for p in problems)
    # An sdist claiming one CPython fewer than the wheel beside it is caught.
    fewer = GOOD_METADATA.replace("Classifier: Programming Language :: Python :: 3.13\n", "")
    write_sdist(tmp_path / "nvrx_demo-0.1.0.tar.gz", {"PKG-INFO": fewer.encode()})
    problems = check_dist.check(tmp_path, expect_hotpath=False)
    assert any("the artifacts claim different CPythons" in p for p in problems)
    assert "nvrx-demo" not in check_dist.DISTRIBUTIONS


def write_sdist(path: pathlib.Path, files: dict[str, bytes]) -> pathlib.Path:
    """An sdist holding ``files`` under its top folder."""
    top = path.name.removesuffix(".tar.gz")
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_sdist_is_read_with_its_license(tmp_path: pathlib.Path) -> None:
    files = {"PKG-INFO": GOOD_METADATA.encode(), "LICENSE": b"the license", "pyproject.toml": b""}
    art = check_dist.read_sdist(write_sdist(tmp_path / "nvrx_demo-0.1.0.tar.gz", files))
    assert check_dist.metadata_problems(art, b"the license") == []
    assert check_dist.content_problems(art, expect_hotpath=True) == []


def test_straggler_binary_wheel_needs_its_compiled_hot_path(tmp_path: pathlib.Path) -> None:
    meta = GOOD_METADATA.replace("Name: nvrx-demo", "Name: nvrx-straggler")
    path = tmp_path / "nvrx_straggler-0.1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("nvrx/straggler/py.typed", "")
        zf.writestr("nvrx/straggler/_hotpath.c", "")
        zf.writestr("nvrx_straggler-0.1.0.dist-info/METADATA", meta)
    art = check_dist.read_wheel(path)
    found = check_dist.content_problems(art, expect_hotpath=True)
    assert "ships C source nvrx/straggler/_hotpath.c" in found
    assert "binary wheel without the compiled hot path" in found
    # Every file of the real package's src/ that this wheel lacks is named.
    assert "lacks nvrx/straggler/report.schema.json of its src/" in found
    assert "lacks nvrx/straggler/py.typed of its src/" not in found


# --- noxfile.py ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "required"),
    [({}, False), ({"NVRX_REQUIRE_GPU": "0"}, False), ({"NVRX_REQUIRE_GPU": "1"}, True)],
)
def test_gpu_required_reads_its_variable(env: dict[str, str], required: bool) -> None:
    assert noxfile.gpu_required(env) is required


def test_gpu_required_refuses_other_values() -> None:
    with pytest.raises(ValueError, match=r"NVRX_REQUIRE_GPU='yes' is not valid"):
        noxfile.gpu_required({"NVRX_REQUIRE_GPU": "yes"})


def test_no_gpu_fails_only_where_one_is_required() -> None:
    fail, message = noxfile.no_gpu_outcome(required=True)
    assert fail
    assert "NVRX_REQUIRE_GPU=1" in message
    fail, message = noxfile.no_gpu_outcome(required=False)
    assert not fail
    assert "no gpu tests were run" in message


def test_torch_index_choices() -> None:
    python = sys.executable
    assert noxfile.torch_index(python, {"NVRX_TORCH_INDEX": "pypi"}) == []
    cu = "https://download.pytorch.org/whl/cu128"
    assert noxfile.torch_index(python, {"NVRX_TORCH_INDEX": cu}) == ["--index-url", cu]
    with pytest.raises(ValueError, match=r"NVRX_TORCH_INDEX='cpu' is not valid"):
        noxfile.torch_index(python, {"NVRX_TORCH_INDEX": "cpu"})


@pytest.mark.skipif(sys.platform != "linux", reason="the CPU index is the Linux default only")
def test_torch_index_default_keeps_a_local_wheel_else_takes_the_cpu_index(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real local wheel in a find-links folder, found by pip without any index.
    wheel = tmp_path / "torch-1.0.0+cpu-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("torch/__init__.py", "")
        meta = "Metadata-Version: 2.1\nName: torch\nVersion: 1.0.0+cpu\n"
        zf.writestr("torch-1.0.0+cpu.dist-info/METADATA", meta)
        wheel_info = "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
        zf.writestr("torch-1.0.0+cpu.dist-info/WHEEL", wheel_info)
        zf.writestr("torch-1.0.0+cpu.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setattr(noxfile, "TORCH_SPEC", "torch==1.0.0")
    assert noxfile.torch_index(sys.executable, {}) == []
    monkeypatch.setattr(noxfile, "TORCH_SPEC", "torch==1.0.1")
    assert noxfile.torch_index(sys.executable, {}) == ["--index-url", noxfile.TORCH_CPU_INDEX]


def test_straggler_sdist_needs_its_c_source(tmp_path: pathlib.Path) -> None:
    meta = GOOD_METADATA.replace("Name: nvrx-demo", "Name: nvrx-straggler").encode()
    path = write_sdist(tmp_path / "nvrx_straggler-0.1.0.tar.gz", {"PKG-INFO": meta})
    found = check_dist.content_problems(check_dist.read_sdist(path), expect_hotpath=True)
    assert "lacks src/nvrx/straggler/_hotpath.c" in found
    assert "lacks src/nvrx/straggler/sections.py" in found
