"""Why a rank failed, in its own words: the traceback torchrun calls the "Root Cause".

A rank whose entry point is decorated with torch's ``@record``
(``torch.distributed.elastic.multiprocessing.errors.record``) writes its uncaught
exception and traceback as JSON to the error file torch's agent names in
``TORCHELASTIC_ERROR_FILE``. The launcher reads it when the rank fails and puts it in its
own output and in the journal. Without ``@record`` and with the rank's stderr redirected
to a file (``--redirects``/``--log-dir``), the last lines of that file stand in for it,
since nobody else would see them on the console.

The error file is written by user code: whatever it holds is read defensively (size and
type checked); a broken one never takes the launcher down.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

__all__: list[str] = []

_MAX_FILE_BYTES = 1 << 20
_MAX_TEXT = 16 * 1024
_STDERR_TAIL_BYTES = 8 * 1024
_STDERR_TAIL_LINES = 40
# What torch's ProcessFailure uses for "no error file".
_NOT_AVAILABLE = "<N/A>"
_TRACEBACK = "Traceback (most recent call last):"
# c10d's own log lines ("[W1203 11:51:53.009 WorkerServer.cpp:139] ...", with a
# "[rank1]:" prefix where torch knows the rank), written as the process shuts down.
_C10D_LOG_LINE = re.compile(r"^(\[rank\d+\]:)?\[[IWEF]\d{4} ")


@dataclasses.dataclass(frozen=True)
class RootCause:
    """A failed rank's own account of its failure."""

    #: ``Type: message`` of the exception (or the last stderr line).
    message: str
    #: The formatted traceback, or the tail of the rank's stderr.
    traceback: str | None
    #: ``error_file`` (written by ``@record``) or ``stderr`` (tail of the redirected file).
    source: str

    def to_json(self) -> dict[str, Any]:
        """The journal's form."""
        return dataclasses.asdict(self)


def process_failure(local_rank: int, pid: int, exitcode: int, error_file: str) -> ProcessFailure:
    """Torch's ProcessFailure, which raises on an unreadable error file; this never does."""
    try:
        return ProcessFailure(
            local_rank=local_rank, pid=pid, exitcode=exitcode, error_file=error_file
        )
    except Exception:
        return ProcessFailure(
            local_rank=local_rank, pid=pid, exitcode=exitcode, error_file=_NOT_AVAILABLE
        )


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else "...\n" + text[-_MAX_TEXT:]


def _from_error_file(path: str) -> RootCause | None:
    try:
        with open(path, "rb") as stream:
            data = json.loads(stream.read(_MAX_FILE_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    message = data.get("message")
    if isinstance(message, str):
        return RootCause(_clip(message), None, "error_file")
    if not isinstance(message, dict) or not isinstance(message.get("message"), str):
        return None
    extra = message.get("extraInfo")
    stack = extra.get("py_callstack") if isinstance(extra, dict) else None
    return RootCause(
        _clip(message["message"]),
        _clip(stack) if isinstance(stack, str) else None,
        "error_file",
    )


def _from_stderr(path: str) -> RootCause | None:
    try:
        with open(path, "rb") as stream:
            stream.seek(max(0, os.fstat(stream.fileno()).st_size - _STDERR_TAIL_BYTES))
            tail = stream.read(_STDERR_TAIL_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [line for line in tail.splitlines() if line.strip()][-_STDERR_TAIL_LINES:]
    if not lines:
        return None
    return RootCause(_exception_line(lines), "\n".join(lines), "stderr")


def _exception_line(lines: list[str]) -> str:
    """The ``Type: message`` line of the last traceback in ``lines``, else the last line
    that is not one of torch's shutdown log lines (printed after the traceback)."""
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    if starts:
        after = lines[starts[-1] + 1 :]
        found = [line for line in after if not line[:1].isspace()]
        if found:
            return found[0]
    own = [line for line in lines if not _C10D_LOG_LINE.match(line)]
    return (own or lines)[-1]


def root_cause(failure: ProcessFailure, stderr_file: str | None) -> RootCause | None:
    """The failed rank's traceback from its error file, else its redirected stderr."""
    found = None
    if failure.error_file and failure.error_file != _NOT_AVAILABLE:
        found = _from_error_file(failure.error_file)
    if found is None and stderr_file and stderr_file != os.devnull:
        found = _from_stderr(stderr_file)
    return found
