"""Plain value types shared by the rank, its monitor and the launcher."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

__all__ = [
    "FT_LAUNCHER_IPC_SOCKET_ENV_VAR",
    "FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR",
    "MAX_DURATION_S",
    "MONITOR_SOCKET_ENV",
    "HeartbeatTimeouts",
    "SectionAction",
    "SectionTimeouts",
    "WorkloadAction",
    "WorkloadControlRequest",
    "monitor_socket_from_env",
]

#: Environment variable holding the path of this rank's monitor socket (set by the launcher).
MONITOR_SOCKET_ENV = "NVRX_FT_MONITOR_SOCKET"
#: NVRx's constant name for the same thing; it holds our variable's name. The client also
#: reads NVRx's variable ``FT_RANK_MONITOR_IPC_SOCKET`` when ours is not set.
FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR = MONITOR_SOCKET_ENV
#: NVRx's rank-to-launcher socket variable. Workload control requests reach the launcher
#: through the rank's monitor here, so nvrx never sets or reads it; the name exists
#: so code that references it keeps importing.
FT_LAUNCHER_IPC_SOCKET_ENV_VAR = "FT_LAUNCHER_IPC_SOCKET"
_NVRX_MONITOR_SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"


def monitor_socket_from_env(environ: Mapping[str, str]) -> str | None:
    """This rank's monitor socket: ours, else NVRx's variable (None when neither is set)."""
    return environ.get(MONITOR_SOCKET_ENV) or environ.get(_NVRX_MONITOR_SOCKET_ENV) or None


@dataclasses.dataclass
class HeartbeatTimeouts:
    """The two heartbeat timeouts in seconds (``None`` disables one) and their origin."""

    initial: float | None = None
    subsequent: float | None = None
    were_calculated: bool | None = None

    @property
    def are_valid(self) -> bool:
        """True when both timeouts are set."""
        return self.initial is not None and self.subsequent is not None

    def __str__(self) -> str:
        return (
            f"HeartbeatTimeouts(initial={_fmt(self.initial)}, "
            f"subsequent={_fmt(self.subsequent)}, were_calculated={self.were_calculated})"
        )


@dataclasses.dataclass
class SectionTimeouts:
    """Per-section and out-of-section timeouts in seconds, and which ones were calculated."""

    section: dict[str, float | None] = dataclasses.field(default_factory=dict)
    out_of_section: float | None = None
    calculated_sections: set[str] = dataclasses.field(default_factory=set)
    is_out_of_section_calculated: bool = False

    def __post_init__(self) -> None:
        self.section = dict(self.section)
        self.calculated_sections = set(self.calculated_sections)

    @property
    def were_calculated(self) -> bool:
        """True when every section and the out-of-section timeout were calculated."""
        return self.calculated_sections == set(self.section) and self.is_out_of_section_calculated

    @property
    def are_valid(self) -> bool:
        """True when every section timeout and the out-of-section timeout are set."""
        return self.out_of_section is not None and all(v is not None for v in self.section.values())

    def __str__(self) -> str:
        sections = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(self.section.items()))
        return (
            f"SectionTimeouts(section={{{sections}}}, out_of_section={_fmt(self.out_of_section)}, "
            f"calculated_sections={sorted(self.calculated_sections)}, "
            f"is_out_of_section_calculated={self.is_out_of_section_calculated})"
        )


def _fmt(value: float | None) -> str:
    return "None" if value is None else f"{value:.2f}"


class SectionAction(enum.Enum):
    """What happened to a section (NVRx has it in ``data``; ``timeouts_calc`` re-exports it)."""

    OPEN = 1
    CLOSE = 2
    CLOSE_ALL = 3


class WorkloadAction(enum.Enum):
    """What a rank asks the launcher to do with the workload."""

    Continue = 0
    ExcludeThisNode = 1
    ShutdownWorkload = 2


@dataclasses.dataclass(frozen=True)
class WorkloadControlRequest:
    """A rank's request to the launcher, with a human-readable reason."""

    action: WorkloadAction
    description: str = "<not set>"

    def __post_init__(self) -> None:
        if not isinstance(self.action, WorkloadAction):
            raise ValueError(
                f"WorkloadControlRequest.action: {self.action!r} is not a WorkloadAction"
            )
        if not isinstance(self.description, str):
            raise ValueError(
                f"WorkloadControlRequest.description: {self.description!r} is not a string"
            )


def workload_action_from_name(name: object) -> WorkloadAction:
    """The action named ``name`` (its enum name); a ValueError names a bad one."""
    if isinstance(name, str) and name in WorkloadAction.__members__:
        return WorkloadAction[name]
    raise ValueError(
        f"workload action {name!r} is not one of {', '.join(WorkloadAction.__members__)}"
    )


#: The longest duration (seconds) any timeout, interval or grace period may have: 30 days.
#: Every place a duration enters (config, YAML, CLI, state files, control messages)
#: refuses a longer one, so no conversion to nanoseconds can overflow.
MAX_DURATION_S = 30 * 24 * 3600.0
