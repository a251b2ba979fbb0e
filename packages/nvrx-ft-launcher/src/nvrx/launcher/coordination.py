"""Job-wide decisions shared by every node's launcher through the rendezvous store.

One decision per cycle (the span between two (re)starts of the workers): the first
launcher that sees a reason to restart or stop claims the cycle with an atomic ``add``
(the one that takes the counter to 1 wins; every torch store has ``add``, while etcd's
has no compare-and-set), computes the decision from the job state (restart budget,
progress) and publishes it; every other launcher polls for it each tick and follows
it. So a healthy node learns of a restart within one monitor interval, the budget is
counted once per job restart however many nodes fail, and all nodes agree on the exit
code.
Everything on the wire is JSON.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
from collections.abc import Callable
from typing import Any

from torch._C._distributed_c10d import PrefixStore, Store

__all__ = ["Action", "Decision", "JobCoordinator", "JobState", "base_store"]


class Action(str, enum.Enum):
    """What every launcher does at the end of a cycle."""

    RESTART = "restart"
    STOP = "stop"
    SHUTDOWN = "shutdown"


@dataclasses.dataclass(frozen=True)
class JobState:
    """Counters that survive restarts; kept in the store so joining nodes see them too.

    ``cycle`` counts every restart (it is TORCHELASTIC_RESTART_COUNT), ``charged``
    the restarts charged to --max-restarts, ``no_progress`` the consecutive charged
    restarts after which the marker in the progress file did not move.
    """

    cycle: int = 0
    charged: int = 0
    no_progress: int = 0


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of one cycle, identical for every node."""

    action: Action
    reason: str
    node: str
    state: JobState
    exit_code: int = 0
    charged: bool = False
    excluded_node: str | None = None

    def to_json(self) -> str:
        """Wire form."""
        body: dict[str, Any] = dataclasses.asdict(self)
        body["action"] = self.action.value
        return json.dumps(body, separators=(",", ":"))

    @staticmethod
    def from_json(data: bytes) -> Decision:
        """Parse the wire form; a ValueError says what is wrong."""
        try:
            body = json.loads(data.decode("utf-8"))
            state = JobState(**body.pop("state"))
            action = Action(body.pop("action"))
            return Decision(action=action, state=state, **body)
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"bad launcher decision {data[:200]!r}: {exc}") from None


def _state_from_json(data: bytes) -> JobState:
    try:
        return JobState(**json.loads(data.decode("utf-8")))
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"bad launcher job state {data[:200]!r}: {exc}") from None


def base_store(store: Store) -> Store:
    """The store under the rendezvous round prefixes, shared by every round of the job."""
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store


class JobCoordinator:
    """Claims, publishes and reads the per-cycle decisions of one job (one run id)."""

    def __init__(self, store: Store, run_id: str, node: str) -> None:
        # A store written in Python (torch's EtcdStore) works from C++ only while its
        # Python object lives: hold it here, not just through the PrefixStore.
        self._base = base_store(store)
        self._store = PrefixStore(f"nvrx.launcher.{run_id}", self._base)
        self._node = node

    @property
    def node(self) -> str:
        """This launcher's id in decisions."""
        return self._node

    def state(self) -> JobState:
        """The job state as of the last decision (fresh state for a new job)."""
        if not self._store.check(["state"]):
            return JobState()
        return _state_from_json(self._store.get("state"))

    def poll(self, cycle: int) -> Decision | None:
        """The decision of ``cycle`` if one was published; one store round trip."""
        key = f"cycle/{cycle}/decision"
        if not self._store.check([key]):
            return None
        return Decision.from_json(self._store.get(key))

    def decide(
        self,
        cycle: int,
        make: Callable[[JobState], Decision],
        wait: datetime.timedelta = datetime.timedelta(seconds=60),
    ) -> Decision:
        """Publish ``make(state)`` as the decision of ``cycle`` unless another node won.

        Returns the decision in force, ours or the winner's.
        """
        key = f"cycle/{cycle}/decision"
        if self._store.add(f"cycle/{cycle}/claim", 1) == 1:
            decision = make(self.state())
            self._store.set("state", json.dumps(dataclasses.asdict(decision.state)))
            self._store.set(key, decision.to_json())
            return decision
        self._store.wait([key], wait)
        return Decision.from_json(self._store.get(key))

    def arrive(self, cycle: int) -> int:
        """Count this node as finished with ``cycle``; returns how many have."""
        return int(self._store.add(f"cycle/{cycle}/done", 1))

    def arrived(self, cycle: int) -> int:
        """How many nodes finished ``cycle`` successfully."""
        return int(self._store.add(f"cycle/{cycle}/done", 0))

    def leave(
        self, cycle: int, nodes: int, wait: datetime.timedelta = datetime.timedelta(seconds=10)
    ) -> None:
        """Last store call of a finished job: wait until every node is past its barrier.

        The store lives in one of the launchers; this keeps it up until every node has
        stopped needing it. Errors mean the host already left, which is fine by then.
        """
        try:
            left = int(self._store.add(f"cycle/{cycle}/left", 1))
            if left >= nodes:
                self._store.set(f"cycle/{cycle}/all_left", "1")
            else:
                self._store.wait([f"cycle/{cycle}/all_left"], wait)
        except Exception:  # noqa: S110 - nothing left to coordinate
            pass
