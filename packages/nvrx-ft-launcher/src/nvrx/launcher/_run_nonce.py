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
import json
import logging
import re
import secrets
from collections.abc import Mapping

from ._cycle_records import cycle_info_attempt
from ._job_key import sign, verify
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


def _unwrap(store: Store) -> Store:
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store


def _names(run_id: str, attempt: int) -> tuple[str, str]:
    """(store key, signing context) of the run's nonce record."""
    name = f"nvrx.launcher.{run_id}/run_nonce/{attempt}"
    return name, f"nvrx.launcher/v1/{run_id}/run_nonce/{attempt}"


def _record(key: bytes, context: str, nonce: str) -> str:
    mac = sign(key, context, nonce.encode("ascii"))
    return json.dumps({"v": 1, "nonce": nonce, "mac": mac}, separators=(",", ":"))


def _parse(key: bytes, context: str, data: bytes) -> str:
    """The nonce in a record; ValueError unless well formed and signed with ``key``."""
    if len(data) > _MAX_RECORD_BYTES:
        raise ValueError(f"{len(data)} bytes, more than {_MAX_RECORD_BYTES}")
    try:
        record = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ValueError("not a JSON run nonce record") from None
    if not isinstance(record, dict) or set(record) != {"v", "nonce", "mac"}:
        raise ValueError("not a run nonce record with fields v, nonce, mac")
    nonce, mac = record["nonce"], record["mac"]
    if record["v"] != 1 or not isinstance(nonce, str) or not _NONCE_RE.fullmatch(nonce):
        raise ValueError("not a version 1 record of 32 hex digits")
    if not isinstance(mac, str) or not verify(key, context, nonce.encode("ascii"), mac):
        raise ValueError("not signed with this job's key (NVRX_JOB_KEY)")
    return nonce


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
    base = _unwrap(store)
    name, context = _names(run_id, attempt)
    mine = secrets.token_hex(_NONCE_BYTES)
    value = _record(key, context, mine)
    expected: str | bytes = ""
    for _ in range(_MAX_TRIES):
        try:
            now = base.compare_set(name, expected, value)  # type: ignore[arg-type]
        except (RuntimeError, NotImplementedError):
            return _by_claim(base, key, name, context, mine, value)
        if now == value.encode("ascii"):
            logger.info("created the nonce of this run (%s, attempt %d)", run_id, attempt)
            return mine
        try:
            return _parse(key, context, now)
        except ValueError as exc:
            logger.warning(
                "replacing the run nonce record under %s in the rendezvous store: %s (value %r)",
                name,
                exc,
                now[:120],
            )
        expected = now
    raise RuntimeError(f"{name}: the run nonce record keeps being replaced by invalid values")


def _by_claim(base: Store, key: bytes, name: str, context: str, mine: str, value: str) -> str:
    if int(base.add(f"{name}/claim", 1)) == 1:
        base.set(name, value)
        return mine
    base.wait([name], _CLAIM_WAIT)
    try:
        return _parse(key, context, base.get(name))
    except ValueError as exc:
        raise RuntimeError(f"{name}: the run nonce record in the store is invalid: {exc}") from None
