"""Fail unless ``.ci/run`` runs exactly the test command the README gives."""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def ci_command() -> str:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    return commands[-1].strip()


def main() -> int:
    command = ci_command()
    readme_lines = {ln.strip() for ln in (ROOT / "README.md").read_text().splitlines()}
    if command not in readme_lines:
        print(f".ci/run runs {command!r}, which is not a line of README.md", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
