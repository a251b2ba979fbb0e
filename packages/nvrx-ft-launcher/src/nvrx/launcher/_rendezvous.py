"""Quicker polling in torch's dynamic rendezvous while a node waits for the others.

While a node waits for the rest of a round, torch's c10d/etcd rendezvous sleeps a fixed
second between polls (``_delay(seconds=1)`` in its op executor) and serves reads from a
copy of the shared state cached for a second (``_BackendRendezvousStateHolder``). On an
in-job restart every node waits like that at least once, which added one to two
seconds to each restart of a multi-node job. Torch has no setting for either, so we
shorten both, in this process only, to ``--rdzv-poll-interval``.

Torch also waits a random 0-0.3 s before joining round 0, to spread the nodes' first
joins; we keep that for the first join and skip it when nodes join again after a restart
(which happens in round 0 too).

Every rendezvous step also records an event named after the calling method, found with
``inspect.stack()``, which reads the source of every frame on the stack: about 0.15 s of
each restart. We give it the same name from the frame itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler

from . import _torch_compat as compat

__all__ = ["renew_worker_store", "tune_rendezvous"]

_original: Callable[..., None] = compat.original_rendezvous_delay()


def _method_name(depth: int = 2) -> str:
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


def tune_rendezvous(handler: RendezvousHandler, interval: float) -> None:
    """Poll the rendezvous state every ``interval`` s instead of every second while waiting."""
    compat.replace_method_name(_method_name)

    jittered = False

    def _delay(seconds: float | tuple[float, float]) -> None:
        nonlocal jittered
        if isinstance(seconds, tuple):
            # The random 0-0.3 s spread before joining round 0: useful when all nodes
            # start at once, pure delay when they join again after a restart.
            if jittered:
                return
            jittered = True
        elif seconds == compat.TORCH_SYNC_DELAY_S:
            seconds = interval
        _original(seconds)

    compat.replace_rendezvous_delay(_delay)
    compat.set_state_cache_duration(handler, interval)


def renew_worker_store(handler: RendezvousHandler) -> None:
    """Make the next rendezvous host a new store for the ranks' ``init_process_group``.

    Torch's handler hosts one TCPStore (on node rank 0) that the ranks of every attempt
    share. Restarted ranks then find the previous attempt's keys there (gloo/NCCL
    addresses of dead ranks: "connection refused" at init). Letting the ranks host it
    instead (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) costs up to 1.5 s per restart,
    when a rank's client backs off because rank 0's server is not up yet. So we keep
    torch's launcher-hosted store and only forget it between attempts: the next
    rendezvous creates a new one, empty, before any rank starts.
    """
    compat.forget_worker_store(handler)
