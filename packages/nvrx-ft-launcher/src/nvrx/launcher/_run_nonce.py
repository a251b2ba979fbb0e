"""The run nonce: binds what a run's launchers sign in the store to that run only.

Values signed with the job key (:mod:`._job_key`) are bound to the run id and the store
key. A requeued job keeps both (same ``--rdzv-id``, same ``NVRX_JOB_KEY``), so without
more a value signed by an earlier run (a restart decision, say) would verify in the new
one, replayed by anyone who kept a copy, or still in a store that outlived the run. So
each run also has a nonce: 16 random bytes in a record signed over the run id,
``nvrx.launcher.<run id>/run_nonce/<attempt>``, that every launcher of the run uses.
Every signed value then names ``<run id>#<nonce>`` as its run (:func:`signed_run`), so
a value of another run does not verify and is ignored and logged like any other.

Which nonce a launcher uses, resolved once per launcher (:class:`NonceKeeper`):

- no record: it creates one with compare-and-set from absent; the winner's is the run's;
- a record that does not verify (garbage, forged, another key): replaced exactly;
- a valid record: it may be a live run's (this launcher joins it: a late node, a standby,
  a replacement) or an earlier run's that the store outlived (etcd, a TCPStore hosted
  outside the job, where the attempt did not change). The launcher asks
  (:mod:`._nonce_liveness`): every launcher holding a nonce answers fresh challenges
  from a thread on its own store connection, so a live run answers within about a
  second, even while its launchers are blocked in torch's rendezvous; recorded answers
  do not answer a new challenge. No answer within ``ANSWER_WINDOW_S`` (monotonic): the
  run is over, and the record is replaced with compare-and-set from exactly the value
  read, so concurrent newcomers agree on one new nonce (a loser asks the winner's record,
  which its creator answers at once).

On a store without compare-and-set (torch's EtcdStore) an ``add`` counter stands in for
it: ``<record>/claim`` picks the creator of an absent record, ``<record>/replace/<digest
of the value>`` the launcher that replaces a given value; the others wait for the record
to change (up to ``_CLAIM_WAIT``) and read it again.

``<attempt>`` is the scheduler's requeue count (``SLURM_RESTART_CNT``, 0 when unset): a
new count starts from an empty record without waiting. Without a job key nothing is
signed, so there is no nonce and no store operation. The answering threads end with
:func:`stop_answering` (the launcher calls it on its way out).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import re
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from . import _nonce_liveness
from ._cycle_info_writer import cycle_info_attempt
from ._nonce_liveness import Answerer, Names, challenge_counter, is_answered
from ._signed_store import Rejections, SignedStore
from ._torch_compat import PrefixStore, Store

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

_NONCE_BYTES = 16
_NONCE_RE = re.compile(r"[0-9a-f]{32}")
_MAX_RECORD_BYTES = 1024
#: Rounds against a record that keeps being replaced (invalid values, other newcomers).
_MAX_TRIES = 16
#: Without compare-and-set: how long a launcher waits for the claimer's record.
_CLAIM_WAIT = datetime.timedelta(seconds=60)
#: The answering thread's store operations end within this (its own connection's timeout).
_ANSWER_OP_TIMEOUT = datetime.timedelta(seconds=5)


def scheduler_attempt(env: Mapping[str, str]) -> int:
    """The scheduler's requeue count of this run (SLURM_RESTART_CNT; 0 when unset)."""
    return cycle_info_attempt(env)


def signed_run(run_id: str, nonce: str | None) -> str:
    """The run as signed values name it: the run id and, with a job key, the nonce."""
    return run_id if nonce is None else f"{run_id}#{nonce}"


def _base(store: Store) -> Store:
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store


def _signed(base: Store, key: bytes, run_id: str, run: str, rejections: Rejections) -> SignedStore:
    """The run's values under ``nvrx.launcher.<run id>/``, signed over ``run``."""
    prefix = f"nvrx.launcher.{run_id}"
    return SignedStore(
        PrefixStore(prefix, base),
        key,
        run,
        prefix=prefix,
        rejections=rejections,
        max_bytes=_MAX_RECORD_BYTES,
    )


def _nonce(body: str) -> str:
    if not _NONCE_RE.fullmatch(body):
        raise ValueError("not a nonce of 32 hex digits")
    return body


def _connection(base: Store) -> Store:
    """A store connection for the answering thread: a clone where the store has one."""
    try:
        clone: Store = getattr(base, "clone")()  # noqa: B009 - not in torch's stubs
    except (RuntimeError, NotImplementedError, AttributeError) as exc:
        # A store written in Python (torch's EtcdStore): its calls do not queue behind
        # one socket, so the thread shares it.
        logger.debug("this store has no clone (%s): nonce challenges share it", exc)
        return base
    clone.set_timeout(_ANSWER_OP_TIMEOUT)
    return clone


@dataclass
class _Held:
    store: Store
    key: bytes
    run_id: str
    attempt: int
    nonce: str
    answerer: Answerer


class NonceKeeper:
    """The nonces one launcher uses, each resolved once, and the threads answering for them.

    ``window`` is how long an unanswered challenge waits before the record's run is taken
    for over (seconds, monotonic; default ``_nonce_liveness.ANSWER_WINDOW_S``).
    """

    def __init__(self, *, window: float | None = None) -> None:
        self._window = window
        self._lock = threading.Lock()
        self._held: list[_Held] = []
        self._rejections = Rejections()

    def nonce(self, store: Store, key: bytes | None, run_id: str, attempt: int) -> str | None:
        """This run's nonce (None: no key), created here if no live run holds one."""
        if key is None:
            return None
        base = _base(store)
        with self._lock:
            for held in self._held:
                if held.store is base and (held.key, held.run_id, held.attempt) == (
                    key,
                    run_id,
                    attempt,
                ):
                    return held.nonce
            nonce, start, created = self._resolve(base, key, run_id, attempt)
            answerer = self._answerer(base, key, run_id, attempt, nonce, start, created)
            self._held.append(_Held(base, key, run_id, attempt, nonce, answerer))
            return nonce

    def close(self) -> None:
        """Stop every answering thread and wait for each (a bounded time)."""
        with self._lock:
            held, self._held = self._held, []
        for h in held:
            h.answerer.stop()
        for h in held:
            h.answerer.join()

    # -- resolving -------------------------------------------------------------------

    def _resolve(self, base: Store, key: bytes, run_id: str, attempt: int) -> tuple[str, int, bool]:
        """(nonce, challenge counter before it was read, whether this launcher created it)."""
        window = _nonce_liveness.ANSWER_WINDOW_S if self._window is None else self._window
        records = _signed(base, key, run_id, run_id, self._rejections)
        store = records.store
        names = Names(f"run_nonce/{attempt}")
        name = names.record
        # Read before the record: every challenge to the record we settle on comes later.
        start = challenge_counter(records, names)
        for _ in range(_MAX_TRIES):
            mine = secrets.token_hex(_NONCE_BYTES)
            data = store.get(name) if store.check([name]) else None
            if data is None:
                won = self._put(records, name, b"", mine)
            else:
                try:
                    theirs = _nonce(records.unseal(name, data))
                except ValueError as exc:  # logged once per value, as any rejected one
                    records.reject(name, data, f"{exc}; replacing the run nonce record")
                    won = self._put(records, name, data, mine)
                else:
                    answers = _signed(
                        base, key, run_id, signed_run(run_id, theirs), self._rejections
                    )
                    if is_answered(records, answers, names, theirs, window):
                        logger.debug("joined the run whose nonce is in %s", records.where(name))
                        return theirs, start, False
                    logger.warning(
                        "no launcher of the run whose nonce is under %s in the rendezvous "
                        "store answered within %.0f s: that run is over (a store that "
                        "outlived it); starting a new run nonce",
                        records.where(name),
                        window,
                    )
                    won = self._put(records, name, data, mine)
            if won:
                logger.info("created the nonce of this run (%s, attempt %d)", run_id, attempt)
                return mine, start, True
            # Another launcher created or replaced it first: read (and ask) that one.
        raise RuntimeError(
            f"{records.where(name)}: the run nonce record keeps being replaced "
            f"({_MAX_TRIES} rounds)"
        )

    def _put(self, records: SignedStore, name: str, old: bytes, mine: str) -> bool:
        """Replace exactly ``old`` (b"": absent) with ``mine``'s record; True if we did."""
        value = records.seal(name, mine)
        store = records.store
        try:
            now = store.compare_set(name, old, value)  # type: ignore[arg-type]
        except (RuntimeError, NotImplementedError) as exc:
            logger.debug("no compare-and-set on this store (%s): claiming instead", exc)
            return _by_claim(records, name, old, value)
        return bytes(now) == value.encode("utf-8")

    def _answerer(
        self,
        base: Store,
        key: bytes,
        run_id: str,
        attempt: int,
        nonce: str,
        start: int,
        created: bool,
    ) -> Answerer:
        connection = _connection(base)
        return Answerer(
            _signed(connection, key, run_id, run_id, self._rejections),
            _signed(connection, key, run_id, signed_run(run_id, nonce), self._rejections),
            Names(f"run_nonce/{attempt}"),
            nonce,
            start,
            burst=created,
        )


def _by_claim(records: SignedStore, name: str, old: bytes, value: str) -> bool:
    """compare-and-set from ``old`` with an ``add`` counter per value replaced."""
    store = records.store
    claim = f"{name}/claim" if not old else f"{name}/replace/{hashlib.sha256(old).hexdigest()[:32]}"
    if int(store.add(claim, 1)) == 1:
        store.set(name, value)
        return True
    deadline = time.monotonic() + _CLAIM_WAIT.total_seconds()
    while time.monotonic() < deadline:
        if store.check([name]) and (not old or store.get(name) != old):
            return False  # the claimer's record (the caller reads it again)
        time.sleep(0.1)
    raise RuntimeError(
        f"{records.where(name)}: the run nonce record was claimed "
        f"({records.where(claim)}) but not written within {_CLAIM_WAIT.total_seconds():.0f} s"
    )


#: The launcher's nonces (one process, one launcher).
_KEEPER = NonceKeeper()


def run_nonce(store: Store, key: bytes | None, run_id: str, attempt: int) -> str | None:
    """This launcher's nonce for the run (None without a key): see :class:`NonceKeeper`."""
    return _KEEPER.nonce(store, key, run_id, attempt)


def stop_answering() -> None:
    """End the threads answering for this launcher's nonces (at the launcher's exit)."""
    _KEEPER.close()
