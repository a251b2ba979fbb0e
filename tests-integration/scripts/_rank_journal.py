"""The test ranks' own event log: JSON lines appended with one ``write`` each.

One ``os.write`` per line on an ``O_APPEND`` file keeps the lines of several ranks from
interleaving, so the tests can read every rank's events from one file.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any


def append_line(path: pathlib.Path, record: dict[str, Any]) -> None:
    """Append ``record`` with the time ``t`` as one JSON line, in a single write."""
    line = json.dumps({**record, "t": time.time()}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def write_atomic(path: pathlib.Path, text: str) -> None:
    """Replace ``path`` with ``text`` so a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Journal:
    """A rank's events, each with the fields given at construction (rank, attempt...)."""

    def __init__(self, path: pathlib.Path, **common: Any) -> None:
        self.path = path
        self.common = common

    def record(self, event: str, **fields: Any) -> None:
        append_line(self.path, {"event": event, **self.common, **fields})
