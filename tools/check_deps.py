"""Fail unless each package declares exactly the distributions its ``src`` imports.

Run by ``nox -s lint``. For every ``packages/<name>`` it reads the imports of
``src/`` (with :mod:`ast`, nothing is imported) and the package's
``[project] dependencies`` and ``optional-dependencies``, and reports:

- an import of a third-party module or sibling package that no dependency provides;
- an unguarded import of a module only an extra provides (it must sit in a
  ``try``/``except ImportError`` so the package works without the extra);
- a declared dependency, runtime or extra, that nothing in ``src`` imports.

Imports under ``if TYPE_CHECKING:`` are not runtime imports, but they do count as a
use of a declared dependency, and so does a string literal naming the module in a
file that imports by name (``importlib.import_module``). A dependency declared for
another reason (another library's optional import, a console script) is listed in
``DECLARED_NOT_IMPORTED`` with why.
Test-only tools live in each package's ``test`` dependency group and are not checked.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

if sys.version_info >= (3, 11):
    import tomllib
else:  # the lint session installs it there
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: Distribution name (normalized) -> the top-level modules it provides, where they
#: differ from the name itself. Siblings are the subpackages of the ``nvrx`` namespace.
IMPORT_NAMES: dict[str, tuple[str, ...]] = {
    "nvrx-ft-core": ("nvrx.ft",),
    "nvrx-ft-launcher": ("nvrx.launcher",),
    "nvrx-straggler": ("nvrx.straggler",),
    "nvrx-ptl": ("nvrx.ptl",),
    "pyyaml": ("yaml",),
    "nvidia-ml-py": ("pynvml",),
    "cupti-python": ("cupti",),
    "python-etcd": ("etcd",),
    "pytorch-lightning": ("pytorch_lightning",),
}
#: (package, dependency) pairs declared although our code never imports them.
DECLARED_NOT_IMPORTED: dict[tuple[str, str], str] = {
    ("nvrx-ft-launcher", "python-etcd"): "torch's etcd and etcd-v2 rendezvous backends import it",
    ("nvrx-ptl", "nvrx-ft-launcher"): "its ft_launcher runs the monitors the FT callbacks talk to",
}
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_BY_NAME = {"import_module", "find_spec", "__import__"}


def normalize(name: str) -> str:
    """PEP 503 normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution a PEP 508 requirement string names."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return normalize(match.group(1))


def provides(dist: str) -> tuple[str, ...]:
    """The module names a distribution provides (its name with underscores by default)."""
    return IMPORT_NAMES.get(dist, (dist.replace("-", "_"),))


@dataclass(frozen=True)
class Import:
    """One import statement: the module, where it is, and how it is protected."""

    module: str
    where: str
    guarded: bool  # inside try/except ImportError
    typing_only: bool  # inside ``if TYPE_CHECKING:``


@dataclass
class SourceScan:
    """Every import of a package's src, and the module-like strings of files that
    import by name."""

    imports: list[Import] = field(default_factory=list)
    named: set[str] = field(default_factory=set)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type
    names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds] if kinds else []
    if kinds is None:
        return True
    return any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names)


def _walk(
    node: ast.AST, where: str, guarded: bool, typing_only: bool
) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every node below ``node`` with whether it is guarded and typing-only."""
    for child in ast.iter_child_nodes(node):
        child_guarded, child_typing = guarded, typing_only
        if isinstance(node, ast.Try) and child in node.body:
            child_guarded = guarded or any(_catches_import_error(h) for h in node.handlers)
        if isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body:
            child_typing = True
        yield child, child_guarded, child_typing
        yield from _walk(child, where, child_guarded, child_typing)


def scan_file(path: pathlib.Path, label: str, scan: SourceScan) -> None:
    """Add the imports (and, if it imports by name, the string literals) of one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    by_name = False
    strings: set[str] = set()
    for node, guarded, typing_only in _walk(tree, label, False, False):
        where = f"{label}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                scan.imports.append(Import(alias.name, where, guarded, typing_only))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module]
            if node.module == "nvrx":  # ``from nvrx import ft`` imports nvrx.ft
                mods = [f"nvrx.{alias.name}" for alias in node.names]
            scan.imports += [Import(m, where, guarded, typing_only) for m in mods]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            by_name = by_name or name in _BY_NAME
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
    if by_name:
        scan.named |= strings


def scan_package(src: pathlib.Path) -> SourceScan:
    scan = SourceScan()
    for path in sorted(src.rglob("*.py")):
        scan_file(path, str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path), scan)
    return scan


def _matches(module: str, provided: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in provided)


def problems(package_dir: pathlib.Path) -> list[str]:
    """Every mismatch between one package's declared dependencies and its imports."""
    project = tomllib.loads((package_dir / "pyproject.toml").read_text())["project"]
    name = normalize(project["name"])
    runtime = {requirement_name(r) for r in project.get("dependencies", [])}
    extras = {
        requirement_name(r)
        for reqs in project.get("optional-dependencies", {}).values()
        for r in reqs
    }
    src = package_dir / "src"
    # The package's own modules: the folders it ships (under the nvrx namespace or not).
    own = [f"nvrx.{d.name}" for d in (src / "nvrx").glob("*/")] + [
        d.name for d in src.glob("*/") if d.name != "nvrx" and not d.name.endswith("-info")
    ]
    stdlib = set(sys.stdlib_module_names)
    scan = scan_package(src)
    out: list[str] = [
        f"{name}: DECLARED_NOT_IMPORTED lists {dist!r}, which it does not declare"
        for pkg, dist in DECLARED_NOT_IMPORTED
        if pkg == name and dist not in runtime | extras
    ]
    for imp in scan.imports:
        top = imp.module.split(".")[0]
        if imp.typing_only or top in stdlib or _matches(imp.module, own):
            continue
        if top == "nvrx" and imp.module.count(".") == 0:
            continue  # the namespace itself
        if any(_matches(imp.module, provides(d)) for d in runtime):
            continue
        if any(_matches(imp.module, provides(d)) for d in extras):
            if not imp.guarded:
                out.append(
                    f"{imp.where}: `{imp.module}` comes only from an extra, so its import "
                    "must be guarded by try/except ImportError"
                )
            continue
        out.append(f"{imp.where}: imports `{imp.module}`, which no dependency of {name} provides")
    used = {imp.module for imp in scan.imports} | scan.named
    for dist in sorted(runtime | extras):
        imported = any(_matches(u, provides(dist)) for u in used)
        if (name, dist) in DECLARED_NOT_IMPORTED:
            if imported:
                out.append(f"{name}: {dist!r} is imported now: drop it from DECLARED_NOT_IMPORTED")
        elif not imported:
            kind = "dependency" if dist in runtime else "extra dependency"
            out.append(f"{name}: declares {kind} {dist!r}, which nothing in src imports")
    return out


def main(argv: list[str] | None = None) -> int:
    dirs = [pathlib.Path(a) for a in (argv if argv is not None else sys.argv[1:])]
    found = [p for d in dirs or sorted((ROOT / "packages").iterdir()) for p in problems(d)]
    for line in found:
        print(line, file=sys.stderr)
    if not found:
        print("every package declares exactly what its src imports")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
