"""Fault tolerance inside each training rank and its monitor process.

Port from NVRx by changing ``nvidia_resiliency_ext.fault_tolerance`` to ``nvrx.ft``.
Importing this package does not import torch.
"""

from importlib.metadata import version as _version

from nvrx.ft.client import RankMonitorClient, RankMonitorClientError
from nvrx.ft.config import (
    CLI_NONE,
    FaultToleranceConfig,
    add_config_arguments,
    add_ft_arguments,
)
from nvrx.ft.data import (
    MONITOR_SOCKET_ENV,
    HeartbeatTimeouts,
    SectionTimeouts,
    WorkloadAction,
    WorkloadControlRequest,
)
from nvrx.ft.events import MonitorEvent, parse_monitor_event
from nvrx.ft.health import HealthError
from nvrx.ft.runtime import create_runtime_dir
from nvrx.ft.server import RANK_MONITOR_INIT_TIMEOUT, MonitorProcess, RankMonitorServer
from nvrx.ft.timeouts_calc import SectionAction, TimeoutsCalc, TimeoutsCalcError

__version__: str = _version("nvrx-ft-core")

__all__ = [
    "CLI_NONE",
    "MONITOR_SOCKET_ENV",
    "RANK_MONITOR_INIT_TIMEOUT",
    "FaultToleranceConfig",
    "HealthError",
    "HeartbeatTimeouts",
    "MonitorEvent",
    "MonitorProcess",
    "RankMonitorClient",
    "RankMonitorClientError",
    "RankMonitorServer",
    "SectionAction",
    "SectionTimeouts",
    "TimeoutsCalc",
    "TimeoutsCalcError",
    "WorkloadAction",
    "WorkloadControlRequest",
    "__version__",
    "add_config_arguments",
    "add_ft_arguments",
    "create_runtime_dir",
    "parse_monitor_event",
]
