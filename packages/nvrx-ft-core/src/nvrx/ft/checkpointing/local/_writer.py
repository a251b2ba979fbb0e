"""The background thread that finishes saves (checksums, manifest, preamble, replication).

It runs at a lower priority than the training (``_background``).

One daemon thread runs submitted jobs in order. A job never raises out of the thread:
its exception is logged once per kind and the job counts as failed. ``wait`` waits
for the last submitted job.

``submit`` is on the training thread right after a large copy, when little of Python's
own state is still in the CPU caches: it only counts the job and hands it to a
``queue.SimpleQueue`` (both C code); the thread, not the caller, tells waiters.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from nvrx.ft.checkpointing.local._background import lower_this_thread

__all__: list[str] = []

_logger = logging.getLogger("nvrx.ft.local_checkpoint")


class Writer:
    """A FIFO of jobs run by one background thread."""

    def __init__(self, name: str = "nvrx-local-ckpt-writer") -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._submitted = 0  # jobs handed over (the submitting thread alone writes it)
        self._done = 0  # jobs finished (the writer thread alone writes it)
        self._finished = threading.Condition()
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._submitted += 1
        self._jobs.put(job)

    def busy(self) -> bool:
        return self._done != self._submitted

    def wait(self, timeout: float | None = None) -> bool:
        target = self._submitted
        if self._done >= target:
            return True
        with self._finished:
            return self._finished.wait_for(lambda: self._done >= target, timeout)

    def close(self, timeout: float | None = None) -> bool:
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        lower_this_thread()
        while True:
            job = self._jobs.get()
            if job is None:
                return
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
                with self._finished:
                    self._done += 1
                    self._finished.notify_all()
