"""The lazy façade of ``nvrx.ft``: its three lists agree, and each name is its module's.

``__all__`` (the public names), ``_WHERE`` (each name's module, for the lazy import)
and the ``TYPE_CHECKING`` imports (for static tools) are written by hand; this test is
what keeps them one list: the same names in all three, every name exported by its
module's own ``__all__``, and every one importable.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import nvrx.ft as ft


def _type_checking_imports() -> dict[str, str]:
    """Public name -> module of the façade's ``if TYPE_CHECKING:`` imports."""
    tree = ast.parse(pathlib.Path(ft.__file__).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module:
                    for alias in stmt.names:
                        found[alias.asname or alias.name] = stmt.module.removeprefix("nvrx.ft.")
    return found


def test_all_where_and_the_type_checking_imports_name_the_same_things() -> None:
    public = set(ft.__all__) - {"__version__"}
    assert set(ft._WHERE) == public
    assert _type_checking_imports() == ft._WHERE


def test_every_name_is_exported_by_its_module_and_importable() -> None:
    for name, module_name in ft._WHERE.items():
        module = importlib.import_module(f"nvrx.ft.{module_name}")
        attr = ft._RENAMED.get(name, name)
        assert attr in getattr(module, "__all__", ()), (name, module_name)
        assert getattr(ft, name) is getattr(module, attr)
