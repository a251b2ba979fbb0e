"""Which iteration every rank restores, and from whom (pure, same answer on every rank).

Every rank contributes one fixed-size row block to a single ``all_gather``: up to ``M``
offers ``(owner, iteration, nbytes)`` of the valid snapshots it holds (own and
replicas; unused rows are -1), then one row ``(global iteration or -1, 0, 0)``.
:func:`choose` reads the gathered table and picks the newest iteration for which every
owner 0..W-1 has a holder, the owner itself first, else the lowest-ranked holder;
unless the global (disk) iteration is as new or newer, or no iteration is complete.
"""

from __future__ import annotations

import dataclasses

import torch

__all__: list[str] = []

EMPTY = -1


@dataclasses.dataclass(frozen=True)
class Plan:
    """The agreed restore: ``iteration`` None means fall back (global or nothing)."""

    iteration: int | None
    global_iteration: int | None
    source_of: tuple[int, ...] = ()  # per owner: the rank that supplies its snapshot
    nbytes_of: tuple[int, ...] = ()  # per owner: the snapshot's size


def encode(
    offers: list[tuple[int, int, int]], global_iteration: int | None, slots: int
) -> torch.Tensor:
    """This rank's ``(slots + 1, 3)`` int64 block; offers beyond ``slots`` are dropped."""
    block = torch.full((slots + 1, 3), EMPTY, dtype=torch.int64)
    for i, (owner, it, nbytes) in enumerate(offers[:slots]):
        block[i, 0], block[i, 1], block[i, 2] = owner, it, nbytes
    block[slots, 0] = EMPTY if global_iteration is None else global_iteration
    return block


def choose(table: torch.Tensor, world_size: int) -> Plan:
    """The plan from the gathered ``(world_size, slots + 1, 3)`` table."""
    rows = table.tolist()
    globals_ = [blk[-1][0] for blk in rows if blk[-1][0] >= 0]
    g = max(globals_) if globals_ else None
    # iteration -> owner -> (holders, nbytes)
    cover: dict[int, dict[int, dict[int, int]]] = {}
    for holder, blk in enumerate(rows):
        for owner, it, nbytes in blk[:-1]:
            if owner < 0 or it < 0 or not 0 <= owner < world_size or nbytes <= 0:
                continue
            cover.setdefault(it, {}).setdefault(owner, {})[holder] = nbytes
    for it in sorted(cover, reverse=True):
        if g is not None and g >= it:
            break
        owners = cover[it]
        if len(owners) != world_size:
            continue
        source: list[int] = []
        sizes: list[int] = []
        for owner in range(world_size):
            holders = owners[owner]
            pick = owner if owner in holders else min(holders)
            source.append(pick)
            sizes.append(holders[pick])
        return Plan(it, g, tuple(source), tuple(sizes))
    return Plan(None, g)
