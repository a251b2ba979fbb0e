"""Machine-readable records of what the launcher did: JSON lines appended to a file.

Two files use it: the journal (``--ft-journal``: every event of the run) and the cycle
log (``--ft-cycle-log``: one record per cycle end). Each line is written with a single
``write`` on an ``O_APPEND`` descriptor, so launchers of several nodes can share a file.

Every record carries ``schema_version`` (:data:`SCHEMA_VERSION`). The JSON Schemas of
both files ship with the package (``nvrx/launcher/schemas/journal.schema.json`` and
``cycle.schema.json``, see :func:`schema_path`); the version moves whenever a field is
removed or changes meaning, not when one is added.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pathlib
import stat
import time
from collections.abc import Callable
from typing import Any

__all__ = ["SCHEMA_VERSION", "JsonLines", "schema_path"]

#: Version of the journal and cycle-log records (their ``schema_version`` field).
SCHEMA_VERSION = 1


def schema_path(name: str) -> pathlib.Path:
    """The JSON Schema file of ``name``: ``"journal"`` or ``"cycle"``."""
    if name not in ("journal", "cycle"):
        raise ValueError(f"no schema named {name!r}")
    return pathlib.Path(__file__).with_name("schemas") / f"{name}.schema.json"


logger = logging.getLogger("nvrx.launcher")
# Never through a symlink (another user's, planted in a shared directory), never blocking
# on a FIFO; the descriptor does not leak into the ranks.
_APPEND_FLAGS = (
    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
)


class JsonLines:
    """Appends one JSON object per line to ``path`` (does nothing when ``path`` is None)."""

    def __init__(self, path: str | os.PathLike[str] | None, node: str | None = None) -> None:
        self._path = None if path is None else os.fspath(path)
        self.node = node
        #: Called with each finished record (also when ``path`` is None), e.g. by the
        #: agent's goodput ledger; what it raises is logged once and otherwise ignored.
        self.on_record: Callable[[dict[str, Any]], None] | None = None
        self._warned = False
        self._observer_warned = False

    @property
    def path(self) -> str | None:
        """Where the records go, if anywhere."""
        return self._path

    def stamp(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` with ``schema_version``, ``t`` and ``node`` where it has none."""
        record.setdefault("schema_version", SCHEMA_VERSION)
        record.setdefault("t", time.time())  # wall clock: label
        if self.node is not None:
            record.setdefault("node", self.node)
        return record

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (plus ``schema_version``, ``t`` and ``node``); errors logged once."""
        self.stamp(record)
        if self.on_record is not None:
            try:
                self.on_record(record)
            except Exception as exc:  # accounting never stops the launcher
                if not self._observer_warned:
                    self._observer_warned = True
                    logger.warning("journal observer failed: %r (further errors not logged)", exc)
        if self._path is None:
            return
        line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode("utf-8")
        try:
            parent = os.path.dirname(self._path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            fd = os.open(self._path, _APPEND_FLAGS, 0o644)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file")
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning("cannot write %s: %s (further errors not logged)", self._path, exc)
