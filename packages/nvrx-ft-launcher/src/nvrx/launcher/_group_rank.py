"""Group ranks that follow the scheduler: SLURM_PROCID, then GROUP_RANK, then join order.

Torch's dynamic rendezvous numbers nodes by the sort order of their descriptors (host
name, pid, counter), so node 3 of an sbatch job may be group rank 0 and every log line
names ranks the scheduler does not know. NVRx 0.7 always aligns them (its v0.5 flag
``--ft-use-infra-group-rank`` became the only behaviour); so do we: after each round
every node publishes its scheduler index in the round's store, torch's rank 0 sorts
them (:func:`aligned_ranks`) and publishes one result (every node and its group rank,
in torch order), and every node checks it and takes its place: O(1) store operations
per node. Both are signed with the job key when there is one (HMAC bound to the run id,
the run's nonce (:mod:`._run_nonce`) and the store key). A result that does not check
(unsigned, a duplicate rank, this node missing from its place) is never replaced by a
rank of the node's own choosing: the round fails with RendezvousError. The ranks stay
dense (0..N-1) when the scheduler's are not (a replaced node).

With standby nodes (``--ft-standby-nodes``) the ranks are also stable: a node that was in
the previous round keeps its group rank, and a standby that takes a departed node's
place gets that node's rank (:func:`stable_ranks`); each node that was in the previous
round says who replaced whom (:func:`replacements`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta

from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousHandler, RendezvousInfo

from ._run_nonce import run_nonce, scheduler_attempt, signed_run
from ._scheduler_order import MAX_INDEX as _MAX_INDEX
from ._scheduler_order import InfraKey, infra_key
from ._segments import whole_segments
from ._signed_store import SignedStore
from ._staged_rendezvous import StagedRendezvous
from ._torch_compat import Store

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

#: Where each node publishes its key, under the round's own store prefix.
_KEY = "nvrx.launcher/infra_rank/"
#: Where torch's rank 0 publishes each node's aligned group rank, and the node list.
_RESULT = "nvrx.launcher/group_ranks"
#: How long a node waits for the others' keys (they publish right after the round).
_WAIT_S = 60.0
_POLL_S = 0.1


def aligned_ranks(keys: Sequence[InfraKey]) -> list[int]:
    """``keys[r]`` is torch rank r's key; returns the group rank of each torch rank.

    Sorted by key, ties (two launchers with the same SLURM_PROCID) by torch's rank, so
    the result is a permutation of 0..N-1 whatever the keys are.
    """
    order = sorted(range(len(keys)), key=lambda r: (keys[r], r))
    ranks = [0] * len(keys)
    for group_rank, torch_rank in enumerate(order):
        ranks[torch_rank] = group_rank
    return ranks


def stable_ranks(keys: Sequence[InfraKey], previous: Sequence[int | None]) -> list[int]:
    """Like :func:`aligned_ranks`, but a node keeps its ``previous`` group rank.

    ``previous[r]`` is the group rank torch rank r had in the last round it was in
    (None: a node new to the job, a standby). Kept ranks must be unique and below the
    world size (else that node is treated as new); the free ranks go to the new nodes
    in :func:`aligned_ranks` order. A permutation of 0..N-1 whatever the inputs.
    """
    n = len(keys)
    ranks: list[int | None] = [None] * n
    taken: set[int] = set()
    for r in sorted(range(n), key=lambda r: (keys[r], r)):
        prev = previous[r]
        if prev is not None and 0 <= prev < n and prev not in taken:
            ranks[r] = prev
            taken.add(prev)
    free = iter(g for g in range(n) if g not in taken)
    for r in sorted(range(n), key=lambda r: (keys[r], r)):
        if ranks[r] is None:
            ranks[r] = next(free)
    return [g for g in ranks if g is not None]


def replacements(
    before: Sequence[tuple[str, int]], after: Sequence[tuple[str, int]]
) -> list[tuple[int, str, str]]:
    """``(group rank, node that left, node that took its place)`` between two rounds."""
    old = {rank: node for node, rank in before}
    now = {node for node, _ in after}
    return [
        (rank, old[rank], node)
        for node, rank in sorted(after, key=lambda p: p[1])
        if rank in old and old[rank] != node and old[rank] not in now
    ]


def _published(mine: InfraKey, node: str, previous: int | None, segment: str | None = None) -> str:
    data: dict[str, object] = {"tier": mine.tier, "index": mine.index, "node": node}
    if previous is not None:
        data["prev"] = previous
    if segment is not None:
        data["segment"] = segment
    return json.dumps(data)


@dataclasses.dataclass(frozen=True)
class _Published:
    """What one node published for the round."""

    key: InfraKey
    node: str
    previous: int | None
    segment: str | None = None


def _node_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 255 or not value.isprintable():
        raise ValueError(f"not a {what}: {value!r}")
    return value


def _parse_published(text: bytes | str) -> _Published:
    """A node's published key, id, previous group rank and segment; ValueError otherwise."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"not an infra rank key: {text!r}") from None
    if not isinstance(data, dict) or "node" not in data:
        raise ValueError(f"not an infra rank key: {text!r}")
    node = _node_id(data.pop("node"), "node id")
    prev = data.pop("prev", None)
    if prev is not None and (type(prev) is not int or not 0 <= prev <= _MAX_INDEX):
        raise ValueError(f"not a previous group rank: {prev!r}")
    segment = data.pop("segment", None)
    if segment is not None:
        segment = _node_id(segment, "segment name")
    return _Published(InfraKey.from_json(json.dumps(data)), node, prev, segment)


def _gather(signed: SignedStore, world_size: int) -> list[_Published]:
    """Every node's published key and id (torch's rank 0 only: one wait, one multi_get)."""
    names = [f"{_KEY}{r}" for r in range(world_size)]
    signed.store.wait(names, timedelta(seconds=_WAIT_S))
    found = []
    for r, raw in enumerate(signed.store.multi_get(names)):
        published = signed.parse(names[r], raw, _parse_published)
        if published is None:
            # A value nobody of this job wrote (logged): that node will not find itself
            # in the result, and its round fails (RendezvousError) instead of running twice.
            published = _Published(InfraKey(2, r), f"rendezvous-rank-{r}", None)
        found.append(published)
    return found


class _RoundRefused(Exception):
    """Torch's rank 0 refused the round (signed): every node fails it at once."""


def _parse_result(
    body: str, world_size: int, torch_rank: int, node: str
) -> tuple[int, tuple[tuple[str, int], ...]]:
    """This node's group rank and the round's (node, group rank) list, by group rank.

    ValueError unless it lists ``world_size`` distinct nodes in torch order, with this
    node at its own torch rank, and the group ranks are a permutation of 0..N-1.
    """
    try:
        data = json.loads(body)
    except ValueError:
        raise ValueError("group ranks: not JSON") from None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        raise _RoundRefused(data["error"])
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list) or len(nodes) != world_size:
        raise ValueError(f"group ranks: not a list of {world_size} nodes")
    listing: list[tuple[str, int]] = []
    for entry in nodes:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and type(entry[1]) is int
        ):
            raise ValueError(f"group ranks: bad entry {entry!r}")
        listing.append((entry[0], entry[1]))
    if sorted(r for _, r in listing) != list(range(world_size)):
        raise ValueError("group ranks: not a permutation of 0..N-1")
    if len({n for n, _ in listing}) != world_size:
        raise ValueError("group ranks: a node listed twice")
    if listing[torch_rank][0] != node:
        raise ValueError(f"group ranks: rendezvous rank {torch_rank} is not this node")
    return listing[torch_rank][1], tuple(sorted(listing, key=lambda p: p[1]))


def _align(
    store: Store,
    torch_rank: int,
    world_size: int,
    mine: InfraKey,
    node: str,
    previous: int | None = None,
    *,
    stable: bool = False,
    key: bytes | None = None,
    run_id: str = "",
    segment: str | None = None,
    segment_size: int | None = None,
) -> tuple[int, tuple[tuple[str, int], ...]]:
    """This node's aligned group rank, and (node id, group rank) of every node.

    Every node publishes its key, signed with the job key; torch's rank 0 reads them all,
    sorts them (``stable``: a node keeps its ``previous`` group rank) and publishes one
    signed result, the nodes and their group ranks in torch order, which every node
    checks (:func:`_parse_result`): O(1) store operations per node. A value that does
    not check is waited past until the round's deadline, then the round fails with
    RendezvousError: never a rank of this node's own choosing, which could duplicate one.

    With ``segment_size`` (``--ft-segment``) each node also publishes its ``segment`` and
    torch's rank 0 refuses a round that is not whole segments (signed, so every node
    fails the round at once with the reason).
    """
    name = f"{_KEY}{torch_rank}"
    deadline = time.monotonic() + _WAIT_S
    signed = SignedStore(store, key, run_id)
    try:
        signed.set(name, _published(mine, node, previous, segment))
        if torch_rank == 0:
            found = _gather(signed, world_size)
            keys = [p.key for p in found]
            prev = [p.previous for p in found]
            ranks = stable_ranks(keys, prev) if stable else aligned_ranks(keys)
            refusal = None
            if segment_size is not None:
                refusal = whole_segments([p.segment for p in found], segment_size)
            if refusal is not None:
                body = json.dumps({"error": refusal})
            else:
                body = json.dumps({"nodes": [[p.node, ranks[r]] for r, p in enumerate(found)]})
            signed.set(_RESULT, body)
        said = False
        while True:
            left = deadline - time.monotonic()
            store.wait([_RESULT], timedelta(seconds=max(0.1, left)))
            try:
                body = signed.unseal(_RESULT, store.get(_RESULT))
                return _parse_result(body, world_size, torch_rank, node)
            except _RoundRefused as exc:
                raise RendezvousError(f"torch's rank 0 refused the round: {exc}") from None
            except ValueError as exc:
                if left <= 0:
                    raise RendezvousError(
                        f"no valid group ranks for this round within {_WAIT_S:.0f} s: {exc}"
                    ) from None
                if not said:
                    said = True
                    logger.warning("waiting for valid group ranks: %s", exc)
                time.sleep(_POLL_S)
    except RuntimeError as exc:  # the store's timeout (DistStoreError) or connection
        raise RendezvousError(f"group rank exchange failed: {exc}") from exc


class GroupRankAligner:
    """Makes a handler's rounds give scheduler-aligned group ranks; remembers the last round.

    Only ``rank`` of torch's RendezvousInfo changes: the store, world size and
    bootstrap store (the workers' MASTER_ADDR/PORT, hosted by torch's rank 0) stay
    torch's, the same on every node.
    """

    def __init__(
        self,
        env: Mapping[str, str],
        node: str,
        *,
        stable: bool = False,
        key: bytes | None = None,
        run_id: str = "",
        segment_size: int | None = None,
        place: Callable[[], tuple[int, str] | None] | None = None,
    ) -> None:
        self._env = env
        #: --ft-segment: this node's place among the active nodes and its segment, from
        #: the segment gate; torch's rank 0 checks the round is whole segments.
        self._segment_size = segment_size
        self._place = place
        self._node = node
        #: Standby nodes: keep group ranks across rounds.
        self._stable = stable
        #: The job key signs what each node and torch's rank 0 publish (None: unsigned,
        #: already warned about at start-up; still checked as a permutation).
        self._key = key
        self._run_id = run_id
        #: The run as signed values name it (with the nonce), once the store is known.
        self._signed_run: str | None = None
        #: (node id, group rank) of every node in the last round, by group rank.
        self.nodes: tuple[tuple[str, int], ...] = ()
        #: With ``stable``: (group rank, node that left, node in its place) of the last
        #: round, for a node that was in the round before (empty otherwise).
        self.replaced: list[tuple[int, str, str]] = []
        self._rank: int | None = None
        self._said_own_store = False

    def install(self, handler: RendezvousHandler) -> None:
        """Align ``handler``'s rounds (its stage 4 alone, :mod:`._staged_rendezvous`)."""
        StagedRendezvous(handler, aligner=self).install()

    def align(self, handler: RendezvousHandler, info: RendezvousInfo) -> RendezvousInfo:
        """``info`` of a round torch just formed, with this node's aligned group rank."""
        if not getattr(handler, "use_agent_store", True):
            # Torch's rank 0 hosts no store for the workers then: the worker of
            # RANK 0 starts one at MASTER_ADDR, which is torch's rank-0 node. A rank
            # 0 elsewhere would bind an address that is not its own and hang.
            if not self._said_own_store:
                self._said_own_store = True
                logger.warning(
                    "group ranks follow the rendezvous order, not SLURM_PROCID/"
                    "GROUP_RANK (nor stay stable for standby nodes): this rendezvous "
                    "does not share its store with the workers "
                    "(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, or the etcd backend)"
                )
            return info
        placed = None if self._place is None else self._place()
        mine = infra_key(self._env, info.rank) if placed is None else InfraKey(0, placed[0])
        before = self.nodes
        if self._signed_run is None:
            nonce = run_nonce(info.store, self._key, self._run_id, scheduler_attempt(self._env))
            self._signed_run = signed_run(self._run_id, nonce)
        rank, self.nodes = _align(
            info.store,
            info.rank,
            info.world_size,
            mine,
            self._node,
            self._rank if self._stable else None,
            stable=self._stable,
            key=self._key,
            run_id=self._signed_run,
            segment=None if placed is None else placed[1],
            segment_size=self._segment_size,
        )
        self._rank = rank
        if self._stable and len(before) > 1:
            self.replaced = replacements(before, self.nodes)
            for group_rank, left, by in self.replaced:
                logger.warning("node %s replaced %s as group rank %d", by, left, group_rank)
        if rank != info.rank:
            logger.info(
                "group rank %d (from %s; the rendezvous numbered this node %d)",
                rank,
                "the segment gate"
                if placed is not None
                else ("SLURM_PROCID", "GROUP_RANK", "the rendezvous order")[mine.tier],
                info.rank,
            )
        bootstrap = info.bootstrap_store_info
        return RendezvousInfo(info.store, rank, info.world_size, bootstrap)  # type: ignore[arg-type]
