"""A run nonce record is adopted only while a launcher of its run answers (issue 26, item 4).

A store that outlives a run (etcd, an external TCPStore) keeps the run's nonce record;
when the scheduler's attempt does not change, the next run must not take it. Real stores:
a TCPStore (one client per simulated launcher, as on separate nodes) and one with only
etcd's operations; the store server of the error test runs in a process of its own.
"""

from __future__ import annotations

import datetime
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from test_coordination import EtcdLikeStore  # type: ignore[import-not-found]
from torch._C._distributed_c10d import Store, TCPStore

from nvrx.launcher import _nonce_liveness
from nvrx.launcher._run_nonce import NonceKeeper, signed_run
from nvrx.launcher._signed_store import Rejections, SignedStore, seal

KEY = b"k" * 32
RECORD = "nvrx.launcher.job/run_nonce/0"
COUNTER = f"{RECORD}/challenges"
_TIMEOUT = datetime.timedelta(seconds=10)

Keepers = Callable[..., NonceKeeper]
Client = Callable[[], Store]


@pytest.fixture
def keepers() -> Iterator[Keepers]:
    """One nonce keeper per simulated launcher, each closed after the test."""
    made: list[NonceKeeper] = []

    def make(window: float = 30.0) -> NonceKeeper:
        made.append(NonceKeeper(window=window))
        return made[-1]

    yield make
    for keeper in made:
        keeper.close()


@pytest.fixture(params=["tcp", "etcd-like"])
def client(request: pytest.FixtureRequest) -> Client:
    """Another launcher's connection to one store (etcd-like: the same Python store)."""
    if request.param == "etcd-like":
        shared = EtcdLikeStore()
        return lambda: shared
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=_TIMEOUT)

    def connect() -> Store:
        return TCPStore("127.0.0.1", server.port, is_master=False, timeout=_TIMEOUT)

    connect.server = server  # type: ignore[attr-defined] # keep it alive with the fixture
    return connect


def _challenges(store: Store) -> int:
    return int(store.add(COUNTER, 0))


def _answerers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nvrx-nonce-answer"]


@pytest.mark.timeout(60)
def test_a_fresh_store_creates_the_nonce_without_asking(client: Client, keepers: Keepers) -> None:
    store = client()
    # A window of an hour: returning at all shows nothing waited for an answer.
    nonce = keepers(window=3600.0).nonce(store, KEY, "job", 0)
    assert nonce is not None
    assert _challenges(store) == 0
    assert len(_answerers()) == 1


@pytest.mark.timeout(60)
def test_a_launcher_joining_a_live_run_adopts_its_nonce_while_it_is_blocked(
    client: Client, keepers: Keepers
) -> None:
    first_store = client()
    first = keepers().nonce(first_store, KEY, "job", 0)
    time.sleep(_nonce_liveness.BURST_S + 0.5)  # past the creator's fast start: polls at 1 s
    # The live launcher's own connection is blocked in a long wait (as in torch's
    # rendezvous): its answering thread has a connection of its own.
    blocked = threading.Thread(
        target=lambda: _quietly(first_store.wait, ["never"], datetime.timedelta(seconds=20)),
        daemon=True,
    )
    blocked.start()
    time.sleep(0.2)
    joiner = client()
    started = time.monotonic()
    # A window of 30 s: an answer came, or the joiner would have replaced the record.
    assert keepers(window=30.0).nonce(joiner, KEY, "job", 0) == first
    took = time.monotonic() - started
    assert blocked.is_alive()  # still blocked: it did not answer
    assert _challenges(joiner) == 1
    print(f"joined a live run in {took:.2f} s")  # the figure, for the report


def _quietly(call: Callable[..., object], *args: object) -> None:
    try:
        call(*args)
    except Exception:  # the wait's timeout, or the store closed at the test's end
        return


@pytest.mark.timeout(60)
def test_a_dead_runs_record_is_replaced_and_its_values_refused(
    client: Client, keepers: Keepers, caplog: pytest.LogCaptureFixture
) -> None:
    old_launcher = keepers()
    old = old_launcher.nonce(client(), KEY, "job", 0)
    assert old is not None
    old_run = SignedStore(client(), KEY, signed_run("job", old))
    old_run.set("nvrx.launcher.job/cycle/0/decision", '{"action": "restart"}')
    old_launcher.close()  # the earlier run is over; its record stays in the store
    assert not _answerers()

    store = client()
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        new = keepers(window=1.0).nonce(store, KEY, "job", 0)
    assert new not in (None, old)
    assert "answered within 1 s: that run is over" in caplog.text
    rejected: list[tuple[str, str]] = []
    new_run = SignedStore(
        store,
        KEY,
        signed_run("job", new),
        rejections=Rejections(lambda k, w: rejected.append((k, w))),
    )
    assert new_run.read("nvrx.launcher.job/cycle/0/decision", str) is None
    assert [k for k, _ in rejected] == ["nvrx.launcher.job/cycle/0/decision"]
    # The next launcher of the new run adopts the new nonce (its creator answers).
    assert keepers(window=30.0).nonce(client(), KEY, "job", 0) == new


@pytest.mark.timeout(60)
def test_a_replayed_answer_is_refused_and_logged(
    client: Client, keepers: Keepers, caplog: pytest.LogCaptureFixture
) -> None:
    old_launcher, joiner = keepers(), keepers()
    old = old_launcher.nonce(client(), KEY, "job", 0)
    assert old is not None
    assert joiner.nonce(client(), KEY, "job", 0) == old  # challenge 1, answered
    store = client()
    recorded = store.get(f"{RECORD}/answer/1")
    old_launcher.close()  # the run is over: nobody answers any more
    joiner.close()
    assert not _answerers()
    # Someone who kept that answer copies it into the next challenge's slot.
    store.set(f"{RECORD}/answer/2", recorded.decode())
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        new = keepers(window=1.0).nonce(store, KEY, "job", 0)
    assert new not in (None, old)
    text = caplog.text
    assert f"ignoring the value under {RECORD}/answer/2" in text
    assert "not signed with this job's key" in text
    assert (
        text.count(f"ignoring the value under {RECORD}/answer/2") == 1
    )  # once, however often read


@pytest.mark.timeout(60)
def test_an_answer_to_another_token_is_refused(
    client: Client, keepers: Keepers, caplog: pytest.LogCaptureFixture
) -> None:
    old_launcher = keepers()
    old = old_launcher.nonce(client(), KEY, "job", 0)
    assert old is not None
    old_launcher.close()
    store = client()
    # Signed for the run and the slot, but for a token nobody asked now (a store whose
    # counter started again holds an earlier run's answer under the same number).
    store.set(
        f"{RECORD}/answer/1", seal(KEY, signed_run("job", old), "run_nonce/0/answer/1", "f" * 32)
    )
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        new = keepers(window=1.0).nonce(store, KEY, "job", 0)
    assert new not in (None, old)
    assert "an answer to another challenge (replayed)" in caplog.text


@pytest.mark.timeout(60)
def test_two_newcomers_after_a_dead_run_agree_on_one_new_nonce(
    client: Client, keepers: Keepers
) -> None:
    old_launcher = keepers()
    old = old_launcher.nonce(client(), KEY, "job", 0)
    old_launcher.close()
    got: list[str | None] = [None, None]
    go = threading.Barrier(2)
    stores = [client(), client()]
    newcomers = [keepers(window=1.0), keepers(window=1.0)]

    def newcomer(i: int) -> None:
        go.wait()
        got[i] = newcomers[i].nonce(stores[i], KEY, "job", 0)

    threads = [threading.Thread(target=newcomer, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got[0] is not None
    assert got[0] == got[1] != old


@pytest.mark.timeout(60)
def test_the_answering_thread_ends_when_stopped(client: Client, keepers: Keepers) -> None:
    keeper = keepers()
    keeper.nonce(client(), KEY, "job", 0)
    assert len(_answerers()) == 1
    keeper.close()
    assert not _answerers()


_SERVER = """
import datetime, sys, time
from torch._C._distributed_c10d import TCPStore
s = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
             timeout=datetime.timedelta(seconds=10))
print(s.port, flush=True)
time.sleep(120)
"""


@pytest.mark.timeout(90)
def test_a_store_error_is_logged_once_and_never_raised(
    keepers: Keepers, caplog: pytest.LogCaptureFixture
) -> None:
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=_TIMEOUT)
        keeper = keepers()
        with caplog.at_level(logging.INFO, logger="nvrx.launcher"):
            assert keeper.nonce(store, KEY, "job", 0) is not None
            server.kill()
            server.wait(10)
            time.sleep(_nonce_liveness.BURST_S + 3 * _nonce_liveness.POLL_S)
            assert len(_answerers()) == 1  # still there, still trying
        said = [r for r in caplog.records if "cannot answer the run nonce" in r.getMessage()]
        assert len(said) == 1, caplog.text
        keeper.close()
        assert not _answerers()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
