"""Reading saved FT state (calculated timeouts) without trusting it.

A state file outlives the run that wrote it: it may come from NVRx, from an older nvrx,
be truncated by a full disk, or be edited by hand. Everything here validates the
shape and every value (a finite number of seconds in (0, MAX_DURATION_S], booleans
where booleans belong, bounded size and nesting) and reports what is wrong in one
:class:`FtStateError`, so a caller can fall back to the configured timeouts and say
why once instead of crashing every restart.

Accepted shapes, all under ``"current_timeouts"``:

- ``{"heartbeat": {...}, "section": {...}}`` (either part optional): what
  :meth:`nvrx.ft.RankMonitorClient.state_dict` and NVRx 0.4+ write (Megatron-LM saves it
  as ``ft_state.json``, NVRx's Lightning callbacks as ``_ft_state.json``/``_ft_state_.json``);
- ``{"initial": ..., "subsequent": ..., "were_calculated": ...}``: NVRx before 0.4, whose
  client had heartbeat timeouts only;
- ``{}`` or no ``"current_timeouts"`` at all: nothing was calculated.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from collections.abc import Mapping
from typing import Any

from nvrx.ft.data import MAX_DURATION_S, HeartbeatTimeouts, SectionTimeouts

__all__ = [
    "CURRENT_TIMEOUTS_STATE_KEY",
    "MAX_STATE_FILE_BYTES",
    "FtStateError",
    "LoadedTimeouts",
    "parse_timeouts_state",
    "read_timeouts_state_file",
]

CURRENT_TIMEOUTS_STATE_KEY = "current_timeouts"
#: Largest state file read (a real one is a few hundred bytes).
MAX_STATE_FILE_BYTES = 1024 * 1024
_MAX_DEPTH = 8
_MAX_SECTIONS = 256


class FtStateError(ValueError):
    """Saved FT state that cannot be used; the message says why."""


@dataclasses.dataclass(frozen=True)
class LoadedTimeouts:
    """Validated timeouts from saved state; ``None`` where the state had none."""

    heartbeat: HeartbeatTimeouts | None = None
    section: SectionTimeouts | None = None

    @property
    def is_empty(self) -> bool:
        """True when the state carried no timeouts at all."""
        return self.heartbeat is None and self.section is None


def _depth(value: object, limit: int) -> int:
    if limit < 0:
        return 1
    if isinstance(value, Mapping):
        return 1 + max((_depth(v, limit - 1) for v in value.values()), default=0)
    if isinstance(value, (list, tuple)):
        return 1 + max((_depth(v, limit - 1) for v in value), default=0)
    return 0


def _seconds(where: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FtStateError(f"{where} is {value!r}, not a number of seconds")
    try:
        result = float(value)
    except OverflowError:
        raise FtStateError(f"{where} is too large") from None
    if not math.isfinite(result) or not 0 < result <= MAX_DURATION_S:
        raise FtStateError(f"{where} is {value!r}: must be finite, > 0 and <= {MAX_DURATION_S:.0f}")
    return result


def _flag(where: str, value: object, *, optional: bool) -> bool | None:
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise FtStateError(f"{where} is {value!r}, not true/false")
    return value


def _mapping(where: str, value: object, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FtStateError(f"{where} is a {type(value).__name__}, not a mapping")
    extra = sorted(str(k) for k in value if k not in allowed)
    if extra:
        raise FtStateError(f"{where} has unexpected keys {extra}")
    return value


def _heartbeat(where: str, value: object) -> HeartbeatTimeouts:
    hb = _mapping(where, value, {"initial", "subsequent", "were_calculated"})
    return HeartbeatTimeouts(
        initial=_seconds(f"{where}.initial", hb.get("initial")),
        subsequent=_seconds(f"{where}.subsequent", hb.get("subsequent")),
        were_calculated=_flag(f"{where}.were_calculated", hb.get("were_calculated"), optional=True),
    )


def _section(where: str, value: object) -> SectionTimeouts:
    sec = _mapping(
        where,
        value,
        {"section", "out_of_section", "calculated_sections", "is_out_of_section_calculated"},
    )
    sections = sec.get("section", {})
    if not isinstance(sections, Mapping) or len(sections) > _MAX_SECTIONS:
        raise FtStateError(f"{where}.section must map at most {_MAX_SECTIONS} names to seconds")
    parsed: dict[str, float | None] = {}
    for name, seconds in sections.items():
        if not isinstance(name, str) or not name or len(name) > 256:
            raise FtStateError(f"{where}.section has a bad section name {name!r}")
        parsed[name] = _seconds(f"{where}.section[{name!r}]", seconds)
    calculated = sec.get("calculated_sections", [])
    if not isinstance(calculated, (list, tuple)) or not all(isinstance(n, str) for n in calculated):
        raise FtStateError(f"{where}.calculated_sections must be a list of section names")
    if len(calculated) > _MAX_SECTIONS:
        raise FtStateError(f"{where}.calculated_sections has more than {_MAX_SECTIONS} names")
    return SectionTimeouts(
        section=parsed,
        out_of_section=_seconds(f"{where}.out_of_section", sec.get("out_of_section")),
        calculated_sections=set(calculated),
        is_out_of_section_calculated=bool(
            _flag(
                f"{where}.is_out_of_section_calculated",
                sec.get("is_out_of_section_calculated", False),
                optional=False,
            )
        ),
    )


def parse_timeouts_state(state: object) -> LoadedTimeouts:
    """Validate a state mapping (see the module doc for the shapes); FtStateError says why."""
    if not isinstance(state, Mapping):
        raise FtStateError(f"state is a {type(state).__name__}, not a mapping")
    if _depth(state, _MAX_DEPTH) > _MAX_DEPTH:
        raise FtStateError(f"state is nested deeper than {_MAX_DEPTH} levels")
    if CURRENT_TIMEOUTS_STATE_KEY not in state:
        return LoadedTimeouts()
    current = state[CURRENT_TIMEOUTS_STATE_KEY]
    where = CURRENT_TIMEOUTS_STATE_KEY
    if not isinstance(current, Mapping):
        raise FtStateError(f"{where} is a {type(current).__name__}, not a mapping")
    if not current:
        return LoadedTimeouts()
    if "heartbeat" in current or "section" in current:
        parts = _mapping(where, current, {"heartbeat", "section"})
        hb = parts.get("heartbeat")
        sec = parts.get("section")
        return LoadedTimeouts(
            heartbeat=None if hb is None else _heartbeat(f"{where}.heartbeat", hb),
            section=None if sec is None else _section(f"{where}.section", sec),
        )
    return LoadedTimeouts(heartbeat=_heartbeat(where, current))  # NVRx before 0.4


def _refuse_constant(name: str) -> float:
    raise FtStateError(f"state holds {name}, which is not a number of seconds")


def read_timeouts_state_file(path: str | os.PathLike[str]) -> LoadedTimeouts:
    """Read and validate a JSON state file.

    FileNotFoundError when it does not exist (the caller decides whether that is
    normal); FtStateError, saying why, for anything else that makes it unusable: not a
    regular file, too large, not JSON, NaN/Infinity, bad shape or values.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FtStateError(f"{os.fspath(path)}: cannot open: {exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FtStateError(f"{os.fspath(path)}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            raw = stream.read(MAX_STATE_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_STATE_FILE_BYTES:
        raise FtStateError(f"{os.fspath(path)}: larger than {MAX_STATE_FILE_BYTES} bytes")
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except FtStateError as exc:
        raise FtStateError(f"{os.fspath(path)}: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FtStateError(f"{os.fspath(path)}: not valid JSON: {exc}") from None
    try:
        return parse_timeouts_state(document)
    except FtStateError as exc:
        raise FtStateError(f"{os.fspath(path)}: {exc}") from None
