"""NUMA binding of ranks to their GPU's NUMA node (opt-in: NVRX_GPUS_PER_NUMA).

On a machine with several NUMA nodes, a rank whose threads run, and whose memory
lives, on another socket than its GPU pays for every host-device copy. NVRx binds each
rank when ``NVRX_GPUS_PER_NUMA`` says how many GPUs share a NUMA node: local rank r
uses node ``r // NVRX_GPUS_PER_NUMA``, through ``numactl --cpunodebind=N --membind=N``
(``--ft-numa-bind-strict``, the default) or ``--cpunodebind=N --localalloc``. So do
we; without numactl the rank's CPUs are still bound (``sched_setaffinity``), its
memory is not, and the journal says so.

:func:`numa_plan` is the mapping, a pure function of the rank count, the variable,
the machine's nodes (read by :func:`read_numa_nodes` from ``/sys/devices/system/node``,
or from ``$_NVRX_NUMA_NODE_ROOT``: for tests only, a fake tree) and the CPUs this
launcher may use (``os.sched_getaffinity``: a container's cpuset can lack a node's
CPUs; such a rank runs unbound and the plan's reason says so). The plan reaches each
rank through ``_numa_exec.py``, run in front of the rank's command with the plan and
torch's ``${local_rank}``. A binding the machine refuses never crashes a rank every
cycle: numactl is tried once at start-up (:func:`numactl_refusal`; refused: exit 2),
and a refused ``sched_setaffinity`` runs the rank unbound unless strict.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping

from ._numa_exec import numactl_args

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

GPUS_PER_NUMA_ENV = "NVRX_GPUS_PER_NUMA"
NODE_ROOT = "/sys/devices/system/node"
#: For tests only: a fake node tree read instead of NODE_ROOT.
NODE_ROOT_ENV = "_NVRX_NUMA_NODE_ROOT"
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
    allowed: frozenset[int] | None = None,
) -> NumaPlan:
    """Local rank r -> node ``r // gpus_per_numa`` when the machine has it.

    One NUMA node (or none known) means there is nothing to bind: every rank is
    unbound and ``reason`` says why. ``allowed`` (the CPUs this process may run on)
    trims each node's CPUs; a node left with none binds no rank.
    """
    unbound: dict[int, int | None] = dict.fromkeys(range(local_world_size))
    if len(nodes) <= 1:
        return NumaPlan(
            unbound, nodes, "none", strict, f"this machine has {len(nodes)} NUMA node(s) with CPUs"
        )
    usable = nodes if allowed is None else {n: c & allowed for n, c in nodes.items()}
    plan: dict[int, int | None] = {}
    for rank in range(local_world_size):
        node = rank // gpus_per_numa
        plan[rank] = node if usable.get(node) else None
    method = "numactl" if numactl else "sched_setaffinity"
    reasons = []
    missing = sorted(r for r in plan if r // gpus_per_numa not in nodes)
    if missing:
        reasons.append(
            f"local ranks {missing} map to NUMA nodes this machine lacks ({sorted(nodes)})"
        )
    barred = sorted(r for r, n in plan.items() if n is None and r // gpus_per_numa in nodes)
    if barred:
        lacking = sorted({r // gpus_per_numa for r in barred})
        reasons.append(
            f"local ranks {barred} stay unbound: this process may not run on any CPU of "
            f"NUMA node(s) {lacking} (allowed CPUs: {sorted(allowed or ())})"
        )
    usable_cpus = {n: c for n, c in usable.items() if c}
    return NumaPlan(plan, usable_cpus, method, strict, "; ".join(reasons) or None)


def node_root(env: Mapping[str, str] = os.environ) -> str:
    """Where the NUMA nodes are read: NODE_ROOT, or the tests' fake tree."""
    return env.get(NODE_ROOT_ENV) or NODE_ROOT


def machine_plan(
    local_world_size: int | None, gpus_per_numa: int, strict: bool, *, log: bool = True
) -> NumaPlan:
    """The plan for this machine and this process's CPUs (numactl used when on PATH).

    ``local_world_size`` None: enough ranks to use every node (the start-up check
    before torch has resolved ``--nproc-per-node``).
    """
    nodes = read_numa_nodes(node_root())
    if local_world_size is None:
        local_world_size = (max(nodes, default=0) + 1) * gpus_per_numa
    plan = numa_plan(
        local_world_size,
        gpus_per_numa,
        nodes,
        strict=strict,
        numactl=shutil.which("numactl") is not None,
        allowed=frozenset(os.sched_getaffinity(0)),
    )
    if log and plan.binds and plan.reason:
        logger.warning("NUMA binding: %s", plan.reason)
    return plan


def numactl_refusal(plan: NumaPlan, timeout: float = 30.0) -> str | None:
    """Why numactl refuses one of the plan's bindings (``numactl <args> true``), or None.

    Run once at start-up: a container without set_mempolicy, or a cpuset lacking a
    node, would otherwise fail every rank of every cycle.
    """
    if plan.method != "numactl":
        return None
    for node in sorted({n for n in plan.nodes.values() if n is not None}):
        argv = [*numactl_args(node, plan.strict), "true"]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(argv)}: {exc}"
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            return f"{' '.join(argv)} exits {done.returncode}: {said[-1] if said else ''}"
    return None


def wrap_command(plan: NumaPlan, command: list[str]) -> list[str]:
    """``command`` run through ``_numa_exec.py`` with the plan (unchanged if nothing binds)."""
    if not plan.binds:
        return command
    return [sys.executable, "-I", "-S", NUMA_EXEC, plan.encode(), "${local_rank}", *command]
