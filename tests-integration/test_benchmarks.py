"""Every benchmark module is one that ``benchmarks/run.py`` (``nox -s bench``) can run."""

from __future__ import annotations

import ast
import pathlib

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.timeout(30)
def test_every_bench_module_has_the_suites_run_function() -> None:
    """run.py calls ``run(quick)`` of each ``bench_*.py``; one without it failed the suite."""
    modules = sorted(BENCHMARKS.glob("bench_*.py"))
    assert len(modules) >= 8, modules
    for path in modules:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
        assert runs, f"{path.name}: no run(quick) for benchmarks/run.py"
        assert [a.arg for a in runs[0].args.args] == ["quick"], path.name
