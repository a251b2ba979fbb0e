"""The background thread that finishes saves (checksums, manifest, preamble, replication).

One daemon thread runs submitted jobs in order. A job never raises out of the thread:
its exception is logged once per kind and the job counts as failed. ``wait`` waits
for the last submitted job.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__: list[str] = []

_logger = logging.getLogger("nvrx.ft.local_checkpoint")


class Writer:
    """A FIFO of jobs run by one background thread."""

    def __init__(self, name: str = "nvrx-local-ckpt-writer") -> None:
        self._jobs: queue.Queue[tuple[Callable[[], None], threading.Event] | None] = queue.Queue()
        self._last: threading.Event | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._warned: set[str] = set()

    def submit(self, job: Callable[[], None]) -> threading.Event:
        done = threading.Event()
        self._last = done
        self._jobs.put((job, done))
        return done

    def busy(self) -> bool:
        return self._last is not None and not self._last.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        last = self._last
        return True if last is None else last.wait(timeout)

    def close(self, timeout: float | None = None) -> bool:
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, done = item
            try:
                job()
            except Exception as exc:  # a background job never kills the thread
                kind = type(exc).__name__
                if kind not in self._warned:
                    self._warned.add(kind)
                    _logger.warning("a local checkpoint save failed in the background: %s", exc)
                else:
                    _logger.debug("a local checkpoint save failed in the background: %s", exc)
            finally:
                done.set()
