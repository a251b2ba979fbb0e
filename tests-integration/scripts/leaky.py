"""A rank that leaves a detached process behind on purpose (for the harness self-test).

It starts ``sleep`` in a new session (so it is not in the rank's process group and is
re-parented when the rank exits), records its pid in ``<out>/leaked.pid`` and exits 0.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    child = subprocess.Popen(["sleep", "120"], start_new_session=True)
    (args.out / "leaked.pid").write_text(f"{child.pid}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
