"""Standby nodes' group ranks: nodes that stay keep theirs, a standby takes the departed's.

Pure rules (:func:`stable_ranks`, :func:`replacements`) case by case, and the same
through the store exchange that every node runs after a round (real TCPStore, one
thread per node).
"""

from __future__ import annotations

import datetime
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch._C._distributed_c10d import TCPStore

from nvrx.launcher._group_rank import _align, replacements, stable_ranks
from nvrx.launcher._scheduler_order import InfraKey

pytestmark = pytest.mark.timeout(60)


def _keys(n: int) -> list[InfraKey]:
    return [InfraKey(2, r) for r in range(n)]


def test_nodes_that_stay_keep_their_rank_and_the_standby_takes_the_free_one() -> None:
    # Round before: a=0, b=1. b died; torch numbered the new round (standby s, a).
    assert stable_ranks(_keys(2), [None, 0]) == [1, 0]
    assert stable_ranks(_keys(2), [None, 1]) == [0, 1]


def test_without_previous_ranks_it_is_the_aligned_order() -> None:
    keys = [InfraKey(0, 5), InfraKey(0, 3), InfraKey(0, 4)]
    assert stable_ranks(keys, [None, None, None]) == [2, 0, 1]


def test_a_duplicate_or_out_of_range_previous_rank_is_treated_as_new() -> None:
    # Both claim 0: the first in key order keeps it; 7 does not fit a world of 3.
    assert stable_ranks(_keys(3), [0, 0, 7]) == [0, 1, 2]


@given(st.lists(st.one_of(st.none(), st.integers(0, 20)), min_size=1, max_size=12))
def test_always_a_permutation(previous: list[int | None]) -> None:
    ranks = stable_ranks(_keys(len(previous)), previous)
    assert sorted(ranks) == list(range(len(previous)))


def test_replacements_name_who_took_whose_place() -> None:
    before = [("a", 0), ("b", 1), ("c", 2)]
    after = [("a", 0), ("s", 1), ("c", 2)]
    assert replacements(before, after) == [(1, "b", "s")]
    assert replacements(before, before) == []
    # A node that moved is no replacement (it is still in the job).
    assert replacements([("a", 0), ("b", 1)], [("b", 0), ("a", 1)]) == []


def test_the_store_exchange_keeps_ranks_and_lists_every_node_everywhere() -> None:
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    # torch rank 0 is the standby (new), torch rank 1 was group rank 0 before.
    previous = [None, 0]
    names = ["standby", "stayed"]
    results: dict[int, tuple[int, tuple[tuple[str, int], ...]]] = {}

    def node(torch_rank: int) -> None:
        store = TCPStore(
            "127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=30)
        )
        results[torch_rank] = _align(
            store,
            torch_rank,
            2,
            InfraKey(2, torch_rank),
            names[torch_rank],
            previous[torch_rank],
            stable=True,
        )

    threads = [threading.Thread(target=node, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    listing = (("stayed", 0), ("standby", 1))
    assert results == {0: (1, listing), 1: (0, listing)}
