"""The run nonce: binds what a run's launchers sign in the store to that run only.

Values signed with the job key (:mod:`._job_key`) are bound to the run id and the store
key. A requeued job keeps both (same ``--rdzv-id``, same ``NVRX_JOB_KEY``), so without
more a value signed by an earlier run (a restart decision, say) would verify in the new
one, replayed by anyone who kept a copy, or still in a store that outlived the run. So
each run also has a nonce: the first launcher that comes to the store creates 16 random
bytes and publishes them, signed, with compare-and-set under
``nvrx.launcher.<run id>/run_nonce/<attempt>``; every other launcher of the run reads
that record and checks its signature. Every signed value then names ``<run id>#<nonce>``
as its run (:func:`signed_run`), so a value of another run does not verify and is
ignored and logged like any other.

``<attempt>`` is the scheduler's requeue count (``SLURM_RESTART_CNT``, 0 when unset): a
store that outlives a run (etcd, a TCPStore hosted outside the job) still holds the
earlier run's record, and only a new attempt number tells a requeue from a launcher
that joins a running job. Where neither the store is new nor the attempt changes, the
new run takes the earlier run's nonce (see the launcher guide, "Securing the rendezvous
store", for what is covered).

Without a job key nothing is signed, so there is no nonce and no store operation.
"""

from __future__ import annotations

import datetime
import logging
import re
import secrets
from collections.abc import Mapping

from ._cycle_info_writer import cycle_info_attempt
from ._signed_store import SignedStore
from ._torch_compat import PrefixStore, Store

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

_NONCE_BYTES = 16
_NONCE_RE = re.compile(r"[0-9a-f]{32}")
_MAX_RECORD_BYTES = 1024
#: compare-and-set rounds against a record that keeps being replaced by invalid ones.
_MAX_TRIES = 16
#: Without compare-and-set: how long a launcher waits for the claimer's record.
_CLAIM_WAIT = datetime.timedelta(seconds=60)


def scheduler_attempt(env: Mapping[str, str]) -> int:
    """The scheduler's requeue count of this run (SLURM_RESTART_CNT; 0 when unset)."""
    return cycle_info_attempt(env)


def signed_run(run_id: str, nonce: str | None) -> str:
    """The run as signed values name it: the run id and, with a job key, the nonce."""
    return run_id if nonce is None else f"{run_id}#{nonce}"


def _signed(store: Store, key: bytes, run_id: str) -> SignedStore:
    """The run's values under ``nvrx.launcher.<run id>/``, signed over the run id alone."""
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    prefix = f"nvrx.launcher.{run_id}"
    return SignedStore(
        PrefixStore(prefix, store), key, run_id, prefix=prefix, max_bytes=_MAX_RECORD_BYTES
    )


def _nonce(body: str) -> str:
    if not _NONCE_RE.fullmatch(body):
        raise ValueError("not a nonce of 32 hex digits")
    return body


def _parse(signed: SignedStore, name: str, data: bytes) -> str:
    """The nonce in a record; ValueError unless well formed and signed with the job key."""
    return _nonce(signed.unseal(name, data))


def run_nonce(store: Store, key: bytes | None, run_id: str, attempt: int) -> str | None:
    """This run's nonce, created here if this launcher is the run's first (None: no key).

    compare-and-set keeps the first valid record: every launcher of the run gets the
    same nonce, and an invalid record (garbage, or signed with another key) is replaced
    exactly. On a store without compare-and-set (torch's EtcdStore) the launcher that
    takes an ``add`` counter to 1 creates it and the others wait for it; a record there
    that does not verify raises RuntimeError (the run cannot agree on a nonce).
    """
    if key is None:
        return None
    signed = _signed(store, key, run_id)
    name = f"run_nonce/{attempt}"
    mine = secrets.token_hex(_NONCE_BYTES)
    found: list[str] = []

    def stands(data: bytes) -> bool:
        try:
            found.append(_parse(signed, name, data))
            return True
        except ValueError as exc:
            logger.warning(
                "replacing the run nonce record under %s in the rendezvous store: %s (value %r)",
                signed.where(name),
                exc,
                data[:120],
            )
            return False

    ours = signed.compare_set(name, mine, stands=stands, tries=_MAX_TRIES)
    if ours is None:
        return _by_claim(signed, name, mine)
    if ours:
        logger.info("created the nonce of this run (%s, attempt %d)", run_id, attempt)
        return mine
    if found:
        return found[-1]
    raise RuntimeError(
        f"{signed.where(name)}: the run nonce record keeps being replaced by invalid values"
    )


def _by_claim(signed: SignedStore, name: str, mine: str) -> str:
    store = signed.store
    if int(store.add(f"{name}/claim", 1)) == 1:
        signed.set(name, mine)
        return mine
    store.wait([name], _CLAIM_WAIT)
    try:
        return _parse(signed, name, store.get(name))
    except ValueError as exc:
        raise RuntimeError(
            f"{signed.where(name)}: the run nonce record in the store is invalid: {exc}"
        ) from None
