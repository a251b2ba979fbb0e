"""NVRx's replication strategy names; in nvrx they say how many copies, not how to send.

:class:`CliqueReplicationStrategy` (``replication_factor`` F) asks the manager to keep
each rank's snapshot on F - 1 other nodes. nvrx places them with a ring over nodes
(rank at local index i of node n -> local index i of nodes n+1 .. n+F-1), so any node
count works and losing any F - 1 nodes loses nothing; NVRx's cliques (ranks b, b+J, ...
in groups of F, J x F dividing the world) are not used, and ``replication_jump`` only
has to be positive. The transfers run in the background on one dedicated gloo group,
never by pickled objects. ``replicate``/``retrieve_plan``/``retrieve_execute`` are
NVRx's internal steps; nvrx's manager does not call them and they raise.
"""

from __future__ import annotations

import abc
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "CliqueReplicationStrategy",
    "LazyCliqueReplicationStrategy",
    "LazyReplicationStrategyBuilder",
    "NoReplicasAvailableError",
    "ReplicationStrategy",
]


class NoReplicasAvailableError(Exception):
    """No rank holds a copy of a snapshot that is needed."""


class ReplicationStrategy(abc.ABC):
    """How many copies of each rank's snapshot the manager keeps on other nodes."""

    @property
    @abc.abstractmethod
    def replicas(self) -> int:
        """Copies kept on other nodes (the replication factor minus one)."""

    def replicate(self, tasd: Any, id_: Any) -> Any:
        """NVRx's synchronous replication step; nvrx replicates in the background."""
        raise NotImplementedError("nvrx's manager replicates in the background itself")

    def retrieve_plan(self, globally_available_ids: Any, wanted: Any) -> Any:
        """NVRx's retrieval planning; nvrx plans with one fixed-size all_gather."""
        raise NotImplementedError("nvrx's manager plans retrieval itself")

    def retrieve_execute(self, *args: Any, **kwargs: Any) -> Any:
        """NVRx's retrieval step; nvrx's manager fetches itself."""
        raise NotImplementedError("nvrx's manager fetches replicas itself")


def _default_jump() -> int:
    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


class CliqueReplicationStrategy(ReplicationStrategy):
    """Keep each snapshot on ``replication_factor - 1`` other nodes.

    ``local_group`` is kept for NVRx compatibility (``.local_group``); its size is the
    default replication factor. ``target_device`` is accepted and kept; replicas always
    live in host memory (NVRx's default, ``'cpu'``).
    """

    def __init__(
        self,
        local_group: Any,
        target_device: str = "cpu",
        *,
        replication_factor: int | None = None,
    ) -> None:
        self.local_group = local_group
        self.target_device = target_device
        if replication_factor is None:
            size = 2
            if local_group is not None and dist.is_available() and dist.is_initialized():
                group = getattr(local_group, "group", local_group)
                size = dist.get_world_size(group)
            replication_factor = size
        if replication_factor < 1:
            raise ValueError(f"replication_factor={replication_factor}: must be 1 or more")
        self.replication_factor = replication_factor

    @property
    def replicas(self) -> int:
        return self.replication_factor - 1

    @classmethod
    def from_replication_params(
        cls, replication_jump: int | None = None, replication_factor: int = 2
    ) -> CliqueReplicationStrategy:
        """NVRx's constructor; ``replication_jump`` defaults (at call time, not import
        time) to the GPUs per node and only has to be positive; no groups are made."""
        jump = _default_jump() if replication_jump is None else replication_jump
        if jump <= 0:
            raise ValueError(f"replication_jump={jump}: must be positive")
        if replication_factor <= 0:
            raise ValueError(f"replication_factor={replication_factor}: must be positive")
        return cls(None, replication_factor=replication_factor)


class LazyReplicationStrategyBuilder(ReplicationStrategy, abc.ABC):
    """A strategy whose real one is built on first use (after the process group exists)."""

    def __init__(self) -> None:
        self._strategy: ReplicationStrategy | None = None

    @abc.abstractmethod
    def _build(self) -> ReplicationStrategy:
        """Make the real strategy."""

    @property
    def replication_strategy(self) -> ReplicationStrategy:
        """The real strategy, built once."""
        if self._strategy is None:
            self._strategy = self._build()
        return self._strategy

    @property
    def replicas(self) -> int:
        return self.replication_strategy.replicas


class LazyCliqueReplicationStrategy(LazyReplicationStrategyBuilder):
    """NVRx's lazy clique strategy (NeMo's default); defaults read at first use."""

    def __init__(self, replication_jump: int | None = None, replication_factor: int = 2) -> None:
        super().__init__()
        self.replication_jump = replication_jump
        self.replication_factor = replication_factor

    def _build(self) -> ReplicationStrategy:
        return CliqueReplicationStrategy.from_replication_params(
            self.replication_jump, self.replication_factor
        )
