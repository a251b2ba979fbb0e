"""Job-wide decisions through a real store, as two launchers would share it.

Each test runs on a TCPStore (the c10d rendezvous) and on a store that, like torch's
EtcdStore, has only set/get/add/check/wait: no compare-and-set.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import select
import threading
import time

import pytest
from torch._C._distributed_c10d import HashStore, PrefixStore, Store, TCPStore

from nvrx.launcher._coordination import (
    Action,
    Decision,
    JobCoordinator,
    JobState,
    StopCause,
)
from nvrx.launcher._job_key import load_job_key, sign
from nvrx.launcher._progress import check_progress_file, made_progress, read_progress
from nvrx.launcher.exit_codes import ExitCode

KEY = b"k" * 32


class EtcdLikeStore(Store):
    """The operations torch's EtcdStore implements, over a HashStore."""

    def __init__(self) -> None:
        super().__init__()
        self._inner = HashStore()

    def set(self, key: str, value: str) -> None:
        self._inner.set(key, value)

    def get(self, key: str) -> bytes:
        return self._inner.get(key)

    def add(self, key: str, num: int) -> int:
        return self._inner.add(key, num)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check(keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        if timeout is None:
            self._inner.wait(keys)
        else:
            self._inner.wait(keys, timeout)


@pytest.fixture(params=["tcp", "etcd-like"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "etcd-like":
        return EtcdLikeStore()
    return TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=10),
    )


def _own_client(store: Store) -> Store:
    """Another node's connection to the same store."""
    if isinstance(store, TCPStore):
        return TCPStore(
            "127.0.0.1", store.port, is_master=False, timeout=datetime.timedelta(seconds=10)
        )
    return store


def _restart(node: str) -> object:
    def make(state: JobState) -> Decision:
        return Decision(
            Action.RESTART,
            f"failure on {node}",
            node,
            JobState(state.cycle + 1, state.charged + 1, 0),
            charged=True,
        )

    return make


def test_first_claim_wins_and_everyone_sees_the_same_decision(store: Store) -> None:
    round_store = PrefixStore("torch.rendezvous.job.3", store)
    a = JobCoordinator(round_store, "job", "node-a")
    b = JobCoordinator(store, "job", "node-b")
    assert a.poll(0) is None
    won = a.decide(0, _restart("node-a"))  # type: ignore[arg-type]
    lost = b.decide(0, _restart("node-b"))  # type: ignore[arg-type]
    assert won == lost
    assert won.node == "node-a"
    assert b.poll(0) == won
    # The job state moved on once, however many nodes failed.
    assert a.state() == b.state() == JobState(cycle=1, charged=1, no_progress=0)
    assert b.poll(1) is None


def test_other_runs_do_not_interfere(store: Store) -> None:
    JobCoordinator(store, "run-1", "n").decide(0, _restart("n"))  # type: ignore[arg-type]
    assert JobCoordinator(store, "run-2", "n").poll(0) is None
    assert JobCoordinator(store, "run-2", "n").state() == JobState()


def test_exit_barrier_counts(store: Store) -> None:
    a = JobCoordinator(store, "job", "a")
    b = JobCoordinator(store, "job", "b")
    assert a.arrive(2) == 1
    assert b.arrived(2) == 1
    assert b.arrive(2) == 2
    a.leave(2, 2, wait=datetime.timedelta(seconds=1))
    b.leave(2, 2, wait=datetime.timedelta(seconds=1))


def test_decision_wire_format_round_trips_and_rejects_garbage() -> None:
    d = Decision(Action.STOP, "why", "n", JobState(2, 1, 1), StopCause.NO_PROGRESS)
    assert Decision.from_json(d.to_json().encode()) == d
    assert d.exit_code == ExitCode.NO_PROGRESS
    body = json.loads(d.to_json())
    bad_bodies = [
        {"action": "explode"},
        {**body, "exit_code": 0},  # the exit code is never read from the store
        {**body, "stop_cause": None},  # a stop without its cause
        {**body, "charged": 1},
        {**body, "state": {"cycle": -1, "charged": 0, "no_progress": 0}},
        {**body, "state": {"cycle": True, "charged": 0, "no_progress": 0}},
        {**body, "reason": "x" * 5000},
        {**body, "node": ["n"]},
    ]
    for bad in bad_bodies:
        with pytest.raises(ValueError, match="bad launcher decision"):
            Decision.from_json(json.dumps(bad).encode())
    for raw in [b"\x80not json", b"[" * 100_000, b"1e999999", b"{}" * 40_000]:
        with pytest.raises(ValueError, match="bad launcher decision"):
            Decision.from_json(raw)


def test_exit_code_follows_the_decision_kind() -> None:
    state = JobState(1, 1, 0)
    assert Decision(Action.SHUTDOWN, "r", "n", state).exit_code == ExitCode.WORKLOAD_SHUTDOWN
    stop = Decision(Action.STOP, "r", "n", state, StopCause.RESTARTS_EXHAUSTED)
    assert stop.exit_code == ExitCode.RESTARTS_EXHAUSTED
    with pytest.raises(ValueError, match="stop cause"):
        Decision(Action.STOP, "r", "n", state)
    with pytest.raises(ValueError, match="stop cause"):
        Decision(Action.RESTART, "r", "n", state, StopCause.NO_PROGRESS)


def _envelope(body: str, mac: str | None) -> str:
    return json.dumps({"v": 1, "body": body, "mac": mac})


def _stop_body(cycle: int) -> str:
    return Decision(
        Action.STOP, "forged", "evil", JobState(cycle, 0, 0), StopCause.RESTARTS_EXHAUSTED
    ).to_json()


@pytest.mark.parametrize("key", [None, KEY], ids=["no-key", "key"])
def test_malformed_values_are_ignored_and_reported(store: Store, key: bytes | None) -> None:
    rejected: list[tuple[str, str]] = []
    coord = JobCoordinator(
        store, "job", "a", key=key, on_reject=lambda k, why: rejected.append((k, why))
    )
    raw = PrefixStore("nvrx.launcher.job", store)
    for value in ["not json", "[[[[", _envelope("{}", None), '{"v": 2, "body": "", "mac": null}']:
        raw.set("cycle/0/decision", value)
        assert coord.poll(0) is None
    raw.set("state", "\x00garbage")
    assert coord.state() == JobState()
    assert len(rejected) == 5
    assert {k for k, _ in rejected} == {
        "nvrx.launcher.job/cycle/0/decision",
        "nvrx.launcher.job/state",
    }
    # Each bad value is reported once, however often it is polled.
    assert coord.poll(0) is None
    assert len(rejected) == 5


def test_with_a_key_unsigned_forged_and_replayed_values_do_not_count(store: Store) -> None:
    a = JobCoordinator(store, "job", "a", key=KEY)
    raw = PrefixStore("nvrx.launcher.job", store)
    # Unsigned, and signed with another key.
    raw.set("cycle/0/decision", _envelope(_stop_body(0), None))
    assert a.poll(0) is None
    context = "nvrx.launcher/v1/job/cycle/0/decision"
    raw.set(
        "cycle/0/decision",
        _envelope(_stop_body(0), sign(b"x" * 32, context, _stop_body(0).encode())),
    )
    assert a.poll(0) is None
    # A genuine decision of cycle 0 ...
    won = a.decide(0, _restart("a"))  # type: ignore[arg-type]
    assert a.poll(0) == won
    genuine = raw.get("cycle/0/decision").decode()
    # ... replayed as the decision of another cycle, or of another run, does not verify.
    raw.set("cycle/1/decision", genuine)
    assert a.poll(1) is None
    other = JobCoordinator(store, "job2", "a", key=KEY)
    PrefixStore("nvrx.launcher.job2", store).set("cycle/0/decision", genuine)
    assert other.poll(0) is None
    # A node without the key cannot publish for one with it, and vice versa it still reads.
    assert JobCoordinator(store, "job", "b").poll(0) == won


def test_state_follows_decisions_past_an_old_or_forged_hint(store: Store) -> None:
    a = JobCoordinator(store, "job", "a", key=KEY)
    a.decide(0, _restart("a"))  # type: ignore[arg-type]
    first_hint = PrefixStore("nvrx.launcher.job", store).get("state").decode()
    a.decide(1, _restart("a"))  # type: ignore[arg-type]
    assert a.state() == JobState(2, 2, 0)
    raw = PrefixStore("nvrx.launcher.job", store)
    raw.set("state", first_hint)  # replay of an older, genuine state
    assert a.state() == JobState(2, 2, 0)
    forged = json.dumps({"cycle": 0, "charged": 0, "no_progress": 0})
    raw.set("state", _envelope(forged, "00" * 32))
    assert a.state() == JobState(2, 2, 0)


def test_a_waiting_node_skips_a_forged_decision_for_the_real_one(store: Store) -> None:
    if isinstance(store, TCPStore):
        peer: Store = TCPStore("127.0.0.1", store.port, is_master=False)
    else:
        peer = store
    a = JobCoordinator(store, "job", "a", key=KEY)
    b = JobCoordinator(peer, "job", "b", key=KEY)
    raw = PrefixStore("nvrx.launcher.job", peer)
    assert raw.add("cycle/0/claim", 1) == 1  # a claims cycle 0 (here: by hand)
    raw.set("cycle/0/decision", _envelope(_stop_body(0), None))
    result: list[Decision] = []
    waiter = threading.Thread(target=lambda: result.append(a.decide(0, _restart("a"))))  # type: ignore[arg-type]
    waiter.start()
    time.sleep(0.3)
    assert not result  # the forged stop was not taken
    b._publish(
        "cycle/0/decision",
        Decision(Action.RESTART, "r", "b", JobState(1, 1, 0), charged=True).to_json(),
    )
    waiter.join(10)
    assert [(d.node, d.action) for d in result] == [("b", Action.RESTART)]


def test_job_key_from_env_and_file(tmp_path: pathlib.Path) -> None:
    assert load_job_key({}) is None
    assert load_job_key({"NVRX_JOB_KEY": " " + "s" * 20 + "\n"}) == b"s" * 20
    with pytest.raises(ValueError, match="at least 16 bytes"):
        load_job_key({"NVRX_JOB_KEY": "short"})
    path = tmp_path / "key"
    path.write_bytes(b"f" * 32 + b"\n")
    path.chmod(0o640)
    with pytest.raises(ValueError, match="owner-only"):
        load_job_key({"NVRX_JOB_KEY_FILE": str(path)})
    path.chmod(0o600)
    assert load_job_key({"NVRX_JOB_KEY_FILE": str(path)}) == b"f" * 32
    with pytest.raises(ValueError, match="not both"):
        load_job_key({"NVRX_JOB_KEY_FILE": str(path), "NVRX_JOB_KEY": "s" * 20})
    with pytest.raises(ValueError, match="cannot open"):
        load_job_key({"NVRX_JOB_KEY_FILE": str(tmp_path / "missing")})
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(ValueError, match="cannot open"):
        load_job_key({"NVRX_JOB_KEY_FILE": str(link)})
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ValueError, match="not a regular file"):
        load_job_key({"NVRX_JOB_KEY_FILE": str(fifo)})


def test_progress_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "progress"
    assert read_progress(path) is None
    assert read_progress(None) is None
    path.write_text("garbage")
    assert read_progress(path) is None
    path.write_text("120\n")
    assert read_progress(path) == 120
    assert made_progress(None, 120, 1)
    assert made_progress(100, 120, 20)
    assert not made_progress(100, 119, 20)
    assert not made_progress(120, None, 1)
    assert not made_progress(None, None, 1)


@pytest.mark.timeout(10)
def test_progress_fifo_is_refused_and_never_blocks(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "progress.fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ValueError, match="not a regular file"):
        check_progress_file(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        check_progress_file(tmp_path)
    check_progress_file(tmp_path / "missing")  # the training creates it later
    assert read_progress(fifo) is None  # returns at once, no writer needed


def test_a_forged_claim_or_a_dead_claimer_does_not_end_the_job() -> None:
    """Someone without the key bumps the claim (or the claimer dies before publishing):
    the waiters each publish a signed decision with compare-and-set, the first stays, and
    every node follows that one."""
    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(10)
    )
    peer = TCPStore("127.0.0.1", store.port, is_master=False)
    raw = PrefixStore("nvrx.launcher.job", TCPStore("127.0.0.1", store.port, is_master=False))
    assert raw.add("cycle/0/claim", 1) == 1  # the forger (no key needed)
    raw.set("cycle/0/decision", _envelope(_stop_body(0), None))  # and an unsigned stop
    a = JobCoordinator(store, "job", "a", key=KEY)
    b = JobCoordinator(peer, "job", "b", key=KEY)
    results: dict[str, Decision] = {}
    wait = datetime.timedelta(seconds=0.5)

    def follow(coordinator: JobCoordinator) -> None:
        make = _restart(coordinator.node)
        results[coordinator.node] = coordinator.decide(0, make, wait)  # type: ignore[arg-type]

    threads = [threading.Thread(target=follow, args=(c,)) for c in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert set(results) == {"a", "b"}, "a waiter ended with an error"
    assert results["a"] == results["b"]
    assert results["a"].action is Action.RESTART
    assert results["a"].node in ("a", "b")
    assert JobCoordinator(store, "job", "c", key=KEY).poll(0) == results["a"]
    assert a.state() == JobState(1, 1, 0)
    # A claimer that comes back late and publishes keeps the decision in force.
    late = a._publish_decision(0, Decision(Action.RESTART, "late", "z", JobState(1, 1, 0)))
    assert late == results["a"]


@pytest.mark.timeout(30)
def test_a_waiter_that_decides_after_another_waiter_follows_that_decision() -> None:
    """Two waiters' waits run out together and one publishes its decision (and the state
    after it) before the other reads the state: the other follows that decision instead
    of deciding the next cycle (it used to raise AssertionError: CI saw it once)."""
    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(10)
    )
    a = JobCoordinator(store, "job", "a", key=KEY)
    b = JobCoordinator(store, "job", "b", key=KEY)
    first = a._decide_here(0, _restart("a"), claimed=False)  # type: ignore[arg-type]
    assert a.state() == JobState(1, 1, 0)
    assert b._decide_here(0, _restart("b"), claimed=False) == first  # type: ignore[arg-type]
    assert b._decide_here(0, _restart("b"), claimed=True) == first  # type: ignore[arg-type]
    assert b.state() == JobState(1, 1, 0)


def test_without_compare_and_set_a_forged_claim_still_times_out() -> None:
    """The etcd-like store has no compare-and-set: the waiter cannot publish safely."""
    store = EtcdLikeStore()
    PrefixStore("nvrx.launcher.job", store).add("cycle/0/claim", 1)
    a = JobCoordinator(store, "job", "a", key=KEY)
    with pytest.raises(TimeoutError, match="no compare-and-set"):
        a.decide(0, _restart("a"), datetime.timedelta(seconds=0.3))  # type: ignore[arg-type]
    # A claimer (first to add) still publishes with a plain set.
    other = JobCoordinator(store, "job2", "a", key=KEY)
    won = other.decide(0, _restart("a"))  # type: ignore[arg-type]
    assert other.poll(0) == won


class CountingStore(Store):
    """A real TCPStore client that counts the calls made through it (and its clones)."""

    def __init__(self, port: int, calls: list[str], *, clonable: bool = True) -> None:
        super().__init__()
        self._port, self._calls, self._clonable = port, calls, clonable
        self._inner = TCPStore("127.0.0.1", port, is_master=False)

    def set(self, key: str, value: str) -> None:
        self._calls.append("set")
        self._inner.set(key, value)

    def get(self, key: str) -> bytes:
        self._calls.append("get")
        return self._inner.get(key)

    def add(self, key: str, num: int) -> int:
        self._calls.append("add")
        return self._inner.add(key, num)

    def check(self, keys: list[str]) -> bool:
        self._calls.append("check")
        return self._inner.check(keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._calls.append("wait")
        self._inner.wait(keys, timeout or datetime.timedelta(seconds=30))

    def clone(self) -> Store:
        if not self._clonable:
            raise NotImplementedError("no clone here")
        return CountingStore(self._port, self._calls)


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nvrx-decision-watch"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("clonable", [True, False], ids=["watcher", "no-clone"])
def test_an_idle_job_makes_almost_no_store_calls(clonable: bool) -> None:
    """The agent asks for the decision at every tick (here every 10 ms for 1 s): with a
    watcher that costs one blocked wait in all; without clone one read per second."""
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(10)
    )
    calls: list[str] = []
    coord = JobCoordinator(CountingStore(server.port, calls, clonable=clonable), "job", "a")
    try:
        deadline = time.monotonic() + 1.0
        ticks = 0
        while time.monotonic() < deadline:
            assert coord.decided(0) is None
            ticks += 1
            time.sleep(0.01)
        assert ticks > 20
        if clonable:
            assert calls == ["wait"]
        else:
            assert 1 <= calls.count("check") <= 2
            assert "wait" not in calls
        calls.clear()
        # Another node decides: this one sees it and verifies it, then stops reading.
        won = JobCoordinator(server, "job", "b").decide(0, _restart("b"))  # type: ignore[arg-type]
        deadline = time.monotonic() + 5.0
        seen = coord.decided(0)
        while seen is None and time.monotonic() < deadline:
            time.sleep(0.01)
            seen = coord.decided(0)
        assert seen == won
        assert calls.count("get") == 1
        for _ in range(10):
            assert coord.decided(0) == won
        assert calls.count("get") == 1
        # The next cycle is watched afresh, still without reads while nothing is there.
        calls.clear()
        for _ in range(10):
            assert coord.decided(1) is None
        time.sleep(0.2)
        assert calls == (["wait"] if clonable else ["check"])
    finally:
        coord.close()


@pytest.mark.timeout(60)
def test_the_watcher_ends_with_close_and_a_forged_value_is_not_taken() -> None:
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(10)
    )
    before = len(_watchers())
    rejected: list[str] = []
    coord = JobCoordinator(server, "job", "a", key=KEY, on_reject=lambda k, _: rejected.append(k))
    raw = PrefixStore("nvrx.launcher.job", TCPStore("127.0.0.1", server.port, is_master=False))
    raw.set("cycle/0/decision", _envelope(_stop_body(0), None))  # unsigned: ignored
    deadline = time.monotonic() + 5.0
    while not rejected and time.monotonic() < deadline:
        assert coord.decided(0) is None
        time.sleep(0.01)
    assert rejected == ["nvrx.launcher.job/cycle/0/decision"]
    # The genuine one replaces it (compare-and-set) and is followed within a re-read.
    b = JobCoordinator(server, "job", "b", key=KEY)
    genuine = b._publish_decision(0, Decision(Action.RESTART, "r", "b", JobState(1, 1, 0)))
    assert genuine is not None
    deadline = time.monotonic() + 5.0
    while coord.decided(0) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert coord.decided(0) == genuine
    assert len(_watchers()) == before + 1
    coord.close()
    assert len(_watchers()) == before


@pytest.mark.timeout(60)
def test_the_watcher_wakes_a_select_when_the_decision_comes() -> None:
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(10)
    )
    coord = JobCoordinator(server, "job", "a")
    try:
        fd = coord.fileno()
        assert fd is not None
        assert coord.decided(0) is None
        assert select.select([fd], [], [], 0.3)[0] == []  # nothing yet: select sleeps
        won = JobCoordinator(server, "job", "b").decide(0, _restart("b"))  # type: ignore[arg-type]
        assert select.select([fd], [], [], 10.0)[0] == [fd]
        assert coord.decided(0) == won
        # Read: quiet again, so a select loop does not spin.
        assert select.select([fd], [], [], 0.2)[0] == []
        assert coord.decided(1) is None
        assert select.select([fd], [], [], 0.2)[0] == []
    finally:
        coord.close()
    assert JobCoordinator(EtcdLikeStore(), "job", "a").fileno() is None


def test_a_timeline_counted_before_it_is_written_is_still_read(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node takes its index (the counter) and writes its timeline after: the summary
    writer, seeing the count complete, waits for the value instead of missing it."""
    from nvrx.launcher import _coordination

    monkeypatch.setattr(_coordination, "_TIMELINE_WRITE_S", 30.0)  # a loaded machine's 0.5 s
    writer = JobCoordinator(store, "job", "a")
    # Node b has its own connection, as another launcher does: one TCPStore client
    # serves one call at a time, so b's write would queue behind a's wait.
    late = JobCoordinator(_own_client(store), "job", "b")
    writer.publish_timeline(3, '{"node": "a"}')
    prefixed = PrefixStore("nvrx.launcher.job", store)
    assert prefixed.add("cycle/3/timelines", 1) == 2  # b's index, as publish_timeline takes it
    body = '{"node": "b"}'

    def write_late() -> None:
        time.sleep(0.5)
        late._publish("cycle/3/timeline/2", body)

    thread = threading.Thread(target=write_late, daemon=True)
    thread.start()
    try:
        got = writer.timelines(3, 2, 0.1, json.loads)  # the count is there at once
    finally:
        thread.join(10)
    assert sorted(t["node"] for t in got) == ["a", "b"]
