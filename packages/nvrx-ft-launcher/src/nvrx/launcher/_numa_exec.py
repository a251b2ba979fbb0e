"""Bind this process to its NUMA node, then exec the rank's command (see ``_numa.py``).

Run as ``python -I -S _numa_exec.py PLAN LOCAL_RANK CMD [ARGS...]``, where PLAN is
``method;strict;rank=node:cpu,cpu;...`` (``NumaPlan.encode``). ``numactl``: exec
``numactl --cpunodebind=N --membind=N`` (or ``--localalloc``) with the command;
``sched_setaffinity``: set this process's CPUs (its children inherit them) and exec
the command. A rank the plan leaves out runs unbound. Standard library only.
"""

from __future__ import annotations

import os
import sys

__all__: list[str] = []


def _main(argv: list[str]) -> None:
    plan, local_rank, command = argv[1], argv[2], argv[3:]
    method, strict, *entries = plan.split(";")
    for entry in entries:
        rank, _, rest = entry.partition("=")
        if rank != local_rank:
            continue
        node, _, cpus = rest.partition(":")
        if method == "numactl":
            memory = f"--membind={node}" if strict == "1" else "--localalloc"
            command = ["numactl", f"--cpunodebind={node}", memory, *command]
        else:
            os.sched_setaffinity(0, {int(cpu) for cpu in cpus.split(",")})
        break
    os.execvp(command[0], command)  # noqa: S606 - argv list, no shell


if __name__ == "__main__":
    _main(sys.argv)
