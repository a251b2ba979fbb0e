"""The clock rule: timeouts, deadlines and waits use time.monotonic; the wall clock only
labels records.

Every wall-clock read in the four packages' sources (``time.time()``,
``time.time_ns()``, ``datetime.now()``, ``CLOCK_REALTIME``...) must say on its line that
it is a label (``# wall clock: label``), so a deadline measured with the wall clock (one
that a clock step stretches by the size of the step) cannot come back unnoticed.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = "# wall clock: label"
#: Label reads left unmarked (relative path, the line's code); none today.
UNMARKED_LABELS: frozenset[tuple[str, str]] = frozenset()
_WALL_FUNCS = {
    ("time", "time"),
    ("time", "time_ns"),
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
}
_WALL_NAMES = {"CLOCK_REALTIME", "CLOCK_REALTIME_COARSE"}


def wall_clock_reads(source: str) -> list[int]:
    """Line numbers of the wall-clock reads in ``source`` (Python code)."""
    tree = ast.parse(source)
    imported_wall: set[str] = set()  # `from time import time as now` style names
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("time", "datetime"):
            for alias in node.names:
                if (node.module, alias.name) in _WALL_FUNCS or alias.name in _WALL_NAMES:
                    imported_wall.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                owner = func.value
                owner_name = (
                    owner.id
                    if isinstance(owner, ast.Name)
                    else owner.attr
                    if isinstance(owner, ast.Attribute)
                    else None
                )
                if (owner_name, func.attr) in _WALL_FUNCS:
                    lines.append(node.lineno)
            elif isinstance(func, ast.Name) and func.id in imported_wall:
                lines.append(node.lineno)
        elif (isinstance(node, ast.Attribute) and node.attr in _WALL_NAMES) or (
            isinstance(node, ast.Name) and node.id in imported_wall & _WALL_NAMES
        ):
            lines.append(node.lineno)
    return sorted(set(lines))


def unmarked_reads(path: pathlib.Path) -> list[str]:
    """'path:line: code' for each wall-clock read of ``path`` not marked as a label."""
    text = path.read_text(encoding="utf-8")
    source_lines = text.splitlines()
    rel = str(path.relative_to(ROOT))
    bad = []
    for lineno in wall_clock_reads(text):
        line = source_lines[lineno - 1]
        code = line.split("#", 1)[0].strip()
        if MARKER in line or (rel, code) in UNMARKED_LABELS:
            continue
        bad.append(f"{rel}:{lineno}: {line.strip()}")
    return bad


def test_every_wall_clock_read_in_the_packages_is_a_label() -> None:
    sources = sorted((ROOT / "packages").glob("*/src/**/*.py"))
    assert len(sources) > 50
    bad = [entry for path in sources for entry in unmarked_reads(path)]
    assert not bad, (
        "wall-clock reads not marked as labels (timeouts, deadlines and waits must use "
        f"time.monotonic(); a record's label says {MARKER!r} on its line):\n" + "\n".join(bad)
    )


@pytest.mark.parametrize(
    "snippet",
    [
        "import time\ndeadline = time.time() + 5\n",
        "import time\nwhile time.time_ns() < end: pass\n",
        "from time import time\nstart = time()\n",
        "from time import time as now\nstart = now()\n",
        "import datetime\nt = datetime.datetime.now()\n",
        "from datetime import datetime\nt = datetime.utcnow()\n",
        "import time\nt = time.clock_gettime(time.CLOCK_REALTIME)\n",
    ],
)
def test_the_rule_finds_wall_clock_reads(snippet: str) -> None:
    assert wall_clock_reads(snippet), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "import time\ndeadline = time.monotonic() + 5\n",
        "import time\nt = time.monotonic_ns(); time.sleep(1); time.perf_counter()\n",
        "import datetime\nw = datetime.timedelta(seconds=5)\n",
    ],
)
def test_the_rule_leaves_monotonic_reads_alone(snippet: str) -> None:
    assert not wall_clock_reads(snippet), snippet
