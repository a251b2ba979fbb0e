"""Fail on a link in the project's Markdown that leads nowhere.

Sphinx's linkcheck needs the network, which CI does not have; this checks what can be
checked offline, which is also what breaks most often:

- a relative link must name a file or folder of this repository;
- an anchor (``#part`` alone or after a Markdown file) must be a heading of that file
  (MyST's slugs, the same as GitHub's) or an explicit ``(label)=`` target;
- a link to the project's planned public home (``nvrx.github.io``, ``github.com/nvrx``)
  must say on its line that it is the planned home: nothing is published there yet.

Run: ``python tools/check_links.py`` (in ``nox -s lint``); exit 1 lists every problem.
"""

from __future__ import annotations

import pathlib
import re
import sys
from collections.abc import Iterable

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The Markdown a user or contributor reads (package READMEs become PyPI pages).
SOURCES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs", "packages", "examples")
_SKIP_PARTS = {"_build", ".nox", ".venv", "node_modules"}
_LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_PLANNED_HOME = re.compile(r"https?://(?:nvrx\.github\.io|github\.com/nvrx)(?:[/\s)>\"'`]|$)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_TARGET = re.compile(r"^\(([^)]+)\)=\s*$")
_FENCE = re.compile(r"^\s*(```|~~~|:::)")


def markdown_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Every Markdown file under :data:`SOURCES`, outside build and venv folders."""
    found: list[pathlib.Path] = []
    for name in SOURCES:
        path = root / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += [
                p
                for p in sorted(path.rglob("*.md"))
                if not _SKIP_PARTS & set(p.relative_to(root).parts)
                and not any(part.startswith(".venv") for part in p.relative_to(root).parts)
            ]
    return found


def slug(heading: str) -> str:
    """The anchor MyST (and GitHub) give a heading: lower case, punctuation dropped."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _prose_lines(text: str) -> Iterable[tuple[int, str]]:
    """Numbered lines outside fenced code blocks (links in code are examples)."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def anchors(path: pathlib.Path) -> set[str]:
    """The anchors a Markdown file defines: heading slugs and ``(label)=`` targets."""
    found: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        if match := _HEADING.match(line):
            found.add(slug(match.group(2)))
        elif match := _TARGET.match(line):
            found.add(match.group(1))
    return found


def problems(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """What is wrong with the links of one file, each as ``file:line: why``."""
    out: list[str] = []
    where = path.relative_to(root)
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        if _PLANNED_HOME.search(line) and "planned" not in line.lower():
            out.append(
                f"{where}:{number}: links to the planned home (nothing is published "
                "there yet): link a file of the repository or say 'planned home'"
            )
        for match in _LINK.finditer(line):
            target = match.group("target")
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                out.append(f"{where}:{number}: {target!r}: no such file in the repository")
                continue
            if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                out.append(f"{where}:{number}: {target!r}: no heading or target {anchor!r}")
    return out


def main() -> int:
    found = [p for path in markdown_files() for p in problems(path)]
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
