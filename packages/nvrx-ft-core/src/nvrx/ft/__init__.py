"""Fault tolerance inside each training rank and its monitor process.

Port from NVRx by changing ``nvidia_resiliency_ext.fault_tolerance`` to ``nvrx.ft``.
Names are imported on first use, so a monitor process (or a launcher) only pays for
the modules it touches; importing this package never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvrx.ft._events import MAX_EVENT_BYTES as MAX_EVENT_BYTES
    from nvrx.ft._events import MonitorEvent as MonitorEvent
    from nvrx.ft._events import parse_monitor_event as parse_monitor_event
    from nvrx.ft._files import write_file_atomically as write_file_atomically
    from nvrx.ft._formats.cycle_info import CYCLE_INFO_ENV as CYCLE_INFO_ENV
    from nvrx.ft._formats.cycle_info import CYCLE_INFO_SCHEMA_VERSION as CYCLE_INFO_SCHEMA_VERSION
    from nvrx.ft._formats.cycle_info import CycleGoodput as CycleGoodput
    from nvrx.ft._formats.cycle_info import CycleInfo as CycleInfo
    from nvrx.ft._formats.cycle_info import CycleNode as CycleNode
    from nvrx.ft._formats.cycle_info import cycle_info_schema_path as cycle_info_schema_path
    from nvrx.ft._formats.cycle_info import read_cycle_info as read_cycle_info
    from nvrx.ft._formats.cycle_info import write_cycle_info as write_cycle_info
    from nvrx.ft._formats.straggler_scores import STRAGGLER_SCORES_ENV as STRAGGLER_SCORES_ENV
    from nvrx.ft._formats.straggler_scores import (
        STRAGGLER_SCORES_SCHEMA_VERSION as STRAGGLER_SCORES_SCHEMA_VERSION,
    )
    from nvrx.ft._formats.straggler_scores import RankStragglerScores as RankStragglerScores
    from nvrx.ft._formats.straggler_scores import StragglerReportLike as StragglerReportLike
    from nvrx.ft._formats.straggler_scores import StragglerScores as StragglerScores
    from nvrx.ft._formats.straggler_scores import flush_straggler_reports as flush_straggler_reports
    from nvrx.ft._formats.straggler_scores import (
        publish_straggler_report as publish_straggler_report,
    )
    from nvrx.ft._formats.straggler_scores import read_straggler_scores as read_straggler_scores
    from nvrx.ft._formats.straggler_scores import (
        straggler_scores_schema_path as straggler_scores_schema_path,
    )
    from nvrx.ft._formats.straggler_scores import write_straggler_scores as write_straggler_scores
    from nvrx.ft._health import HealthError as HealthError
    from nvrx.ft._liveness import monitor_beat_age as monitor_beat_age
    from nvrx.ft._logs import log_formatter as log_formatter
    from nvrx.ft._runtime import create_runtime_dir as create_runtime_dir
    from nvrx.ft._stacks import StackSummary as StackSummary
    from nvrx.ft._state import FtStateError as FtStateError
    from nvrx.ft._state import LoadedTimeouts as LoadedTimeouts
    from nvrx.ft._state import parse_timeouts_state as parse_timeouts_state
    from nvrx.ft._state import read_timeouts_state_file as read_timeouts_state_file
    from nvrx.ft.client import RankMonitorClient as RankMonitorClient
    from nvrx.ft.client import RankMonitorClientError as RankMonitorClientError
    from nvrx.ft.config import CLI_NONE as CLI_NONE
    from nvrx.ft.config import FaultToleranceConfig as FaultToleranceConfig
    from nvrx.ft.config import FieldSpec as FieldSpec
    from nvrx.ft.config import add_config_arguments as add_config_arguments
    from nvrx.ft.config import add_ft_arguments as add_ft_arguments
    from nvrx.ft.data import MAX_DURATION_S as MAX_DURATION_S
    from nvrx.ft.data import MONITOR_SOCKET_ENV as MONITOR_SOCKET_ENV
    from nvrx.ft.data import HeartbeatTimeouts as HeartbeatTimeouts
    from nvrx.ft.data import SectionAction as SectionAction
    from nvrx.ft.data import SectionTimeouts as SectionTimeouts
    from nvrx.ft.data import WorkloadAction as WorkloadAction
    from nvrx.ft.data import WorkloadControlRequest as WorkloadControlRequest
    from nvrx.ft.data import monitor_socket_from_env as monitor_socket_from_env
    from nvrx.ft.rank_monitor_state_machine import (
        InvalidStateTransitionException as InvalidStateTransitionException,
    )
    from nvrx.ft.rank_monitor_state_machine import RankMonitorState as RankMonitorState
    from nvrx.ft.rank_monitor_state_machine import (
        RankMonitorStateMachine as RankMonitorStateMachine,
    )
    from nvrx.ft.server import RANK_MONITOR_INIT_TIMEOUT as RANK_MONITOR_INIT_TIMEOUT
    from nvrx.ft.server import MonitorProcess as MonitorProcess
    from nvrx.ft.server import RankMonitorServer as RankMonitorServer
    from nvrx.ft.timeouts_calc import TimeoutsCalc as TimeoutsCalc
    from nvrx.ft.timeouts_calc import TimeoutsCalcError as TimeoutsCalcError

    __version__: str

#: The public names, by the module that defines each: the one list. ``__all__`` and the
#: lazy imports are built from it; the ``TYPE_CHECKING`` imports above say the same for
#: static tools (``from m import X as X`` re-exports X); tests/test_facade.py checks
#: that they agree with it, and that each module's ``__all__`` has its names.
_PUBLIC: dict[str, tuple[str, ...]] = {
    "_formats.cycle_info": (
        "CYCLE_INFO_ENV",
        "CYCLE_INFO_SCHEMA_VERSION",
        "CycleGoodput",
        "CycleInfo",
        "CycleNode",
        "cycle_info_schema_path",
        "read_cycle_info",
        "write_cycle_info",
    ),
    "_events": ("MAX_EVENT_BYTES", "MonitorEvent", "parse_monitor_event"),
    "_files": ("write_file_atomically",),
    "_health": ("HealthError",),
    "_liveness": ("monitor_beat_age",),
    "_logs": ("log_formatter",),
    "_runtime": ("create_runtime_dir",),
    "_stacks": ("StackSummary",),
    "_state": (
        "FtStateError",
        "LoadedTimeouts",
        "parse_timeouts_state",
        "read_timeouts_state_file",
    ),
    "_formats.straggler_scores": (
        "STRAGGLER_SCORES_ENV",
        "STRAGGLER_SCORES_SCHEMA_VERSION",
        "RankStragglerScores",
        "StragglerReportLike",
        "StragglerScores",
        "flush_straggler_reports",
        "publish_straggler_report",
        "read_straggler_scores",
        "straggler_scores_schema_path",
        "write_straggler_scores",
    ),
    "client": ("RankMonitorClient", "RankMonitorClientError"),
    "config": (
        "CLI_NONE",
        "FaultToleranceConfig",
        "FieldSpec",
        "add_config_arguments",
        "add_ft_arguments",
    ),
    "data": (
        "MAX_DURATION_S",
        "MONITOR_SOCKET_ENV",
        "HeartbeatTimeouts",
        "SectionAction",
        "SectionTimeouts",
        "WorkloadAction",
        "WorkloadControlRequest",
        "monitor_socket_from_env",
    ),
    "rank_monitor_state_machine": (
        "InvalidStateTransitionException",
        "RankMonitorState",
        "RankMonitorStateMachine",
    ),
    "server": ("RANK_MONITOR_INIT_TIMEOUT", "MonitorProcess", "RankMonitorServer"),
    "timeouts_calc": ("TimeoutsCalc", "TimeoutsCalcError"),
}

#: Each public name's module, for :func:`__getattr__`.
_WHERE = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted([*_WHERE, "__version__"])


def __getattr__(name: str) -> Any:
    """Import a public name (or compute ``__version__``) on first access."""
    if name == "__version__":
        from importlib.metadata import version

        value: Any = version("nvrx-ft-core")
    elif name in _WHERE:
        value = getattr(importlib.import_module(f"nvrx.ft.{_WHERE[name]}"), name)
    else:
        raise AttributeError(f"module 'nvrx.ft' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
