"""A rank that leaves a detached process behind on purpose.

It starts ``sleep`` in a new session (so it is not in the rank's process group and is
re-parented when the rank exits), records its pid in ``<out>/leaked.pid`` and exits 0.
With ``--double-fork`` it daemonises the classic way instead: a child calls setsid(),
forks the sleeper and exits at once, so the sleeper is an orphan before the rank ends.
With ``--fail-first-cycle`` the first cycle's rank leaks the sleeper and exits 1; the
next cycle's rank writes to ``<out>/next_cycle.txt`` whether the sleeper still runs
("alive" or "gone") and exits 0.
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
    parser.add_argument("--fail-first-cycle", action="store_true")
    args = parser.parse_args()
    if args.fail_first_cycle and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        leaked = int((args.out / "leaked.pid").read_text())
        (args.out / "next_cycle.txt").write_text("alive" if _runs(leaked) else "gone")
        return 0
    if args.double_fork:
        _double_fork(args.out)
        return 0
    child = subprocess.Popen(["sleep", "120"], start_new_session=True)
    (args.out / "leaked.pid").write_text(f"{child.pid}\n")
    return 1 if args.fail_first_cycle else 0


def _runs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
