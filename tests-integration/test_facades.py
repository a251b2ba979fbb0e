"""The lazy façades (``nvrx.ft``, ``nvrx.straggler``, ``nvrx.ptl``) keep one list of names.

Each façade's ``_PUBLIC`` table (each public name under the module that defines it) is
the one list: ``__all__`` and the lazy imports are built from it. Its ``TYPE_CHECKING``
imports (``from m import X as X``, so type checkers and IDEs see the names re-exported)
must say the same; every name must be in its module's own ``__all__`` and be that very
object; and importing the façade imports none of the table's modules (nor torch).
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys
from types import ModuleType

import pytest

FACADES = ["nvrx.ft", "nvrx.straggler", "nvrx.ptl"]


def _table(facade: ModuleType) -> dict[str, str]:
    public: dict[str, tuple[str, ...]] = facade._PUBLIC
    table = {name: module for module, names in public.items() for name in names}
    assert len(table) == sum(len(names) for names in public.values()), "a name listed twice"
    return table


def _type_checking_imports(facade: ModuleType) -> dict[str, str]:
    """Public name -> module (relative to the façade) of its ``if TYPE_CHECKING:`` imports."""
    assert facade.__file__ is not None
    tree = ast.parse(pathlib.Path(facade.__file__).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module:
                    module = stmt.module if stmt.level == 0 else f"{facade.__name__}.{stmt.module}"
                    for alias in stmt.names:
                        assert alias.asname == alias.name, f"{alias.name}: not re-exported"
                        found[alias.name] = module.removeprefix(f"{facade.__name__}.")
    return found


@pytest.mark.parametrize("name", FACADES)
def test_all_and_the_type_checking_imports_are_the_table(name: str) -> None:
    facade = importlib.import_module(name)
    table = _table(facade)
    assert set(facade.__all__) == {*table, "__version__"}
    assert _type_checking_imports(facade) == table


@pytest.mark.parametrize("name", FACADES)
def test_every_name_is_its_modules_own(name: str) -> None:
    if name == "nvrx.ptl":
        pytest.importorskip("lightning")
    facade = importlib.import_module(name)
    for public, module_name in _table(facade).items():
        module = importlib.import_module(f"{name}.{module_name}")
        assert public in getattr(module, "__all__", ()), (public, module_name)
        assert getattr(facade, public) is getattr(module, public)


@pytest.mark.parametrize("name", FACADES)
def test_importing_a_facade_imports_none_of_its_modules(name: str) -> None:
    code = (
        f"import importlib, sys; f = importlib.import_module({name!r})\n"
        "mods = {f'{f.__name__}.{m}' for m in f._PUBLIC}\n"
        "print(sorted(m for m in sys.modules if m in mods or m == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
