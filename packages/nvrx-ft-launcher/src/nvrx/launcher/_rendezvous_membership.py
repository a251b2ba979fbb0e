"""This node in torch's rendezvous between rounds: who waits to join, leaving, closing.

:class:`Membership` asks torch's handler how many nodes wait to join (at most once a
second), takes this node out of the rendezvous at once when it leaves the job (torch has
no public call for that), and closes the rendezvous when the job is over for every node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from . import _torch_compat as compat

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

#: How often torch's rendezvous state is read for nodes waiting to join.
WAITING_CHECK_PERIOD_S = 1.0
#: How long leaving the rendezvous may take before the keep-alive expiry is left to do it.
_LEAVE_TIMEOUT_S = 10.0


class Membership:
    """This node's part in ``handler``'s rendezvous; ``after_close`` runs once it closed."""

    def __init__(
        self, handler: RendezvousHandler, after_close: Callable[[RendezvousHandler], None]
    ) -> None:
        self._handler = handler
        self._after_close = after_close
        self._closed = False
        self._next_waiting_check = 0.0

    def nodes_waiting(self) -> int:
        """Nodes waiting to join; 0 between checks and for a handler that cannot tell.

        Reads the whole rendezvous state from the store: once a second is plenty for
        noticing new nodes, and keeps the store host's load flat as the job grows.
        """
        now = time.monotonic()
        if not isinstance(self._handler, DynamicRendezvousHandler):
            return 0
        if now < self._next_waiting_check:
            return 0
        self._next_waiting_check = now + WAITING_CHECK_PERIOD_S
        return self._handler.num_nodes_waiting()

    def close(self) -> None:
        """The job is over for every node: close the rendezvous (idempotent, best effort).

        Never called for a local error, a signal or an exclusion, so the others (or a
        requeued job) can still use it.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._handler.shutdown()
        except Exception as exc:  # the store host may already be gone
            logger.debug("closing the rendezvous: %s", exc)
        self._after_close(self._handler)

    def leave(self) -> None:
        """Take this node out of the rendezvous now, so the others re-form without it.

        Torch has no public call for this (its handler only leaves when the next
        rendezvous starts, or after its keep-alive expires, 15 s by default).
        """
        try:
            compat.leave_rendezvous(self._handler, timeout_s=_LEAVE_TIMEOUT_S)
        except Exception as exc:  # best effort: the keep-alive expiry is the fallback
            logger.warning("could not leave the rendezvous promptly: %s", exc)
