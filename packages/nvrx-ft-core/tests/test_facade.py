"""The lazy façade of ``nvrx.ft``: one table of public names, and static tools agree.

``_PUBLIC`` (each public name under the module that defines it) is the one list: the
façade builds ``__all__`` and its lazy imports from it. The ``TYPE_CHECKING`` imports
(``from m import X as X``) say the same for static tools; this test keeps them equal to
the table, checks every name is in its module's own ``__all__`` and importable, and that
importing the façade imports none of those modules.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import nvrx.ft as ft


def _type_checking_imports() -> dict[str, str]:
    """Public name -> module of the façade's ``if TYPE_CHECKING:`` imports (all ``X as X``)."""
    tree = ast.parse(pathlib.Path(ft.__file__).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module:
                    for alias in stmt.names:
                        assert alias.asname == alias.name, alias.name  # a re-export
                        found[alias.name] = stmt.module.removeprefix("nvrx.ft.")
    return found


def test_all_and_the_type_checking_imports_are_the_table() -> None:
    table = {name: module for module, names in ft._PUBLIC.items() for name in names}
    assert len(table) == sum(len(names) for names in ft._PUBLIC.values())  # no name twice
    assert set(ft.__all__) == {*table, "__version__"}
    assert table == ft._WHERE
    assert _type_checking_imports() == table


def test_every_name_is_exported_by_its_module_and_importable() -> None:
    for name, module_name in ft._WHERE.items():
        module = importlib.import_module(f"nvrx.ft.{module_name}")
        assert name in getattr(module, "__all__", ()), (name, module_name)
        assert getattr(ft, name) is getattr(module, name)


def test_importing_the_facade_imports_none_of_its_modules() -> None:
    code = (
        "import sys, nvrx.ft\n"
        "print(sorted(m for m in sys.modules if m.startswith('nvrx.ft.') or m == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
