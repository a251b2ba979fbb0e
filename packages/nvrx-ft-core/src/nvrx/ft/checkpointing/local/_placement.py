"""Where each rank's snapshot is replicated (pure, the same answer on every rank).

Nodes are ordered by their node key (the group rank); the ranks of a node by rank.
The owner at local index ``i`` of node ``n`` is held by the rank at local index
``i mod size(m)`` of nodes ``m = n+1 .. n+R`` (mod the node count): a ring over nodes,
so losing any R nodes loses no snapshot, for any number of nodes and any mix of
node sizes. R is capped at nodes - 1 (one node: no replica).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__: list[str] = []


def nodes_of(node_of_rank: Sequence[int]) -> list[list[int]]:
    """The ranks of each node, nodes ordered by key and ranks ascending."""
    by_key: dict[int, list[int]] = {}
    for rank, key in enumerate(node_of_rank):
        by_key.setdefault(key, []).append(rank)
    return [by_key[k] for k in sorted(by_key)]


def effective_replicas(node_of_rank: Sequence[int], replicas: int) -> int:
    """R capped at the number of other nodes."""
    return max(0, min(replicas, len(set(node_of_rank)) - 1))


def replica_holders(owner: int, node_of_rank: Sequence[int], replicas: int) -> list[int]:
    """The ranks that hold ``owner``'s snapshot besides the owner, nearest node first."""
    nodes = nodes_of(node_of_rank)
    r = effective_replicas(node_of_rank, replicas)
    n = next(i for i, ranks in enumerate(nodes) if owner in ranks)
    local = nodes[n].index(owner)
    holders = []
    for k in range(1, r + 1):
        target = nodes[(n + k) % len(nodes)]
        holders.append(target[local % len(target)])
    return holders


def owners_held_by(holder: int, node_of_rank: Sequence[int], replicas: int) -> list[int]:
    """The owners whose replicas ``holder`` keeps, ascending."""
    return [
        o for o in range(len(node_of_rank)) if holder in replica_holders(o, node_of_rank, replicas)
    ]
