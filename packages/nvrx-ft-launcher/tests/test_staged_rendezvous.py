"""The launcher's rendezvous stages, each alone and in their order, on a real handler.

The handler is torch's own static TCP rendezvous of one node (a real round over a real
store); the segment gate's stages run against real stores in ``test_segments.py``, the
group-rank stage in ``test_group_rank.py``.
"""

from __future__ import annotations

import socket

import pytest
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

from nvrx.launcher._staged_rendezvous import StagedRendezvous

pytestmark = pytest.mark.timeout(60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _handler() -> StaticTCPRendezvous:
    return StaticTCPRendezvous("127.0.0.1", _free_port(), 0, 1, "staged", 20)


class _Aligner:
    """Stage 4's seam: remembers what it was given, answers with group rank 7."""

    def __init__(self) -> None:
        self.nodes: tuple[tuple[str, int], ...] = ()
        self.seen: list[RendezvousInfo] = []

    def align(self, handler: RendezvousHandler, info: RendezvousInfo) -> RendezvousInfo:
        self.seen.append(info)
        bootstrap = info.bootstrap_store_info
        return RendezvousInfo(info.store, 7, info.world_size, bootstrap)  # type: ignore[arg-type]


def test_install_replaces_next_rendezvous_of_this_handler_only() -> None:
    handler, other = _handler(), _handler()
    staged = StagedRendezvous(handler)
    staged.install()
    assert handler.next_rendezvous == staged.next_rendezvous
    assert other.next_rendezvous.__func__ is StaticTCPRendezvous.next_rendezvous  # type: ignore[attr-defined]
    assert StaticTCPRendezvous.next_rendezvous is not staged.next_rendezvous


def test_the_torch_round_stage_is_torchs_own_round() -> None:
    handler = _handler()
    info = StagedRendezvous(handler).torch_round()
    assert (info.rank, info.world_size) == (0, 1)
    info.store.set("k", "v")  # the round's real store
    assert info.store.get("k") == b"v"


def test_the_stages_run_in_order_torch_round_then_alignment() -> None:
    handler, aligner = _handler(), _Aligner()
    staged = StagedRendezvous(handler, aligner=aligner, max_nodes=1)
    staged.install()
    info = handler.next_rendezvous()
    assert [i.rank for i in aligner.seen] == [0]  # alignment saw torch's round
    assert info.rank == 7  # and the agent sees the aligned rank


def test_alignment_alone_and_without_an_aligner() -> None:
    handler, aligner = _handler(), _Aligner()
    info = StagedRendezvous(handler).torch_round()
    assert StagedRendezvous(handler).align_group_ranks(info) is info
    assert StagedRendezvous(handler, aligner=aligner).align_group_ranks(info).rank == 7


def test_capacity_and_record_stages_are_no_ops_where_they_do_not_apply() -> None:
    handler = _handler()
    staged = StagedRendezvous(handler, max_nodes=1)
    staged.check_capacity()  # the static rendezvous lists no nodes: nothing to refuse
    staged.check_capacity()  # (and only the first join checks)
    info = staged.torch_round()
    staged.record_round(info)  # no segment gate: nothing recorded
    assert staged.segment_gate().world_size == 1  # no gate: torch's round
