"""Job-wide decisions shared by every node's launcher through the rendezvous store.

One decision per cycle (the span between two (re)starts of the workers): the first
launcher that sees a reason to restart or stop claims the cycle with an atomic ``add``
(the one that takes the counter to 1 wins; every torch store has ``add``, while etcd's
has no compare-and-set), computes the decision from the job state (restart budget,
progress) and publishes it; every other launcher follows it. A launcher does not poll
the store for it each tick: a watcher thread on its own store connection blocks in
``wait`` on the cycle's decision key and raises a flag the agent's tick reads without a
store op (:meth:`JobCoordinator.decided`); only then is the decision read and verified.
So a healthy node learns of a restart at its next tick with no store traffic while the
job trains, the budget is counted once per job restart however many nodes fail, and all
nodes agree on the exit code. A store that cannot open a second connection (torch's
EtcdStore has no ``clone``) is polled instead, at most every ``_FALLBACK_POLL_S``.

The store is not ours to trust: anyone who reaches its port can write to it. So every
decision and the ``state`` hint are published in an envelope: the JSON body and, when the
job has a key (:mod:`._job_key`), an HMAC-SHA256 bound to the run id, the run's nonce
(:mod:`._run_nonce`) and the store key it sits under (a value copied from another job,
run of the same job, cycle or key does not verify). A value that
is malformed, or not signed with the job's key when there is one, is ignored and logged;
it never ends a launcher. The exit code of a stop is derived from the decision's kind,
never read from the store. Everything on the wire is JSON.

The counters cannot be signed (``add`` is the only atomic operation every store has):

- ``cycle/<n>/claim``: a forged bump (or a claimer that dies before publishing) leaves
  the others waiting; after ``wait`` each publishes its own signed decision with
  compare-and-set, the first valid one stays and all follow it. A store without
  compare-and-set (torch's EtcdStore) raises TimeoutError there instead.
- ``cycle/<n>/timelines`` (how many nodes published their goodput timeline, each signed
  under ``cycle/<n>/timeline/<i>``): a forged count makes the summary writer read
  absent keys (skipped) or stop waiting early, so the job summary covers fewer nodes;
- ``cycle/<n>/done``, ``left``, ``all_left`` (the exit barrier): a forged count can only
  make a node whose own ranks all succeeded stop waiting for the others early, or (a
  count never reached) wait until ``--exit-barrier-timeout``; it cannot restart or stop
  anything, nor change an exit code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import enum
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ._run_nonce import run_nonce, scheduler_attempt, signed_run
from ._signed_store import RejectHook, Rejections, SignedStore
from ._torch_compat import PrefixStore, Store
from .exit_codes import ExitCode

__all__ = ["Action", "Decision", "JobCoordinator", "JobState", "StopCause", "base_store"]

logger = logging.getLogger("nvrx.launcher")

_MAX_VALUE_BYTES = 64 * 1024
_MAX_TEXT = 4096
_MAX_COUNT = 2**31 - 1
# How far JobCoordinator.state() follows published decisions past the state hint.
_MAX_WALK = 100_000
_POLL_S = 0.05
# Goodput timelines read by the summary writer, at most (a forged counter cannot make
# it read more).
_MAX_TIMELINES = 4096
# Seconds a counted node's timeline may take to appear after the others' wait ran out.
_TIMELINE_WRITE_S = 1.0
# The watcher's wait on a decision key: long, so that a quiet job makes one store call per
# this period and node (a timed-out wait also makes torch log a line); it is re-armed.
_WATCH_WAIT = datetime.timedelta(hours=1)
# Without a watcher (no clone), or while an invalid value sits under the key: how often
# decided() reads the key.
_FALLBACK_POLL_S = 1.0
# How long close() waits for the watcher (a daemon) to end; one blocked in the store ends
# with the process.
_JOIN_S = 0.5


class Action(str, enum.Enum):
    """What every launcher does at the end of a cycle."""

    RESTART = "restart"
    STOP = "stop"
    SHUTDOWN = "shutdown"


class StopCause(str, enum.Enum):
    """Why a job stops; fixes the exit code of every node."""

    RESTARTS_EXHAUSTED = "restarts_exhausted"
    NO_PROGRESS = "no_progress"
    DETERMINISTIC_FAILURE = "deterministic_failure"


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
    """The outcome of one cycle, identical for every node.

    A STOP carries its ``stop_cause``; RESTART and SHUTDOWN carry none.
    """

    action: Action
    reason: str
    node: str
    state: JobState
    stop_cause: StopCause | None = None
    charged: bool = False
    excluded_node: str | None = None

    def __post_init__(self) -> None:
        if (self.action is Action.STOP) != (self.stop_cause is not None):
            raise ValueError(f"a {self.action.value} decision with stop cause {self.stop_cause}")

    @property
    def exit_code(self) -> int:
        """The launcher's exit code when it follows this decision (0 for a restart)."""
        if self.action is Action.SHUTDOWN:
            return int(ExitCode.WORKLOAD_SHUTDOWN)
        if self.stop_cause is StopCause.NO_PROGRESS:
            return int(ExitCode.NO_PROGRESS)
        if self.stop_cause is StopCause.RESTARTS_EXHAUSTED:
            return int(ExitCode.RESTARTS_EXHAUSTED)
        if self.stop_cause is StopCause.DETERMINISTIC_FAILURE:
            return int(ExitCode.DETERMINISTIC_FAILURE)
        return 0

    def to_json(self) -> str:
        """Wire form of the body."""
        body: dict[str, Any] = dataclasses.asdict(self)
        body["action"] = self.action.value
        body["stop_cause"] = None if self.stop_cause is None else self.stop_cause.value
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(data: bytes) -> Decision:
        """Parse and validate the wire form; a ValueError says what is wrong."""
        try:
            return _decision(_loads(data))
        except (KeyError, TypeError, ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(f"bad launcher decision {data[:200]!r}: {exc}") from None


_DECISION_FIELDS = frozenset(f.name for f in dataclasses.fields(Decision))
_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(JobState))


def _loads(data: bytes) -> Any:
    if len(data) > _MAX_VALUE_BYTES:
        raise ValueError(f"{len(data)} bytes, more than {_MAX_VALUE_BYTES}")
    return json.loads(data.decode("utf-8"))


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise ValueError(f"{name} must be a string of at most {_MAX_TEXT} characters")
    return value


def _count(value: Any, name: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_COUNT:
        raise ValueError(f"{name} must be an integer from 0 to {_MAX_COUNT}")
    return value


def _state(body: Any) -> JobState:
    if not isinstance(body, dict) or set(body) != _STATE_FIELDS:
        raise ValueError(f"a job state has exactly the fields {sorted(_STATE_FIELDS)}")
    return JobState(**{name: _count(body[name], name) for name in sorted(_STATE_FIELDS)})


def _decision(body: Any) -> Decision:
    if not isinstance(body, dict) or set(body) != _DECISION_FIELDS:
        raise ValueError(f"a decision has exactly the fields {sorted(_DECISION_FIELDS)}")
    if not isinstance(body["charged"], bool):
        raise ValueError("charged must be true or false")
    excluded = body["excluded_node"]
    cause = body["stop_cause"]
    return Decision(
        action=Action(body["action"]),
        reason=_text(body["reason"], "reason"),
        node=_text(body["node"], "node"),
        state=_state(body["state"]),
        stop_cause=None if cause is None else StopCause(cause),
        charged=body["charged"],
        excluded_node=None if excluded is None else _text(excluded, "excluded_node"),
    )


def _fits(decision: Decision, cycle: int) -> bool:
    """A restart of ``cycle`` leads to ``cycle + 1``; a stop or shutdown stays in it."""
    after = cycle + 1 if decision.action is Action.RESTART else cycle
    return decision.state.cycle == after


def base_store(store: Store) -> Store:
    """The store under the rendezvous round prefixes, shared by every round of the job."""
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store


class _DecisionWatch:
    """A daemon thread that blocks in ``wait`` until the watched decision key exists.

    It runs on its own store connection (a ``clone``: a blocked ``wait`` would hold the
    agent's connection) and only raises a flag; the value is read and verified by the
    caller, in the caller's thread, so rejections are reported where they always were.
    It also makes :meth:`fileno` readable, so a caller in ``select`` wakes at once.
    """

    def __init__(self, connection: Store, prefix: str) -> None:
        # Hold the connection itself: a store written in Python lives only as long as its
        # Python object (see JobCoordinator).
        self._connection = connection
        self._store = PrefixStore(prefix, connection)
        self._lock = threading.Condition()
        self._key: str | None = None  # guarded by _lock
        self._present = False
        self._failed = False
        self._stop = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="nvrx-decision-watch", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        """True once the store failed under the watcher (its caller polls instead)."""
        return self._failed

    def fileno(self) -> int:
        """Readable from the moment the watched key is seen until :meth:`present` is asked."""
        return self._wake_r.fileno()

    def present(self, key: str) -> bool:
        """Whether ``key`` was seen in the store; watches it from now on if it was not."""
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass
        with self._lock:
            if self._key != key:
                self._key, self._present = key, False
                self._lock.notify_all()
            return self._present

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        self._thread.join(_JOIN_S)
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._stop and (self._key is None or self._present):
                    self._lock.wait()
                if self._stop or self._key is None:
                    return
                key = self._key
            started = time.monotonic()
            try:
                self._store.wait([key], _WATCH_WAIT)
            except Exception as exc:  # torch: DistStoreError on a timeout, DistNetworkError
                if time.monotonic() - started >= _WATCH_WAIT.total_seconds() * 0.9:
                    continue  # a quiet hour: wait again
                logger.debug("the decision watcher's store failed (%s); polling instead", exc)
                self._failed = True
                return
            with self._lock:
                if self._key != key or self._stop:
                    continue
                self._present = True
                with contextlib.suppress(BlockingIOError, OSError):
                    self._wake_w.send(b"\0")


class JobCoordinator:
    """Claims, publishes and reads the per-cycle decisions of one job (one run id).

    ``key`` is the job key (None: values are neither signed nor checked). With a key,
    values are also bound to this run's nonce, read (or created, by the run's first
    launcher) here; ``attempt`` is the scheduler's requeue count (default: from
    SLURM_RESTART_CNT).
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        node: str,
        *,
        key: bytes | None = None,
        on_reject: RejectHook | None = None,
        attempt: int | None = None,
    ) -> None:
        # A store written in Python (torch's EtcdStore) works from C++ only while its
        # Python object lives: hold it here, not just through the PrefixStore.
        self._base = base_store(store)
        self._prefix = f"nvrx.launcher.{run_id}"
        self._store = PrefixStore(self._prefix, self._base)
        self._run_id = run_id
        self._node = node
        self._key = key
        self._watch: _DecisionWatch | None = None
        self._watch_tried = False
        self._decided: tuple[int, Decision] | None = None
        self._next_read = (-1, 0.0)  # (cycle, monotonic time) of decided()'s next read
        if attempt is None:
            attempt = scheduler_attempt(os.environ)
        #: The run as signed values name it (run id and nonce).
        run = signed_run(run_id, run_nonce(self._base, key, run_id, attempt))
        #: Every value this coordinator signs and reads (:mod:`._signed_store`).
        self._signed = SignedStore(
            self._store,
            key,
            run,
            prefix=self._prefix,
            rejections=Rejections(on_reject),
            max_bytes=_MAX_VALUE_BYTES,
        )

    @property
    def node(self) -> str:
        """This launcher's id in decisions."""
        return self._node

    @property
    def authenticated(self) -> bool:
        """True when values are signed and checked with a job key."""
        return self._key is not None

    # -- signed values (:mod:`._signed_store`) -----------------------------------------

    def _publish(self, name: str, body: str) -> None:
        self._signed.set(name, body)

    def _publish_decision(self, cycle: int, decision: Decision) -> Decision | None:
        """Put ``decision`` under the cycle's key unless a valid one is there; the one in force.

        With compare-and-set only an absent or invalid value is replaced, so the first
        valid decision stays and every node reads that one. None when the store has no
        compare-and-set (torch's EtcdStore).
        """
        key = f"cycle/{cycle}/decision"
        ours = self._signed.compare_set(
            key,
            decision.to_json(),
            stands=lambda data: self._signed.parse(key, data, self._decision_of(cycle)) is not None,
        )
        if ours is None:
            return None
        return decision if ours else self.poll(cycle)

    def _read(self, name: str, parse: Callable[[bytes], Any]) -> Any:
        """The parsed value under ``name``, or None when absent or rejected."""
        return self._signed.read(name, lambda body: parse(body.encode("utf-8")))

    # -- decisions -------------------------------------------------------------------

    def state(self) -> JobState:
        """The job state as of the last decision (fresh state for a new job).

        The ``state`` value is a hint where to start; the decisions published after it
        are followed, so an old or forged hint cannot move the job back or forward.
        """
        state: JobState = self._read("state", lambda raw: _state(_loads(raw))) or JobState()
        for _ in range(_MAX_WALK):
            decision = self.poll(state.cycle)
            if decision is None:
                return state
            state = decision.state
            if decision.action is not Action.RESTART:
                return state
        return state

    def poll(self, cycle: int) -> Decision | None:
        """The valid decision of ``cycle`` if one was published; one store round trip."""
        result: Decision | None = self._signed.read(
            f"cycle/{cycle}/decision", self._decision_of(cycle)
        )
        return result

    @staticmethod
    def _decision_of(cycle: int) -> Callable[[str], Decision]:
        """The parser of ``cycle``'s decision: well formed, and leading where it must."""

        def parse(body: str) -> Decision:
            decision = Decision.from_json(body.encode("utf-8"))
            if not _fits(decision, cycle):
                raise ValueError(
                    f"a {decision.action.value} of cycle {cycle} leading to cycle "
                    f"{decision.state.cycle}"
                )
            return decision

        return parse

    def decided(self, cycle: int) -> Decision | None:
        """The valid decision of ``cycle`` once one is published; for the agent's tick.

        Makes no store call until the watcher saw the decision key; then reads and
        verifies it (:meth:`poll`) and keeps the result. Without a watcher, and while the
        key holds an invalid value (a valid one may replace it), it reads at most every
        ``_FALLBACK_POLL_S``.
        """
        if self._decided is not None and self._decided[0] == cycle:
            return self._decided[1]
        watch = self._watcher()
        if watch is not None and not watch.present(f"cycle/{cycle}/decision"):
            return None
        now = time.monotonic()
        if self._next_read[0] == cycle and now < self._next_read[1]:
            return None
        self._next_read = (cycle, now + _FALLBACK_POLL_S)
        decision = self.poll(cycle)
        if decision is not None:
            self._decided = (cycle, decision)
        return decision

    def _watcher(self) -> _DecisionWatch | None:
        if self._watch is not None and self._watch.failed:
            self._watch.close()
            self._watch = None
        if self._watch is None and not self._watch_tried:
            self._watch_tried = True
            try:
                connection: Store = getattr(self._base, "clone")()  # noqa: B009 - not in the stubs
            except (RuntimeError, NotImplementedError, AttributeError) as exc:
                logger.debug("this store has no clone (%s): decisions are polled", exc)
                return None
            self._watch = _DecisionWatch(connection, self._prefix)
        return self._watch

    def fileno(self) -> int | None:
        """A descriptor that turns readable when a decision key is seen (None: no watcher).

        For the agent's ``select``: it wakes at once instead of at its next tick; then
        :meth:`decided` reads the decision (and makes the descriptor quiet again).
        """
        watch = self._watcher()
        return None if watch is None else watch.fileno()

    def close(self) -> None:
        """Stop the decision watcher (the launcher calls this when it ends)."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def decide(
        self,
        cycle: int,
        make: Callable[[JobState], Decision],
        wait: datetime.timedelta = datetime.timedelta(seconds=60),
    ) -> Decision:
        """Publish ``make(state)`` as the decision of ``cycle`` unless another node won.

        Returns the decision in force, ours or the winner's. When another node claimed
        the cycle but no valid decision appeared within ``wait``, this node publishes its
        own with compare-and-set (the first valid one stays); on a store without
        compare-and-set that raises TimeoutError.
        """
        key = f"cycle/{cycle}/decision"
        if self._store.add(f"cycle/{cycle}/claim", 1) == 1:
            return self._decide_here(cycle, make, claimed=True)
        deadline = time.monotonic() + wait.total_seconds()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError, RuntimeError):  # torch: DistStoreError
                self._store.wait([key], datetime.timedelta(seconds=remaining))
            found = self.poll(cycle)
            if found is not None:
                return found
            time.sleep(_POLL_S)
        # The claimer died before publishing, or someone without the job key bumped the
        # unsigned claim counter: decide here. compare-and-set keeps the first valid
        # decision, so every waiter that gets here still follows one and the same.
        logger.warning(
            "cycle %d was claimed but no valid decision came within %g s (its claimer "
            "died, or the claim counter was forged); deciding here",
            cycle,
            wait.total_seconds(),
        )

        return self._decide_here(cycle, make, claimed=False, waited=wait)

    def _decide_here(
        self,
        cycle: int,
        make: Callable[[JobState], Decision],
        *,
        claimed: bool,
        waited: datetime.timedelta | None = None,
    ) -> Decision:
        """Compute and publish this node's decision of ``cycle``; the one in force."""
        state = self.state()
        if state.cycle > cycle:
            # Another node's decision of this cycle landed meanwhile (a waiter whose wait
            # ran out first, or a late claimer): follow it rather than decide a later one.
            found = self.poll(cycle)
            if found is not None:
                return found
        decision = make(state)
        if len(decision.reason) > _MAX_TEXT:
            decision = dataclasses.replace(
                decision, reason=decision.reason[: _MAX_TEXT - 3] + "..."
            )
        if not _fits(decision, cycle):
            raise AssertionError(f"decision {decision} does not fit cycle {cycle}")
        found = self._publish_decision(cycle, decision)
        if found is None and claimed:  # no compare-and-set: the claim alone decides
            self._publish(f"cycle/{cycle}/decision", decision.to_json())
            found = decision
        if found is None:
            seconds = 0.0 if waited is None else waited.total_seconds()
            raise TimeoutError(
                f"another launcher claimed cycle {cycle}, but no valid decision came within "
                f"{seconds:g} s (and this store has no compare-and-set to publish one safely)"
            )
        if found == decision:
            self._publish("state", json.dumps(dataclasses.asdict(decision.state)))
        return found

    # -- the job's goodput summary -----------------------------------------------------

    def publish_timeline(self, cycle: int, body: str) -> None:
        """This node's goodput timeline (JSON text), signed, for the summary writer.

        Published under the job's last cycle, so a requeued job on a persistent store
        (etcd) does not read an earlier run's timelines.
        """
        index = int(self._store.add(f"cycle/{cycle}/timelines", 1))
        if 1 <= index <= _MAX_TIMELINES:
            self._publish(f"cycle/{cycle}/timeline/{index}", body)

    def timelines(
        self, cycle: int, nodes: int, wait_s: float, parse: Callable[[bytes], Any]
    ) -> list[Any]:
        """The nodes' timelines of ``cycle``, each read through ``parse``.

        Waits up to ``wait_s`` for ``nodes`` of them to be counted, then for the counted
        ones to be written (the rest of ``wait_s``, at least ``_TIMELINE_WRITE_S``);
        values that do not verify or parse are ignored and reported.
        """
        counter = f"cycle/{cycle}/timelines"
        deadline = time.monotonic() + wait_s
        while int(self._store.add(counter, 0)) < nodes and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        count = min(int(self._store.add(counter, 0)), _MAX_TIMELINES)
        names = [f"cycle/{cycle}/timeline/{i}" for i in range(1, count + 1)]
        # A node takes its index (the counter) before it writes its timeline: the ones
        # counted get the rest of the wait, at least _TIMELINE_WRITE_S, to be written.
        written_by = max(deadline, time.monotonic() + _TIMELINE_WRITE_S)
        if names:
            # The store's own wait (no poll loop); a node that never writes its timeline
            # costs this wait's timeout, after which the written ones are read.
            with contextlib.suppress(TimeoutError, RuntimeError):  # torch: DistStoreError
                left = max(0.001, written_by - time.monotonic())
                self._store.wait(names, datetime.timedelta(seconds=left))
        found = (self._read(name, parse) for name in names)
        return [value for value in found if value is not None]

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
