"""Job-wide decisions through a real store, as two launchers would share it.

Each test runs on a TCPStore (the c10d rendezvous) and on a store that, like torch's
EtcdStore, has only set/get/add/check/wait: no compare-and-set.
"""

from __future__ import annotations

import datetime
import pathlib

import pytest
from torch._C._distributed_c10d import HashStore, PrefixStore, Store, TCPStore

from nvrx.launcher.coordination import Action, Decision, JobCoordinator, JobState
from nvrx.launcher.progress import made_progress, read_progress


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
    d = Decision(Action.STOP, "why", "n", JobState(2, 1, 1), exit_code=93, charged=False)
    assert Decision.from_json(d.to_json().encode()) == d
    with pytest.raises(ValueError, match="bad launcher decision"):
        Decision.from_json(b'{"action": "explode"}')
    with pytest.raises(ValueError, match="bad launcher decision"):
        Decision.from_json(b"\x80not json")


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
