"""Quicker polling in torch's dynamic rendezvous while a node waits for the others.

While a node waits for the rest of a round, torch's c10d/etcd rendezvous sleeps a fixed
second between polls (``_delay(seconds=1)`` in its op executor) and serves reads from a
copy of the shared state cached for a second (``_BackendRendezvousStateHolder``). On an
in-job restart every node waits like that at least once, which added one to two
seconds to each restart of a multi-node job. Torch has no setting for either, so we
shorten both, in this process only, to ``--rdzv-poll-interval``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler, dynamic_rendezvous

__all__ = ["set_poll_interval"]

_TORCH_SYNC_DELAY = 1
_original: Callable[..., None] = dynamic_rendezvous._delay  # type: ignore[attr-defined]


def set_poll_interval(handler: RendezvousHandler, interval: float) -> None:
    """Poll the rendezvous state every ``interval`` s instead of every second while waiting."""

    def _delay(seconds: float | tuple[float, float]) -> None:
        if not isinstance(seconds, tuple) and seconds == _TORCH_SYNC_DELAY:
            seconds = interval
        _original(seconds)

    dynamic_rendezvous._delay = _delay  # type: ignore[attr-defined]
    if isinstance(handler, dynamic_rendezvous.DynamicRendezvousHandler):
        holder = handler._state_holder
        if isinstance(holder, dynamic_rendezvous._BackendRendezvousStateHolder):
            holder._cache_duration = interval  # type: ignore[assignment]
