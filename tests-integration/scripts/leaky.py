"""A rank that leaves a detached process behind on purpose.

It starts ``sleep`` in a new session (so it is not in the rank's process group and is
re-parented when the rank exits), records its pid in ``<out>/leaked.pid`` and exits 0.
With ``--double-fork`` it daemonises the classic way instead: a child calls setsid(),
forks the sleeper and exits at once, so the sleeper is an orphan before the rank ends.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys


def _double_fork(out: pathlib.Path) -> None:
    child = os.fork()
    if child == 0:
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execvp("sleep", ["sleep", "120"])
        (out / "leaked.pid").write_text(f"{grandchild}\n")
        os._exit(0)
    os.waitpid(child, 0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--double-fork", action="store_true")
    args = parser.parse_args()
    if args.double_fork:
        _double_fork(args.out)
        return 0
    child = subprocess.Popen(["sleep", "120"], start_new_session=True)
    (args.out / "leaked.pid").write_text(f"{child.pid}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
