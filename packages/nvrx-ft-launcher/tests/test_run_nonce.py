"""The run nonce binds signed store values to one run of a job (issue 26, item 4).

Real stores: a TCPStore (the c10d rendezvous) and one with only etcd's operations.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Callable, Iterator

import pytest
from test_coordination import EtcdLikeStore, _restart  # type: ignore[import-not-found]
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from nvrx.launcher import _nonce_liveness, _run_nonce
from nvrx.launcher._coordination import Action, JobCoordinator, JobState
from nvrx.launcher._group_rank import _align, _published
from nvrx.launcher._run_nonce import (
    NonceKeeper,
    run_nonce,
    scheduler_attempt,
    signed_run,
    stop_answering,
)
from nvrx.launcher._scheduler_order import InfraKey
from nvrx.launcher._signed_store import seal

KEY = b"k" * 32


def _tcp() -> TCPStore:
    return TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=10),
    )


@pytest.fixture(params=["tcp", "etcd-like"])
def store(request: pytest.FixtureRequest) -> Store:
    return EtcdLikeStore() if request.param == "etcd-like" else _tcp()


@pytest.fixture
def keepers() -> Iterator[Callable[[], NonceKeeper]]:
    """Launchers' nonce keepers (one per simulated launcher), each closed after the test."""
    made: list[NonceKeeper] = []

    def make() -> NonceKeeper:
        made.append(NonceKeeper(window=30.0))
        return made[-1]

    yield make
    for keeper in made:
        keeper.close()


@pytest.mark.timeout(60)
def test_the_first_launcher_creates_the_nonce_and_the_others_read_it(
    store: Store, keepers: Callable[[], NonceKeeper]
) -> None:
    first = run_nonce(PrefixStore("torch.rendezvous.job.0", store), KEY, "job", 0)
    assert first is not None
    assert len(first) == 32
    # The same launcher again (another of its parts): no store operation, same nonce.
    assert run_nonce(store, KEY, "job", 0) == first
    # Another launcher of the run: asks, the first answers, it takes the same nonce.
    assert keepers().nonce(store, KEY, "job", 0) == first
    # Another attempt (a requeue the scheduler counted), another run id: another nonce.
    assert run_nonce(store, KEY, "job", 1) not in (None, first)
    assert run_nonce(store, KEY, "job2", 0) not in (None, first)


def test_without_a_key_there_is_no_nonce_and_no_store_write() -> None:
    store = _tcp()
    before = store.num_keys()
    assert run_nonce(store, None, "job", 0) is None
    assert store.num_keys() == before
    assert signed_run("job", None) == "job"


@pytest.mark.timeout(60)
def test_an_invalid_record_is_replaced_and_logged(
    store: Store, keepers: Callable[[], NonceKeeper], caplog: pytest.LogCaptureFixture
) -> None:
    name = "nvrx.launcher.job/run_nonce/0"
    forged = json.dumps({"v": 1, "body": "0" * 32, "mac": "00" * 32})
    for value in ("garbage", forged):
        store.set(name, value)
        with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
            nonce = keepers().nonce(store, KEY, "job", 0)
        assert nonce not in (None, "0" * 32)
        assert "replacing the run nonce record" in caplog.text
        assert f"ignoring the value under {name} in the rendezvous store" in caplog.text
        assert keepers().nonce(store, KEY, "job", 0) == nonce  # the valid one stays
        caplog.clear()


@pytest.mark.timeout(60)
def test_with_another_key_the_record_does_not_verify(
    keepers: Callable[[], NonceKeeper],
) -> None:
    store = _tcp()
    keepers().nonce(store, b"x" * 32, "job", 0)
    theirs = store.get("nvrx.launcher.job/run_nonce/0")
    mine = keepers().nonce(store, KEY, "job", 0)
    assert store.get("nvrx.launcher.job/run_nonce/0") != theirs
    assert keepers().nonce(store, KEY, "job", 0) == mine


@pytest.mark.timeout(60)
def test_without_compare_and_set_a_claim_never_written_is_an_error(
    monkeypatch: pytest.MonkeyPatch, keepers: Callable[[], NonceKeeper]
) -> None:
    monkeypatch.setattr(_run_nonce, "_CLAIM_WAIT", datetime.timedelta(seconds=0.5))
    store = EtcdLikeStore()
    store.add("nvrx.launcher.job/run_nonce/0/claim", 1)  # someone claimed, wrote nothing
    with pytest.raises(RuntimeError, match=r"claimed .* but not written"):
        keepers().nonce(store, KEY, "job", 0)


def test_scheduler_attempt_is_slurm_restart_cnt() -> None:
    assert scheduler_attempt({}) == 0
    assert scheduler_attempt({"SLURM_RESTART_CNT": "3"}) == 3


def _copy_decisions(old: Store, new: Store) -> None:
    for name in ("nvrx.launcher.job/cycle/0/decision", "nvrx.launcher.job/state"):
        new.set(name, old.get(name).decode())


def test_a_decision_of_an_earlier_run_is_refused_on_a_new_store() -> None:
    """Requeue whose store is new (the c10d store hosted by a launcher): a copy replayed."""
    old = _tcp()
    earlier = JobCoordinator(old, "job", "a", key=KEY, attempt=0)
    won = earlier.decide(0, _restart("a"))
    assert won.action is Action.RESTART
    new = _tcp()
    rejected: list[tuple[str, str]] = []
    later = JobCoordinator(
        new, "job", "a", key=KEY, attempt=0, on_reject=lambda k, w: rejected.append((k, w))
    )
    _copy_decisions(old, new)
    assert later.state() == JobState()
    assert later.poll(0) is None
    assert later.decided(0) is None
    keys = [k for k, _ in rejected]
    # Logged (and journalled through on_reject) once per value, however often read.
    assert sorted(keys) == ["nvrx.launcher.job/cycle/0/decision", "nvrx.launcher.job/state"]
    assert all("earlier run" in why for _, why in rejected)


@pytest.mark.timeout(60)
def test_a_decision_of_an_earlier_run_is_refused_on_a_reused_store(store: Store) -> None:
    """Requeue on a store that outlived the run (etcd): the scheduler's attempt moved on."""
    earlier = JobCoordinator(store, "job", "a", key=KEY, attempt=0)
    earlier.decide(0, _restart("a"))
    rejected: list[str] = []
    later = JobCoordinator(
        store, "job", "a", key=KEY, attempt=1, on_reject=lambda k, w: rejected.append(k)
    )
    assert later.state() == JobState()
    assert later.poll(0) is None
    assert "nvrx.launcher.job/cycle/0/decision" in rejected
    # Another launcher of the same (earlier) run still reads it: the nonce is per run.
    again = JobCoordinator(store, "job", "b", key=KEY, attempt=0)
    assert again.poll(0) is not None


@pytest.mark.timeout(60)
def test_a_decision_of_an_earlier_run_is_refused_on_a_reused_store_same_attempt(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No scheduler attempt (Kubernetes restarts the job): the earlier run does not answer."""
    monkeypatch.setattr(_nonce_liveness, "ANSWER_WINDOW_S", 1.0)
    earlier = JobCoordinator(store, "job", "a", key=KEY, attempt=0)
    earlier.decide(0, _restart("a"))
    stop_answering()  # the earlier run's launchers are gone
    rejected: list[str] = []
    later = JobCoordinator(
        store, "job", "a", key=KEY, attempt=0, on_reject=lambda k, w: rejected.append(k)
    )
    assert later.state() == JobState()
    assert later.poll(0) is None
    assert "nvrx.launcher.job/cycle/0/decision" in rejected


def test_group_ranks_of_an_earlier_run_do_not_verify() -> None:
    store = _tcp()
    old_run = signed_run("run", "1" * 32)
    new_run = signed_run("run", "2" * 32)
    name = "nvrx.launcher/infra_rank/1"
    store.set(name, seal(KEY, old_run, name, _published(InfraKey(0, 0), "x", None)))
    rank, nodes = _align(store, 0, 2, InfraKey(0, 4), "me", key=KEY, run_id=new_run)
    # The replayed key was ignored: the placeholder, not node "x", holds rendezvous rank 1.
    assert "x" not in [n for n, _ in nodes]
    assert rank == 0
