"""Fault tolerance inside each training rank and its monitor process.

Port from NVRx by changing ``nvidia_resiliency_ext.fault_tolerance`` to ``nvrx.ft``.
Names are imported on first use, so a monitor process (or a launcher) only pays for
the modules it touches; importing this package never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvrx.ft._cycle_info import (
        CYCLE_INFO_ENV,
        CYCLE_INFO_SCHEMA_VERSION,
        CycleGoodput,
        CycleInfo,
        CycleNode,
        cycle_info_schema_path,
        read_cycle_info,
        write_cycle_info,
    )
    from nvrx.ft._events import MAX_EVENT_BYTES, MonitorEvent, parse_monitor_event
    from nvrx.ft._files import write_file_atomically
    from nvrx.ft._health import HealthError
    from nvrx.ft._liveness import beat_age as monitor_beat_age
    from nvrx.ft._logs import log_formatter
    from nvrx.ft._runtime import create_runtime_dir
    from nvrx.ft._stacks import StackSummary
    from nvrx.ft._state import (
        FtStateError,
        LoadedTimeouts,
        parse_timeouts_state,
        read_timeouts_state_file,
    )
    from nvrx.ft._straggler_scores import (
        STRAGGLER_SCORES_ENV,
        STRAGGLER_SCORES_SCHEMA_VERSION,
        RankStragglerScores,
        StragglerReportLike,
        StragglerScores,
        flush_straggler_reports,
        publish_straggler_report,
        read_straggler_scores,
        straggler_scores_schema_path,
        write_straggler_scores,
    )
    from nvrx.ft.client import RankMonitorClient, RankMonitorClientError
    from nvrx.ft.config import (
        CLI_NONE,
        FaultToleranceConfig,
        FieldSpec,
        add_config_arguments,
        add_ft_arguments,
    )
    from nvrx.ft.data import (
        MAX_DURATION_S,
        MONITOR_SOCKET_ENV,
        HeartbeatTimeouts,
        SectionAction,
        SectionTimeouts,
        WorkloadAction,
        WorkloadControlRequest,
        monitor_socket_from_env,
    )
    from nvrx.ft.rank_monitor_state_machine import (
        InvalidStateTransitionException,
        RankMonitorState,
        RankMonitorStateMachine,
    )
    from nvrx.ft.server import RANK_MONITOR_INIT_TIMEOUT, MonitorProcess, RankMonitorServer
    from nvrx.ft.timeouts_calc import TimeoutsCalc, TimeoutsCalcError

    __version__: str

_WHERE = {
    "RankMonitorClient": "client",
    "RankMonitorClientError": "client",
    "CLI_NONE": "config",
    "FaultToleranceConfig": "config",
    "FieldSpec": "config",
    "add_config_arguments": "config",
    "add_ft_arguments": "config",
    "MAX_DURATION_S": "data",
    "MONITOR_SOCKET_ENV": "data",
    "HeartbeatTimeouts": "data",
    "SectionTimeouts": "data",
    "WorkloadAction": "data",
    "WorkloadControlRequest": "data",
    "monitor_socket_from_env": "data",
    "CYCLE_INFO_ENV": "_cycle_info",
    "CYCLE_INFO_SCHEMA_VERSION": "_cycle_info",
    "CycleGoodput": "_cycle_info",
    "CycleInfo": "_cycle_info",
    "CycleNode": "_cycle_info",
    "cycle_info_schema_path": "_cycle_info",
    "read_cycle_info": "_cycle_info",
    "write_cycle_info": "_cycle_info",
    "MAX_EVENT_BYTES": "_events",
    "MonitorEvent": "_events",
    "parse_monitor_event": "_events",
    "write_file_atomically": "_files",
    "log_formatter": "_logs",
    "HealthError": "_health",
    "create_runtime_dir": "_runtime",
    "monitor_beat_age": "_liveness",
    "RANK_MONITOR_INIT_TIMEOUT": "server",
    "MonitorProcess": "server",
    "RankMonitorServer": "server",
    "StackSummary": "_stacks",
    "FtStateError": "_state",
    "LoadedTimeouts": "_state",
    "parse_timeouts_state": "_state",
    "read_timeouts_state_file": "_state",
    "SectionAction": "data",
    "STRAGGLER_SCORES_ENV": "_straggler_scores",
    "STRAGGLER_SCORES_SCHEMA_VERSION": "_straggler_scores",
    "RankStragglerScores": "_straggler_scores",
    "StragglerReportLike": "_straggler_scores",
    "StragglerScores": "_straggler_scores",
    "flush_straggler_reports": "_straggler_scores",
    "publish_straggler_report": "_straggler_scores",
    "read_straggler_scores": "_straggler_scores",
    "straggler_scores_schema_path": "_straggler_scores",
    "write_straggler_scores": "_straggler_scores",
    "TimeoutsCalc": "timeouts_calc",
    "TimeoutsCalcError": "timeouts_calc",
    "InvalidStateTransitionException": "rank_monitor_state_machine",
    "RankMonitorState": "rank_monitor_state_machine",
    "RankMonitorStateMachine": "rank_monitor_state_machine",
}

#: Public names that differ from the name in their module.
_RENAMED = {"monitor_beat_age": "beat_age"}

__all__ = [
    "CLI_NONE",
    "CYCLE_INFO_ENV",
    "CYCLE_INFO_SCHEMA_VERSION",
    "MAX_DURATION_S",
    "MAX_EVENT_BYTES",
    "MONITOR_SOCKET_ENV",
    "RANK_MONITOR_INIT_TIMEOUT",
    "STRAGGLER_SCORES_ENV",
    "STRAGGLER_SCORES_SCHEMA_VERSION",
    "CycleGoodput",
    "CycleInfo",
    "CycleNode",
    "FaultToleranceConfig",
    "FieldSpec",
    "FtStateError",
    "HealthError",
    "HeartbeatTimeouts",
    "InvalidStateTransitionException",
    "LoadedTimeouts",
    "MonitorEvent",
    "MonitorProcess",
    "RankMonitorClient",
    "RankMonitorClientError",
    "RankMonitorServer",
    "RankMonitorState",
    "RankMonitorStateMachine",
    "RankStragglerScores",
    "SectionAction",
    "SectionTimeouts",
    "StackSummary",
    "StragglerReportLike",
    "StragglerScores",
    "TimeoutsCalc",
    "TimeoutsCalcError",
    "WorkloadAction",
    "WorkloadControlRequest",
    "__version__",
    "add_config_arguments",
    "add_ft_arguments",
    "create_runtime_dir",
    "cycle_info_schema_path",
    "flush_straggler_reports",
    "log_formatter",
    "monitor_beat_age",
    "monitor_socket_from_env",
    "parse_monitor_event",
    "parse_timeouts_state",
    "publish_straggler_report",
    "read_cycle_info",
    "read_straggler_scores",
    "read_timeouts_state_file",
    "straggler_scores_schema_path",
    "write_cycle_info",
    "write_file_atomically",
    "write_straggler_scores",
]


def __getattr__(name: str) -> Any:
    """Import a public name (or compute ``__version__``) on first access."""
    if name == "__version__":
        from importlib.metadata import version

        value: Any = version("nvrx-ft-core")
    elif name in _WHERE:
        attr = _RENAMED.get(name, name)
        value = getattr(importlib.import_module(f"nvrx.ft.{_WHERE[name]}"), attr)
    else:
        raise AttributeError(f"module 'nvrx.ft' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
