"""The straggler reports rank 0 publishes, read by its node's launcher.

The agent gives every rank ``NVRX_STRAGGLER_SCORES_FILE`` (nvrx.ft's
:data:`~nvrx.ft.STRAGGLER_SCORES_ENV`), a path in the launcher's private runtime
directory; rank 0 writes its reports there (:func:`nvrx.ft.publish_straggler_report`).
:class:`StragglerFeed` looks at the file from the agent's tick, at most once per period,
reads it only when its size, modification time or inode changed, and never raises: a
file that cannot be used is logged once (WARNING, later DEBUG) and handed to
``on_ignored`` once per version of the file. Nothing here runs on a rank.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from nvrx.ft import StragglerScores, read_straggler_scores

from .goodput import StragglerWait

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

#: The file's name in the launcher's runtime directory.
SCORES_FILE_NAME = "straggler_scores.json"
#: How often the agent's tick may look at the file (one ``stat``).
POLL_PERIOD_S = 1.0


class StragglerFeed:
    """Reads the straggler-scores file at ``path`` when it changes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        on_ignored: Callable[[str], None] | None = None,
        period_s: float = POLL_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = os.fspath(path)
        self._on_ignored = on_ignored
        self._period_s = period_s
        self._clock = clock
        self._next = 0.0
        self._seen: tuple[int, int, int] | None = None
        self._warned = False
        #: When the last report used was written: the next one's window start if it has none.
        self._last_written: float | None = None

    def poll(self) -> StragglerScores | None:
        """The new report if the file changed since the last look, else None; never raises."""
        now = self._clock()
        if now < self._next:
            return None
        self._next = now + self._period_s
        try:
            st = os.stat(self.path)
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
        """The report's straggler wait: its window times ``1 - median / max`` of the step times.

        The window is the report's own, else from the previous report's writing to this
        one's. None without step times for two ranks or without a window.
        """
        start = scores.window_start if scores.window_start is not None else self._last_written
        end = scores.window_end if scores.window_end is not None else scores.written_at
        self._last_written = scores.written_at
        steps = scores.step_s
        if start is None or end < start or len(steps) < 2:
            return None
        return StragglerWait.from_step_times(start, end, steps)

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
