"""NVRx's ``replication.group_utils`` names that downstream code imports.

Megatron-LM imports :class:`GroupWrapper` and :func:`parse_group_sequence`. nvrx's
manager does not use them: it replicates over its own gloo group with a ring over
nodes (no ``J x F`` divisibility rule) and never pickles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch.distributed as dist

__all__ = ["ExchangePlan", "ExchangePlanEntry", "GroupWrapper", "parse_group_sequence"]


@dataclasses.dataclass(frozen=True)
class ExchangePlanEntry:
    """One transfer: ``sender`` gives ``id_`` to ``receiver`` (global ranks)."""

    sender: int
    receiver: int
    id_: object


@dataclasses.dataclass
class ExchangePlan:
    """An ordered list of transfers within ``group``."""

    group: GroupWrapper
    _entries: list[ExchangePlanEntry] = dataclasses.field(default_factory=list)

    def plan(self, sender: int, receiver: int, id_: object) -> None:
        """Add a transfer."""
        self._entries.append(ExchangePlanEntry(sender, receiver, id_))

    @property
    def entries(self) -> tuple[ExchangePlanEntry, ...]:
        """The transfers, in order."""
        return tuple(self._entries)

    def required_ids(self, rank: int | None = None) -> set[object]:
        """The ids ``rank`` (default: this rank) must send."""
        who = self.group.my_global_rank if rank is None else rank
        return {e.id_ for e in self._entries if e.sender == who}


def parse_group_sequence(
    replication_jump: int, replication_factor: int, world_size: int
) -> list[tuple[int, ...]]:
    """NVRx's cliques: for each residue b of J, ranks b, b+J, ... cut into groups of F.

    Same rule as NVRx (AssertionError unless J > 0, F > 0 and J*F divides W); sorted.
    """
    assert replication_jump > 0, "replication_jump must be positive"
    assert replication_factor > 0, "replication_factor must be positive"
    assert world_size % (replication_jump * replication_factor) == 0, (
        f"Cannot split {world_size} ranks into replication groups of {replication_factor} "
        f"with jump {replication_jump}"
    )
    out: list[tuple[int, ...]] = []
    for base in range(replication_jump):
        seq = list(range(base, world_size, replication_jump))
        out.extend(
            tuple(seq[i : i + replication_factor]) for i in range(0, len(seq), replication_factor)
        )
    out.sort()
    return out


class GroupWrapper:
    """A process group (None: the default group) with rank helpers."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self._group = group

    @staticmethod
    def wrap(group: dist.ProcessGroup | GroupWrapper | None) -> GroupWrapper:
        """``group`` as a GroupWrapper (unchanged if it already is one)."""
        return group if isinstance(group, GroupWrapper) else GroupWrapper(group)

    @staticmethod
    def from_list_of_groups(list_of_groups: Sequence[dist.ProcessGroup]) -> GroupWrapper:
        """The one group of the list this rank is in (AssertionError if none or several)."""
        me = dist.get_rank()
        mine = [g for g in list_of_groups if me in dist.get_process_group_ranks(g)]
        assert len(mine) == 1, f"rank {me} is in {len(mine)} of the groups, not 1"
        return GroupWrapper(mine[0])

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The wrapped group."""
        return self._group

    @property
    def backend(self) -> str:
        """The group's backend name."""
        return str(dist.get_backend(self._group))

    @property
    def ranks(self) -> list[int]:
        """Global ranks of the group."""
        if self._group is None:
            return list(range(dist.get_world_size()))
        return list(dist.get_process_group_ranks(self._group))

    @property
    def world_size(self) -> int:
        """Size of the group."""
        return dist.get_world_size(self._group)

    def get_group_rank(self, global_rank: int | None = None) -> int:
        """The group rank of ``global_rank`` (default: this rank)."""
        if global_rank is None:
            return dist.get_rank(self._group)
        if self._group is None:
            return global_rank
        return dist.get_group_rank(self._group, global_rank)

    def get_global_rank(self, group_rank: int | None = None) -> int:
        """The global rank of ``group_rank`` (default: this rank)."""
        if group_rank is None or self._group is None:
            return dist.get_rank() if group_rank is None else group_rank
        return dist.get_global_rank(self._group, group_rank)

    @property
    def my_group_rank(self) -> int:
        """This rank in the group."""
        return self.get_group_rank(None)

    @property
    def my_global_rank(self) -> int:
        """This rank in the world."""
        return self.get_global_rank(None)

    def __repr__(self) -> str:
        return f"<GroupWrapper of {self.world_size} ranks>"
