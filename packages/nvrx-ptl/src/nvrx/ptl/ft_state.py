"""The FT state file: calculated timeouts handed from one training job to the next.

Each FT callback uses the file name NVRx's callback of the same name uses, so state
written by NVRx is found after switching (and the other way round):
``<ft_dir>/_ft_state.json`` for FaultToleranceCallback (heartbeat timeouts) and
``<ft_dir>/_ft_state_.json`` for FaultToleranceSectionsCallback (section timeouts).
Two names also keep one callback's timeouts away from the other: heartbeat timeouts
loaded by a sections-only job would make the monitor wait for heartbeats that never
come.

The content is ``RankMonitorClient.state_dict()`` as JSON, the shape NVRx 0.4 to 0.7
write (``{"current_timeouts": {"heartbeat": {...}, "section": {...}}}``); the flat
heartbeat shape of NVRx 0.1/0.2 is read too. A file is written atomically (temporary
file, fsync, ``os.replace``). A file that is unusable anyway (truncated, edited by
hand, hostile: NaN, Infinity, wrong types, deep nesting, absurd values) is refused
with :class:`FtStateError` saying why, and the callback falls back to the FT config's
timeouts.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "FT_DIR_NAME",
    "HEARTBEAT_STATE_FILENAME",
    "MAX_STATE_FILE_BYTES",
    "MAX_TIMEOUT_S",
    "SECTIONS_STATE_FILENAME",
    "FtStateError",
    "load_ft_state",
    "parse_ft_state",
    "save_ft_state",
]

#: Name of the state directory under ``trainer.log_dir`` when no ``exp_dir`` is given.
FT_DIR_NAME = "ft_state"
#: State file of FaultToleranceCallback (NVRx's ``FaultToleranceCallback.TIMEOUTS_FILENAME``).
HEARTBEAT_STATE_FILENAME = "_ft_state.json"
#: State file of FaultToleranceSectionsCallback (NVRx's, with its trailing underscore).
SECTIONS_STATE_FILENAME = "_ft_state_.json"
#: Largest timeout accepted from a state file: 30 days, the bound of nvrx.ft's config.
MAX_TIMEOUT_S = 30 * 24 * 3600.0
#: A real state file is a few hundred bytes; anything above this is not one.
MAX_STATE_FILE_BYTES = 1 << 20
_MAX_SECTIONS = 1024

_KEY = "current_timeouts"


class FtStateError(ValueError):
    """The FT state file exists but cannot be used."""


def _timeout(where: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FtStateError(f"{where} must be a number of seconds or null, got {value!r:.80}")
    try:
        result = float(value)
    except OverflowError:  # an int beyond any float
        result = math.inf
    if not math.isfinite(result) or result <= 0 or result > MAX_TIMEOUT_S:
        raise FtStateError(
            f"{where} = {value!r:.80} is not a timeout: it must be finite, > 0 and at most "
            f"{MAX_TIMEOUT_S:.0f} s (30 days)"
        )
    return result


def _flag(where: str, value: object, nullable: bool) -> bool | None:
    if value is None and nullable:
        return None
    if not isinstance(value, bool):
        raise FtStateError(f"{where} must be true or false, got {value!r:.80}")
    return value


def _mapping(where: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise FtStateError(f"{where} must be a JSON object, got {value!r:.80}")
    return value


def _heartbeat(raw: object) -> dict[str, Any]:
    hb = _mapping("heartbeat", raw)
    return {
        "initial": _timeout("heartbeat.initial", hb.get("initial")),
        "subsequent": _timeout("heartbeat.subsequent", hb.get("subsequent")),
        "were_calculated": _flag("heartbeat.were_calculated", hb.get("were_calculated"), True),
    }


def _section(raw: object) -> dict[str, Any]:
    sec = _mapping("section", raw)
    timeouts = _mapping("section.section", sec.get("section", {}))
    if len(timeouts) > _MAX_SECTIONS:
        raise FtStateError(
            f"section.section has {len(timeouts)} sections (at most {_MAX_SECTIONS})"
        )
    calculated = sec.get("calculated_sections", [])
    if not isinstance(calculated, list) or not all(isinstance(n, str) for n in calculated):
        raise FtStateError(
            f"section.calculated_sections must be a list of names, got {calculated!r:.80}"
        )
    return {
        "section": {
            str(n): _timeout(f"section.section[{n!r:.40}]", v) for n, v in timeouts.items()
        },
        "out_of_section": _timeout("section.out_of_section", sec.get("out_of_section")),
        "calculated_sections": sorted(set(calculated) & set(timeouts)),
        "is_out_of_section_calculated": _flag(
            "section.is_out_of_section_calculated",
            sec.get("is_out_of_section_calculated", False),
            False,
        ),
    }


def _reject_constant(name: str) -> float:
    raise FtStateError(f"{name} is not a timeout (JSON has no NaN or Infinity)")


def parse_ft_state(text: str) -> dict[str, Any]:
    """Validate a state file's text; return the canonical state dict, or raise FtStateError.

    Every timeout must be finite, > 0 and at most :data:`MAX_TIMEOUT_S`, or null;
    flags must be booleans. Keys nvrx does not use are dropped. NVRx 0.1/0.2's flat
    heartbeat state (``current_timeouts: {initial, subsequent, were_calculated}``)
    comes back in today's shape.
    """
    try:
        state = json.loads(text, parse_constant=_reject_constant)
    except FtStateError:
        raise
    except RecursionError:
        raise FtStateError("it is nested too deeply to be an FT state") from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise FtStateError(f"it is not valid JSON (corrupt or truncated?): {exc}") from None
    if not isinstance(state, dict) or not isinstance(state.get(_KEY), dict):
        raise FtStateError(f"expected a JSON object with a {_KEY!r} object, got {text[:120]!r}")
    current: dict[str, Any] = state[_KEY]
    if "heartbeat" not in current and "section" not in current and "initial" in current:
        current = {"heartbeat": current}  # NVRx 0.1/0.2
    out: dict[str, Any] = {}
    if current.get("heartbeat") is not None:
        out["heartbeat"] = _heartbeat(current["heartbeat"])
    if current.get("section") is not None:
        out["section"] = _section(current["section"])
    return {_KEY: out}


def load_ft_state(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Read and validate a state file (:func:`parse_ft_state`); None when there is none yet.

    Raises FtStateError, naming the file and the problem, when the file cannot be read
    or is not a valid FT state.
    """
    file = Path(path)
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_STATE_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FtStateError(f"cannot read FT state file {file}: {exc}") from exc
    if len(data) > MAX_STATE_FILE_BYTES:
        raise FtStateError(f"FT state file {file} is larger than {MAX_STATE_FILE_BYTES} bytes")
    try:
        return parse_ft_state(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise FtStateError(f"FT state file {file} is not UTF-8 text: {exc}") from None
    except FtStateError as exc:
        raise FtStateError(f"FT state file {file}: {exc}") from None


def save_ft_state(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write a state file atomically; the directory must exist."""
    file = Path(path)
    payload = json.dumps(state, indent=2, sort_keys=True, allow_nan=False) + "\n"
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
