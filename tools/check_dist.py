"""Fail unless every built wheel and sdist is fit to upload as it is.

``nox -s build`` and the release workflow run this on ``dist/``. For each artifact it
checks the core metadata PyPI and pip users read (SPDX license expression, the license
file itself, no project URLs until nvrx has a public home, no deprecated
``License ::`` classifier, a classifier for every CPython we claim, a long description
without repository-relative links) and what
the archive holds (every file of the package's ``src/``: modules, ``py.typed``, JSON
schemas; no tests in wheels, no ``nvrx/__init__.py``, and
nvrx-straggler's compiled hot path in its binary wheels, never its C source).

Usage: ``python tools/check_dist.py DIST_DIR [--expect-hotpath]``.
"""

from __future__ import annotations

import argparse
import email.message
import email.parser
import pathlib
import re
import sys
import tarfile
import zipfile
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
_CPYTHON = "Programming Language :: Python :: 3."
DISTRIBUTIONS = ("nvrx-ft-core", "nvrx-ft-launcher", "nvrx-straggler", "nvrx-ptl")
# Files of a package's src/ that its wheels do not carry as they are (built, or not shipped);
# its sdist carries the C source too.
_NOT_IN_WHEEL = (".c", ".so", ".pyd", ".pyc")
_NOT_IN_SDIST = (".so", ".pyd", ".pyc")
# A Markdown link or image whose target is neither absolute nor an in-page anchor.
_RELATIVE_LINK = re.compile(r"!?\[[^\]]*\]\((?!https?://|#|mailto:)([^)\s]+)\)")


@dataclass(frozen=True)
class Artifact:
    """One wheel or sdist: its file names, its metadata and its license file."""

    path: pathlib.Path
    names: list[str]
    metadata: email.message.Message
    license_text: bytes | None

    @property
    def is_wheel(self) -> bool:
        return self.path.suffix == ".whl"


def read_wheel(path: pathlib.Path) -> Artifact:
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        info = next(n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        dist_info = info.rsplit("/", 1)[0]
        meta = email.parser.BytesParser().parsebytes(zf.read(info))
        lic = f"{dist_info}/licenses/LICENSE"
        text = zf.read(lic) if lic in names else None
    return Artifact(path, names, meta, text)


def read_sdist(path: pathlib.Path) -> Artifact:
    with tarfile.open(path) as tf:
        names = tf.getnames()
        top = names[0].split("/", 1)[0]

        def member(name: str) -> bytes | None:
            try:
                f = tf.extractfile(f"{top}/{name}")
            except KeyError:
                return None
            return f.read() if f is not None else None

        raw = member("PKG-INFO")
        if raw is None:
            raise ValueError(f"{path.name}: no PKG-INFO")
        meta = email.parser.BytesParser().parsebytes(raw)
        text = member("LICENSE")
    return Artifact(path, names, meta, text)


def claimed_pythons(meta: email.message.Message) -> set[int]:
    """The minor versions of CPython 3 an artifact's classifiers claim."""
    classifiers = meta.get_all("Classifier") or []
    return {int(c[len(_CPYTHON) :]) for c in classifiers if c.startswith(_CPYTHON)}


def metadata_problems(art: Artifact, license_text: bytes) -> list[str]:
    """What is wrong with one artifact's core metadata (empty when nothing is)."""
    meta = art.metadata
    out: list[str] = []
    if meta.get("License-Expression") != "Apache-2.0":
        out.append(f"License-Expression is {meta.get('License-Expression')!r}, not Apache-2.0")
    if "LICENSE" not in (meta.get_all("License-File") or []):
        out.append("no License-File: LICENSE")
    if art.license_text is None:
        out.append("the LICENSE file is missing from the archive")
    elif art.license_text != license_text:
        out.append("its LICENSE differs from the repository's")
    classifiers = meta.get_all("Classifier") or []
    out += [f"deprecated classifier {c!r}" for c in classifiers if c.startswith("License ::")]
    # The CPythons claimed: every one from Requires-Python's minimum up to the newest
    # (and check() makes every distribution claim the same ones).
    minors = sorted(claimed_pythons(meta))
    floor = re.fullmatch(r">=\s*3\.(\d+)", str(meta.get("Requires-Python", "")).strip())
    if floor is None:
        out.append(f"Requires-Python {meta.get('Requires-Python')!r} is not '>=3.N'")
    elif minors:
        out += [
            f"no classifier for CPython 3.{m}"
            for m in range(int(floor.group(1)), minors[-1] + 1)
            if m not in minors
        ]
    else:
        out.append("no classifier names a CPython version")
    # nvrx has no public home yet (README: "Status"); a Project-URL would send PyPI's
    # readers to pages that do not exist. Add them back with the home.
    out += [
        f"Project-URL {u.split(', ', 1)[0]!r}: nvrx has no public home yet"
        for u in meta.get_all("Project-URL") or []
    ]
    if meta.get("Description-Content-Type") != "text/markdown":
        out.append("the long description is not text/markdown")
    body = meta.get_payload()
    description = body if isinstance(body, str) else ""
    out += [
        f"repository-relative link {m!r} in the long description (it breaks on PyPI)"
        for m in _RELATIVE_LINK.findall(description)
    ]
    return out


def source_files(name: str, skip: tuple[str, ...] = _NOT_IN_WHEEL) -> list[str]:
    """Every file of ``packages/<name>/src`` a wheel must carry (its modules, stubs,
    ``py.typed``, JSON schemas...), relative to ``src``; empty for an unknown package."""
    src = ROOT / "packages" / name / "src"
    return sorted(
        str(p.relative_to(src))
        for p in src.rglob("*")
        if p.is_file()
        and p.suffix not in skip
        and "__pycache__" not in p.parts
        and not any(part.endswith(".egg-info") for part in p.parts)
    )


def content_problems(art: Artifact, expect_hotpath: bool) -> list[str]:
    """What is wrong with what one artifact holds."""
    names = art.names
    out: list[str] = []
    if not art.is_wheel:
        if not any(n.endswith("/pyproject.toml") and n.count("/") == 1 for n in names):
            out.append("the sdist has no pyproject.toml")
        inside = {n.split("/", 1)[1] for n in names if "/" in n}
        out += [
            f"lacks src/{f}"
            for f in source_files(str(art.metadata.get("Name")), _NOT_IN_SDIST)
            if f"src/{f}" not in inside
        ]
        return out
    if "nvrx/__init__.py" in names:
        out.append("ships nvrx/__init__.py: nvrx is a namespace package")
    if not any(n.endswith("/py.typed") for n in names):
        out.append("no py.typed")
    out += [f"ships test file {n}" for n in names if "/tests/" in n or n.startswith("tests/")]
    held = set(names)
    name = str(art.metadata.get("Name"))
    out += [f"lacks {f} of its src/" for f in source_files(name) if f not in held]
    if art.metadata.get("Name") == "nvrx-straggler":
        out += [f"ships C source {n}" for n in names if n.endswith(".c")]
        built = [n for n in names if n.startswith("nvrx/straggler/_hotpath.")]
        has_ext = any(n.endswith((".so", ".pyd")) for n in built)
        if "none-any" in art.path.name and has_ext:
            out.append("a pure-Python wheel holds a compiled extension")
        if expect_hotpath and "none-any" not in art.path.name and not has_ext:
            out.append("binary wheel without the compiled hot path")
    return out


def check(dist: pathlib.Path, expect_hotpath: bool) -> list[str]:
    """Every problem of every artifact in ``dist``, each prefixed by its file name."""
    license_text = (ROOT / "LICENSE").read_bytes()
    problems: list[str] = []
    found: dict[str, set[str]] = {}
    claims: dict[str, set[int]] = {}
    for path in sorted(dist.iterdir()):
        if path.suffix == ".whl":
            art = read_wheel(path)
        elif path.name.endswith(".tar.gz"):
            art = read_sdist(path)
        else:
            continue
        found.setdefault(str(art.metadata.get("Name")), set()).add(
            "wheel" if art.is_wheel else "sdist"
        )
        claims[path.name] = claimed_pythons(art.metadata)
        for p in metadata_problems(art, license_text) + content_problems(art, expect_hotpath):
            problems.append(f"{path.name}: {p}")
    if len({frozenset(c) for c in claims.values()}) > 1:
        problems.append(f"the artifacts claim different CPythons: {claims}")
    for name in DISTRIBUTIONS:
        missing = {"wheel", "sdist"} - found.get(name, set())
        problems += [f"{name}: no {kind} in {dist}" for kind in sorted(missing)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dist", type=pathlib.Path)
    parser.add_argument(
        "--expect-hotpath",
        action="store_true",
        help="every binary nvrx-straggler wheel must hold the compiled extension",
    )
    args = parser.parse_args(argv)
    problems = check(args.dist, args.expect_hotpath)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"{args.dist}: every wheel and sdist has sound metadata and contents")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
