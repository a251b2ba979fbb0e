"""Keep every distribution on the version in ``VERSION``.

``VERSION`` is the single source of truth. ``python tools/version.py --check``
fails when a package's ``version`` or a sibling pin disagrees with it;
``python tools/version.py --set 0.2.0`` moves all four packages in lockstep.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
VERSION_FILE = ROOT / "VERSION"
PYPROJECTS = sorted((ROOT / "packages").glob("*/pyproject.toml"))
_VERSION_LINE = re.compile(r'^version = "([^"]+)"$', re.MULTILINE)
_SIBLING_PIN = re.compile(r'"(nvrx-[a-z-]+)==([^"]+)"')


def _rewrite(text: str, version: str) -> str:
    text = _VERSION_LINE.sub(f'version = "{version}"', text, count=1)
    return _SIBLING_PIN.sub(lambda m: f'"{m.group(1)}=={version}"', text)


def check(version: str) -> list[str]:
    """Return one message per place that disagrees with ``version``."""
    problems = []
    for path in PYPROJECTS:
        text = path.read_text()
        found = _VERSION_LINE.search(text)
        if found is None or found.group(1) != version:
            problems.append(f"{path.relative_to(ROOT)}: version is not {version}")
        for name, pin in _SIBLING_PIN.findall(text):
            if pin != version:
                problems.append(f"{path.relative_to(ROOT)}: pin {name}=={pin} is not {version}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="fail if any package disagrees")
    group.add_argument("--set", metavar="VERSION", help="move every package to VERSION")
    args = parser.parse_args(argv)
    if args.set:
        VERSION_FILE.write_text(args.set + "\n")
        for path in PYPROJECTS:
            path.write_text(_rewrite(path.read_text(), args.set))
        return 0
    version = VERSION_FILE.read_text().strip()
    problems = check(version)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
