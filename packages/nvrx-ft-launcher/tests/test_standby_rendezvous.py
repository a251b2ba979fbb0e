"""What standby nodes rely on in torch's dynamic rendezvous (public handler, real TCPStore).

``--ft-standby-nodes`` makes a round full at MIN nodes; a node that joins a full round
must wait in torch's redundancy list: not counted by ``num_nodes_waiting`` (so the job
does not restart for it), admitted when a round has room, and let go with
``RendezvousGracefulExitError`` (torch's agent returns, the launcher exits 0) when the
job closes the rendezvous.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest
from torch._C._distributed_c10d import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError, RendezvousInfo
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)

pytestmark = pytest.mark.timeout(120)


def _handler(port: int, run_id: str) -> DynamicRendezvousHandler:
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    backend = C10dRendezvousBackend(store, run_id)
    handler: DynamicRendezvousHandler = DynamicRendezvousHandler.from_backend(
        run_id,
        store,
        backend,
        min_nodes=1,
        max_nodes=1,  # MIN of --nnodes=1:2 --ft-standby-nodes
        local_addr="127.0.0.1",
        timeout=RendezvousTimeout(
            join=datetime.timedelta(seconds=60), last_call=datetime.timedelta(seconds=0.1)
        ),
        keep_alive_interval=1,
        keep_alive_max_attempt=2,
    )
    return handler


def _server() -> TCPStore:
    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip


def _standby(handler: DynamicRendezvousHandler, got: list[object]) -> threading.Thread:
    def join() -> None:
        try:
            got.append(handler.next_rendezvous())
        except Exception as exc:  # what the test checks
            got.append(exc)

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    return thread


def _settle(seconds: float = 2.0) -> None:
    time.sleep(seconds)  # several of the standby's polls and keep-alives


def test_a_standby_is_not_a_waiting_node_and_leaves_gracefully_when_the_job_ends() -> None:
    server = _server()
    active, spare = _handler(server.port, "closed"), _handler(server.port, "closed")
    info = active.next_rendezvous()
    assert info.world_size == 1
    got: list[object] = []
    thread = _standby(spare, got)
    _settle()
    assert got == [], "the standby must wait while the round is full"
    assert active.num_nodes_waiting() == 0, "a standby must not look like a waiting node"
    active.shutdown()  # the job ended
    thread.join(30)
    assert len(got) == 1
    assert isinstance(got[0], RendezvousGracefulExitError)


def test_a_standby_joins_the_next_round_when_the_active_node_is_gone() -> None:
    server = _server()
    active, spare = _handler(server.port, "replace"), _handler(server.port, "replace")
    active.next_rendezvous()
    got: list[object] = []
    thread = _standby(spare, got)
    _settle()
    assert got == []
    # The active node dies: its keep-alives stop (1 s x 2 here), torch drops it.
    active._stop_heartbeats()  # what a SIGKILLed launcher does, without killing pytest
    thread.join(30)
    assert len(got) == 1
    (joined,) = got
    assert isinstance(joined, RendezvousInfo), joined
    assert (joined.world_size, joined.rank) == (1, 0)
