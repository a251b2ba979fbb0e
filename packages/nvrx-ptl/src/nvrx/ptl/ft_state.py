"""The FT state file: calculated timeouts handed from one training job to the next.

Each FT callback uses the file name NVRx's callback of the same name uses, so state
written by NVRx is found after switching (and the other way round):
``<ft_dir>/_ft_state.json`` for FaultToleranceCallback (heartbeat timeouts) and
``<ft_dir>/_ft_state_.json`` for FaultToleranceSectionsCallback (section timeouts).
Two names also keep one callback's timeouts away from the other: heartbeat timeouts
loaded by a sections-only job would make the monitor wait for heartbeats that never
come; so each callback also loads only its own part of a file.

The content is ``RankMonitorClient.state_dict()`` as JSON, the shape NVRx writes. It is
read through :func:`nvrx.ft.read_timeouts_state_file`, which validates everything
(NVRx's shapes, finite timeouts in (0, 30 days], types, size, nesting) and raises
:class:`nvrx.ft.FtStateError` saying why; the callback then falls back to the FT
config's timeouts. A file is written atomically (:func:`nvrx.ft.write_file_atomically`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from nvrx.ft import FtStateError, read_timeouts_state_file, write_file_atomically

__all__ = [
    "FT_DIR_NAME",
    "FT_STATE_FILENAME",
    "HEARTBEAT_STATE_FILENAME",
    "SECTIONS_STATE_FILENAME",
    "FtStateError",
    "StatePart",
    "load_ft_state",
    "save_ft_state",
]

#: Name of the state directory under ``trainer.log_dir`` when no ``exp_dir`` is given.
FT_DIR_NAME = "ft_state"
#: State file of FaultToleranceCallback (NVRx's ``FaultToleranceCallback.TIMEOUTS_FILENAME``).
HEARTBEAT_STATE_FILENAME = "_ft_state.json"
#: State file of FaultToleranceSectionsCallback (NVRx's, with its trailing underscore).
SECTIONS_STATE_FILENAME = "_ft_state_.json"
#: Earlier name of :data:`HEARTBEAT_STATE_FILENAME` (kept: tests-integration uses it).
FT_STATE_FILENAME = HEARTBEAT_STATE_FILENAME

#: The part of an FT state a callback calculates and loads.
StatePart = Literal["heartbeat", "section"]


def load_ft_state(
    path: str | os.PathLike[str], part: StatePart = "heartbeat"
) -> dict[str, Any] | None:
    """Read and validate a state file; return a ``load_state_dict`` input with ``part`` only.

    None when there is no file, or it holds no ``part`` timeouts. Raises FtStateError,
    naming the file and the problem, when the file cannot be used.
    """
    try:
        loaded = read_timeouts_state_file(path)
    except FileNotFoundError:
        return None
    if part == "heartbeat":
        if loaded.heartbeat is None:
            return None
        return {"current_timeouts": {"heartbeat": dataclasses.asdict(loaded.heartbeat)}}
    if loaded.section is None:
        return None
    section = dataclasses.asdict(loaded.section)
    section["calculated_sections"] = sorted(loaded.section.calculated_sections)
    return {"current_timeouts": {"section": section}}


def save_ft_state(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write a state file atomically; the directory must exist."""
    payload = json.dumps(state, indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_file_atomically(path, payload)
