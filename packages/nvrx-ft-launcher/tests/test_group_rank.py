"""Scheduler-aligned group ranks: the order function, the key format, the store exchange."""

from __future__ import annotations

import datetime
import threading

import pytest
from torch._C._distributed_c10d import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousError

from nvrx.launcher import _group_rank
from nvrx.launcher._group_rank import _align, _published, aligned_ranks
from nvrx.launcher._scheduler_order import InfraKey, infra_key
from nvrx.launcher._signed_store import seal


def test_slurm_procid_wins_over_group_rank_and_torch_order() -> None:
    env = {"SLURM_PROCID": "7", "GROUP_RANK": "2"}
    assert infra_key(env, 0) == InfraKey(0, 7)
    assert infra_key({"GROUP_RANK": "2"}, 0) == InfraKey(1, 2)
    assert infra_key({}, 5) == InfraKey(2, 5)
    # Not a plain index: ignored, the next source decides.
    assert infra_key({"SLURM_PROCID": "x", "GROUP_RANK": "-1"}, 3) == InfraKey(2, 3)


def test_ranks_follow_slurm_procid_in_reverse_of_the_rendezvous_order() -> None:
    keys = [InfraKey(0, 2), InfraKey(0, 1), InfraKey(0, 0)]
    assert aligned_ranks(keys) == [2, 1, 0]


def test_ranks_stay_dense_when_scheduler_indices_have_gaps_and_ties() -> None:
    # Node 1 of the allocation was replaced: indices 0, 2, 3; two launchers share 3.
    keys = [InfraKey(0, 3), InfraKey(0, 0), InfraKey(0, 3), InfraKey(0, 2)]
    assert aligned_ranks(keys) == [2, 0, 3, 1]


def test_scheduled_nodes_come_before_unscheduled_ones() -> None:
    keys = [InfraKey(2, 0), InfraKey(1, 0), InfraKey(0, 5)]
    assert aligned_ranks(keys) == [2, 1, 0]


@pytest.mark.parametrize(
    "text",
    [
        '{"tier": 0}',
        '{"tier": 3, "index": 0}',
        '{"tier": 0, "index": -1}',
        "[0, 1]",
        '{"tier": true, "index": 0}',
        '{"tier": 0, "index": 1.5}',
        "not json",
    ],
)
def test_a_malformed_published_key_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="infra rank key"):
        InfraKey.from_json(text)


def test_three_nodes_agree_over_a_real_store() -> None:
    server = TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )
    procids = [2, 1, 0]  # torch's rendezvous numbered them in reverse of the scheduler
    results: dict[int, tuple[int, tuple[tuple[str, int], ...]]] = {}

    def node(torch_rank: int) -> None:
        store = TCPStore(
            "127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=30)
        )
        mine = infra_key({"SLURM_PROCID": str(procids[torch_rank])}, torch_rank)
        results[torch_rank] = _align(store, torch_rank, 3, mine, f"node-{torch_rank}")

    threads = [threading.Thread(target=node, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert {r: rank for r, (rank, _) in results.items()} == {0: 2, 1: 1, 2: 0}
    # Every node knows every node (one signed result per round).
    listing = (("node-2", 0), ("node-1", 1), ("node-0", 2))
    assert all(nodes == listing for _, nodes in results.values())


def _server() -> TCPStore:
    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip


KEY = b"k" * 32


def test_a_forged_node_key_is_listed_as_a_stranger() -> None:
    server = _server()
    server.set("nvrx.launcher/infra_rank/1", '{"tier": 0, "index": "0; rm -rf", "node": "x"}')
    rank, nodes = _align(server, 0, 2, InfraKey(0, 4), "me")
    assert rank == 0
    # The node of rendezvous rank 1 will not find itself there: its round fails.
    assert nodes == (("me", 0), ("rendezvous-rank-1", 1))


def test_an_unsigned_node_key_is_refused_when_the_job_has_a_key() -> None:
    server = _server()
    forged = seal(None, "run", "nvrx.launcher/infra_rank/1", _published(InfraKey(0, 0), "x", None))
    server.set("nvrx.launcher/infra_rank/1", forged)
    rank, nodes = _align(server, 0, 2, InfraKey(0, 4), "me", key=KEY, run_id="run")
    assert (rank, nodes) == (0, (("me", 0), ("rendezvous-rank-1", 1)))


@pytest.mark.parametrize(
    ("result", "key"),
    [
        ('{"nodes": [["other", 0], ["me", 7]]}', None),  # outside a world of 2
        ('{"nodes": [["other", 1], ["me", 1]]}', None),  # a duplicate rank
        ('{"nodes": [["me", 0], ["other", 1]]}', None),  # this node not at its place
        ('{"nodes": [["other", 1], ["me", 0]]}', b"x" * 32),  # signed with another key
    ],
)
def test_a_bad_result_fails_the_round(
    result: str, key: bytes | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_group_rank, "_WAIT_S", 1.0)
    server = _server()
    server.set("nvrx.launcher/group_ranks", seal(key, "run", "nvrx.launcher/group_ranks", result))
    with pytest.raises(RendezvousError, match="no valid group ranks"):
        _align(server, 1, 2, InfraKey(0, 0), "me", key=KEY if key else None, run_id="run")


def test_a_signed_result_is_taken() -> None:
    server = _server()
    body = '{"nodes": [["other", 1], ["me", 0]]}'
    server.set("nvrx.launcher/group_ranks", seal(KEY, "run", "nvrx.launcher/group_ranks", body))
    rank, nodes = _align(server, 1, 2, InfraKey(0, 0), "me", key=KEY, run_id="run")
    assert (rank, nodes) == (0, (("me", 0), ("other", 1)))


def test_no_result_in_time_is_a_rendezvous_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_group_rank, "_WAIT_S", 0.5)
    with pytest.raises(RendezvousError):
        _align(_server(), 1, 2, InfraKey(0, 0), "me")


def test_scheduler_indices_are_ascii_digits_only() -> None:
    assert infra_key({"SLURM_PROCID": "\u00b2"}, 5) == InfraKey(2, 5)
    assert infra_key({"SLURM_PROCID": " 3 "}, 5) == InfraKey(0, 3)


def test_torch_rendezvous_gives_aligned_ranks_through_the_hook() -> None:
    """Contract with torch: next_rendezvous can be wrapped per handler, RendezvousInfo rebuilt."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters, registry

    from nvrx.launcher._group_rank import GroupRankAligner

    server = TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )
    handlers = []
    aligners = []
    for procid in (1, 0):
        params = RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{server.port}",
            run_id="contract",
            min_nodes=2,
            max_nodes=2,
            join_timeout="30",
            last_call_timeout="1",
        )
        handler = registry.get_rendezvous_handler(params)
        aligner = GroupRankAligner({"SLURM_PROCID": str(procid)}, f"node-{procid}")
        aligner.install(handler)
        handlers.append(handler)
        aligners.append(aligner)
    infos: dict[int, object] = {}

    def join(index: int) -> None:
        infos[index] = handlers[index].next_rendezvous()

    threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert sorted(infos) == [0, 1]
        got = {i: info.rank for i, info in infos.items()}  # type: ignore[attr-defined]
        assert got == {0: 1, 1: 0}  # SLURM_PROCID 1 and 0
        assert all(info.world_size == 2 for info in infos.values())  # type: ignore[attr-defined]
        addrs = {info.bootstrap_store_info.master_port for info in infos.values()}  # type: ignore[attr-defined]
        assert len(addrs) == 1  # both nodes' workers meet at torch's one store
        # The node of group rank 0 (SLURM_PROCID 0) knows the round; the other itself.
        assert aligners[1].nodes == (("node-0", 0), ("node-1", 1))
        assert aligners[0].nodes == aligners[1].nodes
    finally:
        for handler in handlers:
            handler.shutdown()


def test_no_alignment_when_the_workers_do_not_share_the_rendezvous_store(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: RANK 0's worker hosts the store on torch's rank 0."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters, registry

    from nvrx.launcher._group_rank import GroupRankAligner

    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    server = _server()
    handlers, aligners = [], []
    for procid in (1, 0):
        params = RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{server.port}",
            run_id="own-store",
            min_nodes=2,
            max_nodes=2,
            join_timeout="30",
            last_call_timeout="1",
        )
        handler = registry.get_rendezvous_handler(params)
        assert handler.use_agent_store is False
        aligner = GroupRankAligner({"SLURM_PROCID": str(procid)}, f"node-{procid}")
        aligner.install(handler)
        handlers.append(handler)
        aligners.append(aligner)
    infos: dict[int, object] = {}

    def join(index: int) -> None:
        infos[index] = handlers[index].next_rendezvous()

    threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
    with caplog.at_level("WARNING", logger="nvrx.launcher"):
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    try:
        assert sorted(infos) == [0, 1]
        assert sorted(info.rank for info in infos.values()) == [0, 1]  # type: ignore[attr-defined]
        assert [a.nodes for a in aligners] == [(), ()]  # no exchange took place
        assert "group ranks follow the rendezvous order" in caplog.text
    finally:
        for handler in handlers:
            handler.shutdown()
