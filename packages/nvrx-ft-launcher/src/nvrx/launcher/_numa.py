"""NUMA binding of ranks to their GPU's NUMA node (opt-in: NVRX_GPUS_PER_NUMA).

On a machine with several NUMA nodes, a rank whose threads run, and whose memory
lives, on another socket than its GPU pays for every host-device copy. NVRx binds each
rank when ``NVRX_GPUS_PER_NUMA`` says how many GPUs share a NUMA node: local rank r
uses node ``r // NVRX_GPUS_PER_NUMA``, through ``numactl --cpunodebind=N --membind=N``
(``--ft-numa-bind-strict``, the default) or ``--cpunodebind=N --localalloc``. So do
we; without numactl the rank's CPUs are still bound (``sched_setaffinity``), its
memory is not, and the journal says so.

:func:`numa_plan` is the mapping, a pure function of the rank count, the variable and
the machine's nodes (read by :func:`read_numa_nodes` from ``/sys/devices/system/node``,
a fake tree in the tests). The plan reaches each rank through ``_numa_exec.py``, run
in front of the rank's command with the plan and torch's ``${local_rank}``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import sys

__all__: list[str] = []

GPUS_PER_NUMA_ENV = "NVRX_GPUS_PER_NUMA"
NODE_ROOT = "/sys/devices/system/node"
NUMA_EXEC = str(pathlib.Path(__file__).with_name("_numa_exec.py"))


def parse_cpulist(text: str) -> frozenset[int]:
    """``0-3,8,10-11`` (the kernel's cpulist format) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus)


def read_numa_nodes(root: str | os.PathLike[str] = NODE_ROOT) -> dict[int, frozenset[int]]:
    """NUMA node number -> its CPUs, for the nodes that have CPUs."""
    nodes: dict[int, frozenset[int]] = {}
    try:
        entries = os.listdir(root)
    except OSError:
        return nodes
    for name in entries:
        match = re.fullmatch(r"node(\d+)", name)
        if match is None:
            continue
        try:
            cpus = parse_cpulist(pathlib.Path(root, name, "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cpus:
            nodes[int(match[1])] = cpus
    return nodes


@dataclasses.dataclass(frozen=True)
class NumaPlan:
    """Each local rank's NUMA node (None: unbound), how, and why nothing is bound."""

    nodes: dict[int, int | None]
    cpus: dict[int, frozenset[int]]
    method: str
    strict: bool
    reason: str | None = None

    @property
    def binds(self) -> bool:
        return any(node is not None for node in self.nodes.values())

    def encode(self) -> str:
        """The plan as one argv word for ``_numa_exec.py``: ``method;strict;r=node:cpus;...``."""
        parts = [self.method, "1" if self.strict else "0"]
        for rank, node in sorted(self.nodes.items()):
            if node is None:
                continue
            cpus = ",".join(map(str, sorted(self.cpus[node])))
            parts.append(f"{rank}={node}:{cpus}")
        return ";".join(parts)


def parse_gpus_per_numa(text: str) -> int:
    """The variable's value: a positive integer, else ValueError naming it."""
    value = text.strip()
    if not value.isdigit() or not 1 <= int(value) <= 1024:
        raise ValueError(f"{GPUS_PER_NUMA_ENV}={text!r}: expected an integer from 1 to 1024")
    return int(value)


def numa_plan(
    local_world_size: int,
    gpus_per_numa: int,
    nodes: dict[int, frozenset[int]],
    *,
    strict: bool = True,
    numactl: bool = False,
) -> NumaPlan:
    """Local rank r -> node ``r // gpus_per_numa`` when the machine has it.

    One NUMA node (or none known) means there is nothing to bind: every rank is
    unbound and ``reason`` says why.
    """
    unbound: dict[int, int | None] = dict.fromkeys(range(local_world_size))
    if len(nodes) <= 1:
        return NumaPlan(
            unbound, nodes, "none", strict, f"this machine has {len(nodes)} NUMA node(s) with CPUs"
        )
    plan: dict[int, int | None] = {}
    for rank in range(local_world_size):
        node = rank // gpus_per_numa
        plan[rank] = node if node in nodes else None
    method = "numactl" if numactl else "sched_setaffinity"
    missing = sorted(r for r, n in plan.items() if n is None)
    reason = None
    if missing:
        reason = f"local ranks {missing} map to NUMA nodes this machine lacks ({sorted(nodes)})"
    return NumaPlan(plan, nodes, method, strict, reason)


def machine_plan(local_world_size: int, gpus_per_numa: int, strict: bool) -> NumaPlan:
    """The plan for this machine (numactl used when on PATH)."""
    return numa_plan(
        local_world_size,
        gpus_per_numa,
        read_numa_nodes(),
        strict=strict,
        numactl=shutil.which("numactl") is not None,
    )


def wrap_command(plan: NumaPlan, command: list[str]) -> list[str]:
    """``command`` run through ``_numa_exec.py`` with the plan (unchanged if nothing binds)."""
    if not plan.binds:
        return command
    return [sys.executable, "-I", "-S", NUMA_EXEC, plan.encode(), "${local_rank}", *command]
