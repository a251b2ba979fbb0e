"""Simulated rank faults for testing fault tolerance end to end.

A simulated fault kills (SIGKILL) or freezes (SIGSTOP) one training rank after a
delay, so the rank monitor and the launcher can be seen doing their job. It is a
debugging aid: never configure it for production runs.

The target rank is agreed across ranks by a broadcast from rank 0 on the device of
the process group's backend (CPU for gloo), so it needs no GPU.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "FAULT_TYPES",
    "FaultPlan",
    "SimulatedFault",
    "SimulatedFaultParams",
    "agree_on_rank",
    "parse_simulated_fault_params",
    "plan_simulated_fault",
]

#: Accepted values of :attr:`SimulatedFaultParams.fault_type`.
FAULT_TYPES = ("random", "rank_killed", "rank_hung")
_CONCRETE_FAULTS = ("rank_killed", "rank_hung")


def _check_delay(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"SimulatedFaultParams.{field} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"SimulatedFaultParams.{field} must be finite and >= 0, got {value!r}")
    return float(value)


@dataclass
class SimulatedFaultParams:
    """Description of a simulated rank fault, used for FT testing and debugging.

    ``fault_type`` is ``'rank_killed'`` (SIGKILL), ``'rank_hung'`` (SIGSTOP) or
    ``'random'`` (one of the two, picked at random). The fault happens
    ``base_delay + U(0, 1) * rand_delay`` seconds after the callback's setup, on
    ``rank_to_fail``, or on a random rank (the same on every rank) when it is None.
    """

    fault_type: str
    base_delay: float
    rand_delay: float = 0.0
    rank_to_fail: int | None = None

    def __post_init__(self) -> None:
        if self.fault_type not in FAULT_TYPES:
            raise ValueError(
                f"SimulatedFaultParams.fault_type must be one of {list(FAULT_TYPES)}, "
                f"got {self.fault_type!r}"
            )
        self.base_delay = _check_delay("base_delay", self.base_delay)
        self.rand_delay = _check_delay("rand_delay", self.rand_delay)
        rank = self.rank_to_fail
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(
                f"SimulatedFaultParams.rank_to_fail must be None or an int >= 0, got {rank!r}"
            )


def parse_simulated_fault_params(obj: object) -> SimulatedFaultParams | None:
    """Turn a callback's ``simulated_fault_params`` argument into parameters.

    Accepts None, a :class:`SimulatedFaultParams`, or a mapping such as a dict or an
    OmegaConf ``DictConfig`` (as NeMo configs pass it). Raises ValueError naming the
    bad, missing or unknown field.
    """
    if obj is None or isinstance(obj, SimulatedFaultParams):
        return obj
    if not isinstance(obj, Mapping):
        raise ValueError(
            "simulated_fault_params must be a SimulatedFaultParams, a dict or a DictConfig, "
            f"got {type(obj).__name__}: {obj!r}"
        )
    kwargs: dict[str, Any] = {str(key): value for key, value in obj.items()}
    known = {f.name for f in dataclasses.fields(SimulatedFaultParams)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ValueError(
            f"simulated_fault_params has unknown field(s) {unknown}; known: {sorted(known)}"
        )
    for field in ("fault_type", "base_delay"):
        if field not in kwargs:
            raise ValueError(f"simulated_fault_params is missing the required field {field!r}")
    return SimulatedFaultParams(**kwargs)


def agree_on_rank(candidate: int, device: torch.device | str = "cpu") -> int:
    """Return rank 0's ``candidate`` on every rank (a collective when distributed).

    ``device`` must suit the default process group's backend (``cpu`` for gloo, the
    rank's CUDA device for NCCL); Lightning's ``strategy.root_device`` always does.
    Without an initialised process group the local candidate is returned.
    """
    import torch  # here, so that importing nvrx.ptl stays cheap
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return candidate
    value = torch.tensor([candidate], dtype=torch.int64, device=device)
    dist.broadcast(value, src=0)
    return int(value.item())


@dataclass(frozen=True)
class FaultPlan:
    """What a simulated fault will do: which rank, which fault, after how long."""

    rank_to_fail: int
    fault_type: str
    delay: float

    @property
    def signal(self) -> signal.Signals:
        """The signal that implements this fault."""
        return signal.SIGSTOP if self.fault_type == "rank_hung" else signal.SIGKILL


def plan_simulated_fault(
    params: SimulatedFaultParams,
    world_size: int,
    device: torch.device | str = "cpu",
    rng: random.Random | None = None,
) -> FaultPlan:
    """Decide the target rank (agreed across ranks), the fault type and the delay.

    A collective when distributed: every rank must call it. Raises ValueError when
    ``rank_to_fail`` is not a rank of this job.
    """
    rng = rng or random.Random()  # noqa: S311 - fault injection, not cryptography
    if params.rank_to_fail is not None and params.rank_to_fail >= world_size:
        raise ValueError(
            f"SimulatedFaultParams.rank_to_fail={params.rank_to_fail} is not a rank of this "
            f"job (world size {world_size})"
        )
    candidate = (
        params.rank_to_fail if params.rank_to_fail is not None else rng.randrange(world_size)
    )
    target = agree_on_rank(candidate, device)
    fault_type = params.fault_type
    if fault_type == "random":
        fault_type = rng.choice(_CONCRETE_FAULTS)
    delay = params.base_delay + rng.random() * params.rand_delay
    return FaultPlan(rank_to_fail=target, fault_type=fault_type, delay=delay)


def _signal_self(sig: signal.Signals) -> None:
    """Signal this rank: its whole process group when a launcher made it a session leader."""
    pid = os.getpid()
    if os.getsid(0) == pid and os.getpgid(0) == pid:
        os.killpg(pid, sig)
    else:
        os.kill(pid, sig)


class SimulatedFault:
    """A timer thread that applies a :class:`FaultPlan` to this process.

    ``start`` arms it; ``cancel`` disarms it (the callbacks cancel a fault that has
    not fired when fitting ends, so it never hits a later stage).
    """

    def __init__(self, plan: FaultPlan, rank: int, logger: logging.Logger) -> None:
        self.plan = plan
        self.rank = rank
        self._logger = logger
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvrx-simulated-fault", daemon=True)

    def start(self) -> None:
        """Arm the fault: it fires after ``plan.delay`` seconds unless cancelled."""
        self._thread.start()

    def cancel(self) -> None:
        """Disarm the fault if it has not fired yet."""
        self._cancelled.set()

    def _run(self) -> None:
        if self._cancelled.wait(self.plan.delay):
            return
        self._logger.warning(
            "Simulating fault %s on rank %d (pid %d) now",
            self.plan.fault_type,
            self.rank,
            os.getpid(),
        )
        for handler in self._logger.handlers + logging.getLogger().handlers:
            handler.flush()
        _signal_self(self.plan.signal)
