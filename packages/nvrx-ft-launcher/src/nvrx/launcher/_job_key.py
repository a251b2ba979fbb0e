"""The per-job secret that authenticates job decisions in the rendezvous store.

Torch's rendezvous stores have no authentication: whoever reaches the store's port can
write any key. The launchers of one job therefore sign what they publish there (HMAC-SHA256)
with a key the scheduler gives every node of the job, and ignore what does not verify.

The key comes from the environment, so schedulers and operators need no new option:
``NVRX_JOB_KEY`` holds it, or ``NVRX_JOB_KEY_FILE`` names a file that does (readable by
its owner only). Without either, decisions are not authenticated (as torch's own values).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Mapping

__all__: list[str] = []

KEY_ENV = "NVRX_JOB_KEY"
KEY_FILE_ENV = "NVRX_JOB_KEY_FILE"
#: Shorter keys are refused: a guessable key is no authentication.
MIN_KEY_BYTES = 16
_MAX_KEY_BYTES = 4096


def load_job_key(environ: Mapping[str, str]) -> bytes | None:
    """The job key from ``environ``, or None when none is configured.

    Raises ValueError, naming the variable, for a value that must not be used.
    """
    inline = environ.get(KEY_ENV)
    path = environ.get(KEY_FILE_ENV)
    if inline is not None and path is not None:
        raise ValueError(f"set {KEY_ENV} or {KEY_FILE_ENV}, not both")
    if inline is not None:
        return _checked(inline.encode("utf-8").strip(), KEY_ENV)
    if path is not None:
        return _checked(_read_key_file(path), f"{KEY_FILE_ENV}={path!r}")
    return None


def _read_key_file(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"{KEY_FILE_ENV}={path!r}: cannot open: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{KEY_FILE_ENV}={path!r}: not a regular file")
        if info.st_uid != os.geteuid():
            raise ValueError(f"{KEY_FILE_ENV}={path!r}: owned by uid {info.st_uid}, not by us")
        if info.st_mode & 0o077:
            raise ValueError(
                f"{KEY_FILE_ENV}={path!r}: mode {stat.S_IMODE(info.st_mode):04o} lets others "
                "read it; make it owner-only (chmod 600)"
            )
        return os.read(fd, _MAX_KEY_BYTES + 1).strip()
    finally:
        os.close(fd)


def _checked(key: bytes, where: str) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{where}: the job key needs at least {MIN_KEY_BYTES} bytes")
    if len(key) > _MAX_KEY_BYTES:
        raise ValueError(f"{where}: the job key is longer than {_MAX_KEY_BYTES} bytes")
    return key


def sign(key: bytes, context: str, body: bytes) -> str:
    """The hex MAC of ``body`` bound to ``context`` (run id, store key, purpose)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    encoded = context.encode("utf-8")
    mac.update(len(encoded).to_bytes(4, "big"))
    mac.update(encoded)
    mac.update(body)
    return mac.hexdigest()


def verify(key: bytes, context: str, body: bytes, mac: str) -> bool:
    """True when ``mac`` is ``sign(key, context, body)`` (constant time)."""
    return hmac.compare_digest(sign(key, context, body), mac)
