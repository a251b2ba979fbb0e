"""Bind this process to its NUMA node, then exec the rank's command (see ``_numa.py``).

Run as ``python -I -S _numa_exec.py PLAN LOCAL_RANK CMD [ARGS...]``, where PLAN is
``method;strict;rank=node:cpu,cpu;...`` (``NumaPlan.encode``). ``numactl``: exec
``numactl --cpunodebind=N --membind=N`` (or ``--localalloc``) with the command;
``sched_setaffinity``: set this process's CPUs (its children inherit them) and exec
the command. A rank the plan leaves out runs unbound; so does a rank whose
``sched_setaffinity`` the machine refuses when the plan is not strict (one line on
stderr says so; strict: the rank exits 1 with the reason). numactl was tried once
at start-up by the launcher with :func:`numactl_args` (defined here, used there).
Standard library only: this file runs with ``-I -S``, before any import path.
"""

from __future__ import annotations

import os
import sys

__all__: list[str] = []


def numactl_args(node: int | str, strict: bool) -> list[str]:
    """numactl's options for a rank on ``node`` (the one place they are spelled)."""
    memory = f"--membind={node}" if strict else "--localalloc"
    return ["numactl", f"--cpunodebind={node}", memory]


def _main(argv: list[str]) -> None:
    plan, local_rank, command = argv[1], argv[2], argv[3:]
    method, strict, *entries = plan.split(";")
    for entry in entries:
        rank, _, rest = entry.partition("=")
        if rank != local_rank:
            continue
        node, _, cpus = rest.partition(":")
        if method == "numactl":
            command = [*numactl_args(node, strict == "1"), *command]
            break
        try:
            os.sched_setaffinity(0, {int(cpu) for cpu in cpus.split(",")})
        except OSError as exc:
            said = f"NUMA binding of local rank {local_rank} to node {node} refused: {exc}"
            if strict == "1":
                sys.stderr.write(f"{said} (--ft-numa-bind-strict: the rank does not start)\n")
                sys.exit(1)
            sys.stderr.write(f"{said}; running unbound\n")
        break
    os.execvp(command[0], command)  # noqa: S606 - argv list, no shell


if __name__ == "__main__":
    _main(sys.argv)
