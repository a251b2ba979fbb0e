"""One wrapper of torch's ``next_rendezvous``: the launcher's rendezvous as named stages.

torch's agent calls ``spec.rdzv_handler.next_rendezvous()`` for each round. The launcher
adds to it, on that handler instance only (torch's class is untouched), in this order:

1. :meth:`StagedRendezvous.segment_gate` (``--ft-segment``): wait until this node's
   segment is elected to run; a node of a broken segment leaves the job; a round that
   does not form within its deadline goes back to the gate;
2. :meth:`StagedRendezvous.check_capacity` (``--ft-standby-nodes`` with a MAX, no
   segments): at its first join, a launcher beyond MAX nodes leaves (exit 2);
3. :meth:`StagedRendezvous.torch_round`: torch's own round (with the gate's deadline);
4. :meth:`StagedRendezvous.align_group_ranks`: group ranks that follow the scheduler
   (:class:`._group_rank.GroupRankAligner`; not with the static rendezvous);
5. :meth:`StagedRendezvous.record_round` (``--ft-segment``): group rank 0 writes the
   round's nodes, from which a segment new to the rounds journals ``node_replaced``.

Each stage is a method, callable (and tested) alone; :meth:`~StagedRendezvous.install`
is the one place that replaces the handler's ``next_rendezvous``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NoReturn, Protocol

from torch.distributed.elastic.rendezvous import (
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousTimeoutError,
)

from ._launcher_exit import LauncherExit
from ._segment_gate import (
    GateFull,
    SegmentGate,
    SegmentLeave,
    hosts_store,
    join_timeout,
    keep_alive_window,
    round_deadline,
)
from ._torch_compat import Store, join_deadline, rendezvous_nodes, rendezvous_store
from .exit_codes import ExitCode

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

#: How long a store host of a broken segment stays after the job ended (the others'
#: leave barrier, a few store calls).
HOST_GRACE_S = 3.0


class Aligner(Protocol):
    """What stage 4 needs (:class:`._group_rank.GroupRankAligner`)."""

    #: (node id, group rank) of every node in the last round, by group rank.
    nodes: tuple[tuple[str, int], ...]

    def align(self, handler: RendezvousHandler, info: RendezvousInfo) -> RendezvousInfo:
        """``info`` with this node's aligned group rank."""
        ...


class StagedRendezvous:
    """``next_rendezvous`` of one torch handler as the stages above, in their order.

    ``gate`` and ``on_segment_left`` (which ends the launcher) enable stages 1 and 5;
    ``max_nodes`` stage 2; ``aligner`` stage 4. Stage 3 is always torch's round.
    """

    def __init__(
        self,
        handler: RendezvousHandler,
        *,
        gate: SegmentGate | None = None,
        on_segment_left: Callable[[SegmentLeave], NoReturn] | None = None,
        max_nodes: int | None = None,
        aligner: Aligner | None = None,
    ) -> None:
        self.handler = handler
        #: torch's own next_rendezvous of this handler (before :meth:`install`).
        self._torch = handler.next_rendezvous
        self._gate = gate
        self._on_segment_left = on_segment_left
        self._max_nodes = max_nodes
        self._aligner = aligner
        self._joined = False
        self._store: Store | None = None
        if gate is not None:
            self._store = rendezvous_store(handler)
            if self._store is None:  # refused at start-up (c10d/etcd-v2 only)
                raise RuntimeError("--ft-segment needs the dynamic rendezvous' store")

    def install(self) -> None:
        """Make the handler's ``next_rendezvous`` this one (this handler instance only)."""
        self.handler.next_rendezvous = self.next_rendezvous  # type: ignore[method-assign]

    def next_rendezvous(self) -> RendezvousInfo:
        """One round, through every enabled stage in order."""
        if self._gate is not None:
            info = self.segment_gate()  # stages 1 and 3: a round that fails goes back
        else:
            self.check_capacity()
            info = self.torch_round()
        info = self.align_group_ranks(info)
        self.record_round(info)
        return info

    # -- the stages ------------------------------------------------------------------

    def segment_gate(self) -> RendezvousInfo:
        """Stage 1 (with stage 3): wait at the gate until elected, then torch's round.

        A round of the elected segments that does not form within its deadline (an
        elected node is gone) goes back to the gate for a new election, while the join
        timeout leaves time for one.
        """
        gate, store = self._gate, self._store
        if gate is None or store is None:
            return self.torch_round()
        elected_at: float | None = None  # a standby's wait at the gate does not count
        while True:
            try:
                admitted = gate.admit(self.handler, store)  # False: the job ended
            except SegmentLeave as exc:
                if self._on_segment_left is None:
                    raise
                self._on_segment_left(exc)
            except GateFull as exc:
                one_too_many(str(exc))
            if not admitted and gate.epoch is None:
                # A standby segment never elected: it joined none of torch's rounds, so
                # torch would call the closed rendezvous an error (not its standby exit).
                serve_a_moment_if_host(store)
                raise RendezvousGracefulExitError(
                    "the rendezvous is closed: the job ended while this segment waited"
                )
            if not admitted:
                return self.torch_round()  # torch's closed rendezvous, as without segments
            if self._aligner is not None and not self._aligner.nodes:
                # New to the job's rounds (a standby segment): the round it joins says
                # whose places it takes (node_replaced), as a returning node's would.
                self._aligner.nodes = gate.last_round(store)
            if elected_at is None:
                elected_at = time.monotonic()
            join = join_timeout(self.handler)
            deadline = min(round_deadline(self.handler, gate.elected_nodes()), join)
            try:
                return self.torch_round(deadline)
            except RendezvousTimeoutError:
                if time.monotonic() - elected_at + deadline > join:
                    raise  # no time left for another election within the join timeout
                logger.warning(
                    "torch's round of the segments elected in epoch %s did not form "
                    "within %g s: an elected node is gone; back to the segment gate for "
                    "a new election",
                    gate.epoch,
                    deadline,
                )

    def check_capacity(self) -> None:
        """Stage 2: at the first join, leave (exit 2) if MAX nodes are in the job already.

        Torch keeps any number of nodes in its redundancy list (it knows MIN only), so a
        launcher beyond MAX would wait unseen until the job ends. Nodes torch still lists
        after they died count until its keep-alive drops them: the check waits that long
        for a place before refusing.
        """
        if self._max_nodes is None or self._joined:
            return
        refuse_beyond_max(self.handler, self._max_nodes)
        self._joined = True

    def torch_round(self, deadline: float | None = None) -> RendezvousInfo:
        """Stage 3: torch's round (within ``deadline`` seconds, when given)."""
        if deadline is None:
            return self._torch()
        with join_deadline(self.handler, deadline):
            return self._torch()

    def align_group_ranks(self, info: RendezvousInfo) -> RendezvousInfo:
        """Stage 4: ``info`` with the scheduler-aligned group rank."""
        return info if self._aligner is None else self._aligner.align(self.handler, info)

    def record_round(self, info: RendezvousInfo) -> None:
        """Stage 5: group rank 0 records the round's nodes for the next one's newcomers."""
        gate, store = self._gate, self._store
        if gate is None or store is None or self._aligner is None:
            return
        if info.rank == 0 and self._aligner.nodes:
            try:
                gate.record_round(store, self._aligner.nodes)
            except RuntimeError as exc:  # the store's error: only node_replaced lacks it
                logger.warning("could not record the round's nodes: %s", exc)


def serve_a_moment_if_host(store: Store) -> None:
    """The job ended: the store's host serves ``HOST_GRACE_S`` more before it exits.

    The other nodes still read the closed rendezvous (standbys at the gate poll it) and
    run their leave barrier through this store; were it gone, they would exit 5.
    """
    if hosts_store(store):
        time.sleep(HOST_GRACE_S)


def one_too_many(reason: str) -> NoReturn:
    raise LauncherExit(int(ExitCode.USAGE_ERROR), reason)


def refuse_beyond_max(handler: RendezvousHandler, max_nodes: int) -> None:
    """Leave (exit 2) if MAX nodes stay in the rendezvous past torch's keep-alive window."""
    window = keep_alive_window(handler) + 1.0
    deadline = time.monotonic() + window
    said = False
    while True:
        found = rendezvous_nodes(handler)
        if found is None or found[1] or found[0] < max_nodes:
            return
        if time.monotonic() > deadline:
            one_too_many(
                f"--nnodes MAX is {max_nodes}: {found[0]} nodes are in the job already "
                f"(running or waiting as standbys); this launcher is one too many"
            )
        if not said:
            said = True
            logger.warning(
                "%d nodes are in the job already (--nnodes MAX %d); waiting up to %.0f s "
                "for a place (a lost node's keep-alive to expire)",
                found[0],
                max_nodes,
                window,
            )
        time.sleep(1.0)
