"""Signed values in the rendezvous store: one envelope, one way to write, read and reject.

Torch's rendezvous stores have no authentication: whoever reaches the store's port can
write any key. Every value the launchers decide anything by is therefore *sealed* in one
envelope, ``{"v": 1, "body": "<JSON text>", "mac": "<hex>" | null}``: the MAC is
HMAC-SHA256 (:mod:`._job_key`) over a length-prefixed context
``nvrx.launcher/v1/<signed run>/<name>`` and the body bytes, so it binds the wire
version, the run id and the run's nonce (the *signed run*, :func:`._run_nonce.signed_run`)
and the key the value sits under. Without a job key the MAC is null and nothing is
checked but the envelope's shape (as torch's own values).

A value that is not a valid envelope, not signed with the job's key, or whose body its
reader's parser refuses is *rejected*: logged once per distinct value and key (and
reported through a hook, or :func:`journal_rejections`'s: the journal's
``store_value_ignored``), and otherwise treated as absent. Users:
:mod:`._coordination` (decisions, the ``state`` hint, goodput timelines),
:mod:`._group_rank` (each node's key and the round's group ranks),
:mod:`._segment_gate` (places, open markers, results, the last round) and
:mod:`._run_nonce` (the run's nonce record, signed over the run id alone) with
:mod:`._nonce_liveness` (a newcomer's challenges, signed over the run id; the answers,
signed over the signed run of the nonce they vouch for).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from typing import TypeVar

from ._job_key import sign, verify
from ._torch_compat import Store

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

T = TypeVar("T")

#: Version of the envelope (and of the context its MAC is bound to).
WIRE_VERSION = 1
#: compare-and-set rounds against values that keep being replaced by invalid ones.
MAX_CAS_TRIES = 16
#: Distinct rejected values remembered (so each is logged once), at most.
_MAX_REMEMBERED = 1024

#: Called with (store key, why it was ignored) for each value ignored (once per value).
RejectHook = Callable[[str, str], None]

#: Where rejections without a hook of their own go: the launcher's journal, once its
#: agent is up (one launcher per process). The run nonce, the group ranks and the
#: segment gate read signed values without a hook; the coordination has its own.
_journal_hook: RejectHook | None = None


def journal_rejections(hook: RejectHook | None) -> RejectHook | None:
    """Report rejections that have no hook of their own to ``hook`` (None: only log
    them); returns the hook it replaces."""
    global _journal_hook
    previous, _journal_hook = _journal_hook, hook
    return previous


def context(signed_run: str, name: str) -> str:
    """What a MAC binds besides the body: wire version, signed run, store key."""
    return f"nvrx.launcher/v{WIRE_VERSION}/{signed_run}/{name}"


def seal(key: bytes | None, signed_run: str, name: str, body: str) -> str:
    """``body`` in the envelope, signed with ``key`` (null MAC without one)."""
    mac = None if key is None else sign(key, context(signed_run, name), body.encode("utf-8"))
    return json.dumps({"v": WIRE_VERSION, "body": body, "mac": mac}, separators=(",", ":"))


def unseal(
    key: bytes | None,
    signed_run: str,
    name: str,
    data: bytes | str,
    *,
    max_bytes: int | None = None,
) -> str:
    """The body of the envelope ``data`` read under ``name``; ValueError says what is wrong."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if max_bytes is not None and len(raw) > max_bytes:
        raise ValueError(f"{len(raw)} bytes, more than {max_bytes}")
    try:
        envelope = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not a JSON envelope ({exc})") from None
    if not isinstance(envelope, dict) or set(envelope) != {"v", "body", "mac"}:
        raise ValueError("not an envelope with fields v, body, mac")
    if envelope["v"] != WIRE_VERSION:
        raise ValueError(f"wire version {envelope['v']!r}, expected {WIRE_VERSION}")
    body, mac = envelope["body"], envelope["mac"]
    if not isinstance(body, str) or not (mac is None or isinstance(mac, str)):
        raise ValueError("body must be a string and mac a string or null")
    if key is not None and (
        mac is None or not verify(key, context(signed_run, name), body.encode("utf-8"), mac)
    ):
        raise ValueError(
            "not signed with this job's key (NVRX_JOB_KEY) for this run (a value "
            "of an earlier run of the job does not verify)"
        )
    return body


class Rejections:
    """Logs each distinct rejected value once (per store key), and reports it to a hook."""

    def __init__(self, on_reject: RejectHook | None = None) -> None:
        self._on_reject = on_reject
        self._seen: set[tuple[str, bytes]] = set()

    def __call__(self, where: str, data: bytes | str, why: str) -> None:
        raw = data.encode("utf-8", "replace") if isinstance(data, str) else data
        seen = (where, hashlib.sha256(raw).digest())  # bounded memory, whatever was written
        if seen in self._seen:
            return
        if len(self._seen) < _MAX_REMEMBERED:
            self._seen.add(seen)
        logger.warning(
            "ignoring the value under %s in the rendezvous store: %s (value %r)",
            where,
            why,
            raw[:120],
        )
        hook = self._on_reject if self._on_reject is not None else _journal_hook
        if hook is not None:
            hook(where, why)


class SignedStore:
    """Sealed values under one store (a prefix store or the base store) for one run.

    ``prefix`` is how log lines and the reject hook name the store (the prefix its keys
    sit under, if any); ``max_bytes`` bounds what a read accepts.
    """

    def __init__(
        self,
        store: Store,
        key: bytes | None,
        signed_run: str,
        *,
        prefix: str = "",
        rejections: Rejections | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.store = store
        self._key = key
        self._signed_run = signed_run
        self._prefix = prefix
        self._rejections = rejections if rejections is not None else Rejections()
        self._max_bytes = max_bytes

    @property
    def signed_run(self) -> str:
        """The run the values are bound to (run id and, with a job key, the nonce)."""
        return self._signed_run

    @property
    def authenticated(self) -> bool:
        """True when values are signed and checked with a job key."""
        return self._key is not None

    def where(self, name: str) -> str:
        """``name`` as log lines and the reject hook show it."""
        return f"{self._prefix}/{name}" if self._prefix else name

    def seal(self, name: str, body: str) -> str:
        return seal(self._key, self._signed_run, name, body)

    def unseal(self, name: str, data: bytes | str) -> str:
        return unseal(self._key, self._signed_run, name, data, max_bytes=self._max_bytes)

    def set(self, name: str, body: str) -> None:
        """Write ``body`` sealed under ``name`` (replacing whatever is there)."""
        self.store.set(name, self.seal(name, body))

    def reject(self, name: str, data: bytes | str, why: str) -> None:
        """Log (once per value) and report a value under ``name`` that is ignored."""
        self._rejections(self.where(name), data, why)

    def parse(self, name: str, data: bytes | str, parse: Callable[[str], T]) -> T | None:
        """``parse`` of the body of ``data`` (read under ``name``); None when rejected."""
        try:
            return parse(self.unseal(name, data))
        except ValueError as exc:
            self.reject(name, data, str(exc))
            return None

    def read(self, name: str, parse: Callable[[str], T]) -> T | None:
        """The parsed value under ``name``; None when absent or rejected."""
        if not self.store.check([name]):
            return None
        return self.parse(name, self.store.get(name), parse)

    def compare_set(
        self,
        name: str,
        body: str,
        *,
        stands: Callable[[bytes], bool] | None = None,
        tries: int = MAX_CAS_TRIES,
    ) -> bool | None:
        """Put ``body`` under ``name`` unless a value is there already; True if it is ours.

        compare-and-set from absent, so two writers never both win. With ``stands``, a
        value there for which it is false (not valid) is replaced exactly, up to
        ``tries`` rounds; without, any value there stands. False: another value stands;
        None: this store has no compare-and-set (torch's EtcdStore).
        """
        value = self.seal(name, body)
        expected: str | bytes = ""
        for _ in range(max(tries, 1)):
            try:
                now = self.store.compare_set(name, expected, value)  # type: ignore[arg-type]
            except (RuntimeError, NotImplementedError) as exc:
                logger.debug("no compare-and-set on this store: %s", exc)
                return None
            if now == value.encode("utf-8"):
                return True
            if stands is None or stands(now):
                return False
            expected = now  # an invalid value (forged, or garbage): replace exactly it
        return False
