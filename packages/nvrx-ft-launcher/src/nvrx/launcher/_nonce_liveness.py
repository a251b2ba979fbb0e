"""Whether a run nonce belongs to a live run: a challenge only its launchers can answer.

A launcher that finds a valid nonce record (:mod:`._run_nonce`) does not know whether
it is the record of the run it belongs to or of an earlier run of the job whose store
outlived it (same run id, job key and scheduler attempt). It asks, under the record
``run_nonce/<attempt>`` (all keys below sit next to it, under ``nvrx.launcher.<run id>/``):

1. ``i = add(<record>/challenges, 1)``, then ``<record>/challenge/<i>`` = ``"<nonce>
   <token>"`` with a fresh random token, signed over the run id (only the job's
   launchers can post a challenge);
2. every launcher that holds that nonce answers from a thread on its own store
   connection: ``<record>/answer/<i>`` = the token, signed over ``<run id>#<nonce>``
   (:func:`._run_nonce.signed_run`), which only a launcher that holds the job key and
   *uses that nonce now* can write for a token it never saw before;
3. the asker waits for the answer (a store ``wait``: no polling) up to a window of
   monotonic time. An answer that does not verify, or answers another token (a replay
   of an earlier answer), is rejected and logged (:class:`._signed_store.Rejections`).

No valid answer within the window means no launcher of that run is alive: the asker
replaces the record (:mod:`._run_nonce`). No wall clock is compared across machines.

Costs. An answering launcher reads one counter per poll, every ``POLL_S`` (the run's
creator every ``BURST_POLL_S`` for its first ``BURST_S``, when the other launchers of a
starting run ask), plus about four operations per challenge it answers; a job of N
nodes thus adds N reads a second to the store while it runs (1000 nodes: 1000 reads a
second, one small key). The asker's wait is a single blocking ``wait``.
"""

from __future__ import annotations

import datetime
import logging
import math
import re
import secrets
import threading
import time
from dataclasses import dataclass

from ._signed_store import SignedStore

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

#: How long an asker waits for an answer before it takes the run for dead. Every live
#: launcher polls at least every POLL_S, so this is ten chances per live launcher for a
#: store round trip; a live run judged dead splits the job (the newcomer signs with a
#: nonce the others do not use), while a dead run only costs a requeue on a reused store
#: this long once.
ANSWER_WINDOW_S = 10.0
#: How often an answering launcher reads the challenge counter.
POLL_S = 1.0
#: The run's creator, for its first BURST_S: the run's other launchers are asking now.
BURST_POLL_S = 0.1
BURST_S = 5.0
#: Challenges looked at per poll, at most (a counter bumped by millions is skipped over).
MAX_NEW_PER_POLL = 4096
#: How long stopping waits for the answering thread (one blocked in the store is a daemon).
JOIN_S = 2.0

_TOKEN_BYTES = 16
_HEX32 = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Names:
    """The keys of one nonce record's challenges (relative to ``nvrx.launcher.<run id>``)."""

    record: str

    @property
    def counter(self) -> str:
        return f"{self.record}/challenges"

    def challenge(self, index: int) -> str:
        return f"{self.record}/challenge/{index}"

    def answer(self, index: int) -> str:
        return f"{self.record}/answer/{index}"


def _challenge(body: str) -> tuple[str, str]:
    """(nonce, token) of a challenge body; ValueError unless both are 32 hex digits."""
    nonce, _, token = body.partition(" ")
    if not (_HEX32.fullmatch(nonce) and _HEX32.fullmatch(token)):
        raise ValueError("not a challenge '<nonce> <token>'")
    return nonce, token


def challenge_counter(records: SignedStore, names: Names) -> int:
    """The challenge counter now (created at 0 if absent): an answerer starts after it."""
    return int(records.store.add(names.counter, 0))


def is_answered(
    records: SignedStore, answers: SignedStore, names: Names, nonce: str, window: float
) -> bool:
    """Whether a launcher holding ``nonce`` answers a fresh challenge within ``window`` s.

    ``records`` is signed over the run id alone (the record's, the challenge's),
    ``answers`` over the run with ``nonce``; both on the caller's store connection.
    """
    store = records.store
    index = int(store.add(names.counter, 1))
    token = secrets.token_hex(_TOKEN_BYTES)
    records.set(names.challenge(index), f"{nonce} {token}")
    name = names.answer(index)

    def matches(body: str) -> bool:
        if body != token:
            raise ValueError("an answer to another challenge (replayed)")
        return True

    deadline = time.monotonic() + window
    while (left := deadline - time.monotonic()) > 0:
        if not store.check([name]):
            started = time.monotonic()
            try:
                # Whole milliseconds, at least one: torch takes a zero timeout for none.
                store.wait([name], datetime.timedelta(milliseconds=math.ceil(left * 1000)))
            except Exception:  # each store times out its own way
                if time.monotonic() - started < min(left, 0.1):
                    time.sleep(0.1)  # a store whose wait fails at once: poll instead
            continue
        if answers.parse(name, store.get(name), matches):
            return True
        # Rejected (and logged once): a live launcher overwrites it; look again shortly.
        time.sleep(min(0.2, max(left, 0.0)))
    return False


class Answerer:
    """Answers the challenges to one nonce from a daemon thread until :meth:`stop`.

    ``records`` and ``answers`` are as for :func:`is_answered`, on a store connection of
    the thread's own (a ``clone``; a store written in Python, whose calls do not queue on
    one socket, may be shared). It answers the challenges numbered after ``start``. A
    store error is logged once (until the store works again); nothing is raised.
    """

    def __init__(
        self,
        records: SignedStore,
        answers: SignedStore,
        names: Names,
        nonce: str,
        start: int,
        *,
        burst: bool = False,
    ) -> None:
        self._records = records
        self._answers = answers
        self._names = names
        self._nonce = nonce
        self._seen = start
        #: Challenge numbers not yet readable (posted a moment later): first seen when.
        self._pending: dict[int, float] = {}
        self._failing = False
        self._said_skip = False
        self._stop = threading.Event()
        self._burst_until = time.monotonic() + BURST_S if burst else 0.0
        self._thread = threading.Thread(target=self._run, name="nvrx-nonce-answer", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Ask the thread to end (it ends at its next poll, or its store op's timeout)."""
        self._stop.set()

    def join(self, timeout: float = JOIN_S) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(BURST_POLL_S if time.monotonic() < self._burst_until else POLL_S):
            try:
                self.poll()
            except Exception as exc:  # never into the agent
                if not self._failing:
                    self._failing = True
                    logger.warning(
                        "cannot answer the run nonce's challenges in the rendezvous store "
                        "(%s: %s); retrying every %.0f s",
                        type(exc).__name__,
                        (str(exc).splitlines() or [""])[0],  # torch adds a C++ trace
                        POLL_S,
                    )
                continue
            if self._failing:
                self._failing = False
                logger.info("answering the run nonce's challenges again")

    def poll(self) -> None:
        """Answer every challenge posted since the last poll (and those still pending)."""
        store = self._records.store
        count = int(store.get(self._names.counter))
        now = time.monotonic()
        if count - self._seen > MAX_NEW_PER_POLL:
            if not self._said_skip:
                self._said_skip = True
                logger.warning(
                    "%d run nonce challenges at once in the rendezvous store: answering the "
                    "last %d",
                    count - self._seen,
                    MAX_NEW_PER_POLL,
                )
            self._seen = count - MAX_NEW_PER_POLL
        for index in range(self._seen + 1, count + 1):
            self._pending[index] = now
        self._seen = max(self._seen, count)
        for index, since in sorted(self._pending.items())[-MAX_NEW_PER_POLL:]:
            if self._stop.is_set():
                return
            if self._answer(index) or now - since > ANSWER_WINDOW_S:
                del self._pending[index]
        while len(self._pending) > MAX_NEW_PER_POLL:
            del self._pending[min(self._pending)]

    def _answer(self, index: int) -> bool:
        """Answer challenge ``index`` if it is to our nonce; False: not posted yet."""
        store = self._records.store
        asked = self._names.challenge(index)
        if not store.check([asked]):
            return False
        body = self._records.parse(asked, store.get(asked), _challenge)
        if body is None or body[0] != self._nonce:
            return True  # forged (rejected, logged once), or a challenge to another record
        name = self._names.answer(index)
        answer = self._answers.seal(name, body[1]).encode("utf-8")
        if store.check([name]) and store.get(name) == answer:
            return True  # another launcher of the run answered it
        store.set(name, answer.decode("utf-8"))
        return True
