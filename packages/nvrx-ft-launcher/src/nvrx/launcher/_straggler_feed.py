"""The straggler reports rank 0 publishes, read by its node's launcher.

The agent gives every rank ``NVRX_STRAGGLER_SCORES_FILE`` (nvrx.ft's
:data:`~nvrx.ft.STRAGGLER_SCORES_ENV`), a path in the launcher's private runtime
directory; rank 0 writes its reports there (:func:`nvrx.ft.publish_straggler_report`).
:class:`StragglerFeed` looks at the file from the agent's tick, at most once per period,
reads it only when its size, modification time or inode changed, and never raises: a
file that cannot be used is logged once per launcher (WARNING, later ones DEBUG) and
handed to ``on_ignored`` once per version of the file. Nothing here runs on a rank.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from nvrx.ft import StragglerScores, read_straggler_scores

from .goodput import StragglerWait
from .metrics import NULL_RECORDER, NullRecorder

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

#: The file's name in the launcher's runtime directory.
SCORES_FILE_NAME = "straggler_scores.json"
#: How often the agent's tick may look at the file (one ``stat``).
POLL_PERIOD_S = 1.0
#: The score kinds the gauges hold.
_KINDS = ("relative", "individual")


class StragglerFeed:
    """Reads the straggler-scores file at ``path`` when it changes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        on_ignored: Callable[[str], None] | None = None,
        period_s: float = POLL_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
        metrics: NullRecorder = NULL_RECORDER,
    ) -> None:
        self.path = os.fspath(path)
        self._metrics = metrics
        self._on_ignored = on_ignored
        self._period_s = period_s
        self._clock = clock
        self._next = 0.0
        self._seen: tuple[int, int, int] | None = None
        self._warned = False
        #: Where the last report's window ended (its own end, else its writing): the next
        #: one's window starts there at the earliest, so no second counts twice.
        self._last_end: float | None = None
        #: This cycle (number, Unix time it started) and the one before.
        self._cycle: tuple[int, float] | None = None
        self._previous_cycle: int | None = None

    def start_cycle(self, cycle: int, started_at: float) -> None:
        """A new cycle: no score gauge of the last one stays (its rank 0 may have moved to
        another node, its world may have been larger), and a report without a window of
        its own starts none in the previous cycle."""
        if self._cycle is not None:
            self._previous_cycle = self._cycle[0]
        self._cycle = (cycle, started_at)
        self._last_end = None
        for kind in _KINDS:
            self._metrics.straggler_scores({}, kind)

    def show(self, scores: StragglerScores) -> None:
        """The report's scores as the ``nvrx_straggler_score`` gauges (the last report's only)."""
        for kind in _KINDS:
            self._metrics.straggler_scores(scores.scores(kind), kind)

    def cycle_of(self, scores: StragglerScores) -> int | None:
        """The cycle ``scores`` was written in: one written before this cycle started (read
        after a restart) belongs to the previous one."""
        if self._cycle is None:
            return None
        number, started_at = self._cycle
        if scores.written_at < started_at and self._previous_cycle is not None:
            return self._previous_cycle
        return number

    def poll_now(self) -> StragglerScores | None:
        """:meth:`poll` without waiting for the period (the last look before a new cycle)."""
        self._next = 0.0
        return self.poll()

    def poll(self) -> StragglerScores | None:
        """The new report if the file changed since the last look, else None; never raises."""
        now = self._clock()
        if now < self._next:
            return None
        self._next = now + self._period_s
        try:
            st = os.lstat(self.path)  # the reader refuses a link; no need to follow it
        except FileNotFoundError:
            return None  # no report yet
        except OSError as exc:
            self._ignore(exc.strerror or str(exc), None)
            return None
        version = (st.st_mtime_ns, st.st_size, st.st_ino)
        if version == self._seen:
            return None
        self._seen = version
        try:
            scores = read_straggler_scores(self.path)
        except FileNotFoundError:
            return None  # replaced between stat and open: the next look reads it
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._ignore(why, version)
            return None
        except Exception as exc:  # the launcher carries on whatever the file holds
            self._ignore(f"{type(exc).__name__}: {exc}", version)
            return None
        return scores

    def wait(self, scores: StragglerScores) -> StragglerWait | None:
        """The report's straggler wait over its window (:meth:`StragglerScores.wait_fraction`).

        The window is the report's own, else from the previous report's end to this one's
        writing, and starts no earlier than the previous report's end (this cycle's).
        None without a wait fraction (fewer than two forward times) or without a window.
        """
        start = scores.window_start if scores.window_start is not None else self._last_end
        end = scores.window_end if scores.window_end is not None else scores.written_at
        if start is not None and self._last_end is not None:
            start = max(start, self._last_end)
        self._last_end = end if self._last_end is None else max(end, self._last_end)
        fraction = scores.wait_fraction()
        if start is None or end <= start or fraction is None:
            return None
        return StragglerWait(start, end, fraction)

    def _ignore(self, why: str, version: tuple[int, int, int] | None) -> None:
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        logger.log(
            level,
            "straggler scores %s cannot be used (%s); ignored%s",
            self.path,
            why,
            "" if level == logging.DEBUG else " (later ones logged at DEBUG)",
        )
        if self._on_ignored is not None and version is not None:
            try:
                self._on_ignored(why)
            except Exception as exc:  # journaling never stops the launcher
                logger.debug("straggler scores: on_ignored failed: %r", exc)
