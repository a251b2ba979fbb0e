"""The FT state file: calculated timeouts handed from one training job to the next.

Both FT callbacks use the same file, ``<ft_dir>/_ft_state.json``, holding
``RankMonitorClient.state_dict()`` as JSON. It is written atomically (temporary
file, fsync, ``os.replace``), so a job killed mid-write never leaves a truncated
file; a file that is unreadable anyway (edited by hand, disk trouble) is reported
clearly and the job falls back to the FT config's timeouts.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "FT_DIR_NAME",
    "FT_STATE_FILENAME",
    "FtStateError",
    "load_ft_state",
    "save_ft_state",
]

#: Name of the state directory under ``trainer.log_dir`` when no ``exp_dir`` is given.
FT_DIR_NAME = "ft_state"
#: Name of the state file, shared by FaultToleranceCallback and FaultToleranceSectionsCallback.
FT_STATE_FILENAME = "_ft_state.json"


class FtStateError(ValueError):
    """The FT state file exists but cannot be used."""


def load_ft_state(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Read a state file; None when there is none yet.

    Raises FtStateError, naming the file and the problem, when the file cannot be
    read, is not JSON (e.g. truncated) or is not an FT state.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise FtStateError(f"cannot read FT state file {file}: {exc}") from exc
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FtStateError(
            f"FT state file {file} is not valid JSON (corrupt or truncated?): {exc}"
        ) from exc
    if not isinstance(state, dict) or not isinstance(state.get("current_timeouts"), dict):
        raise FtStateError(
            f"FT state file {file} is not an FT state: expected a JSON object with a "
            f"'current_timeouts' object, got {text[:200]!r}"
        )
    return state


def save_ft_state(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write a state file atomically; the directory must exist."""
    file = Path(path)
    payload = json.dumps(state, indent=2, sort_keys=True) + "\n"
    fd, tmp_name = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(payload)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, file)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    try:  # make the rename durable; some network file systems cannot fsync a directory
        dir_fd = os.open(file.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
