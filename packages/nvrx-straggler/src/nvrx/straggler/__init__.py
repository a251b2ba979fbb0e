"""Straggler detection: which ranks slow the whole job down.

Time code sections (``Detector.detection_section``) and, with the ``cupti`` extra on a
GPU, the CUDA kernels they launch; score every rank against its peers (relative) and
against its own recent best (individual); report the slow ones.

The names below are loaded on first use, so ``nvrx.straggler.sections`` (the hot path
and its C accelerator) imports without torch.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvrx.straggler._detector import Detector, StragglerDetector
    from nvrx.straggler._drift import SustainedSlowdown, SustainedSlowdownRule
    from nvrx.straggler._interval import ReportIntervalTracker
    from nvrx.straggler._kernels import (
        KernelTimer,
        KernelTimingStatus,
        NullKernelTimer,
        SyntheticKernelRecord,
        SyntheticKernelTimer,
    )
    from nvrx.straggler._names import NameMapper
    from nvrx.straggler._report import NonComparable, Report, StragglerId
    from nvrx.straggler._report_generator import ReportGenerator
    from nvrx.straggler._wrapping import CallableId
    from nvrx.straggler.sections import CustomSection
    from nvrx.straggler.statistics import Statistic

__version__: str = _version("nvrx-straggler")

_HOME = {
    "CallableId": "_wrapping",
    "CustomSection": "sections",
    "Detector": "_detector",
    "KernelTimer": "_kernels",
    "KernelTimingStatus": "_kernels",
    "NameMapper": "_names",
    "NonComparable": "_report",
    "NullKernelTimer": "_kernels",
    "Report": "_report",
    "ReportGenerator": "_report_generator",
    "ReportIntervalTracker": "_interval",
    "Statistic": "statistics",
    "StragglerDetector": "_detector",
    "StragglerId": "_report",
    "SustainedSlowdown": "_drift",
    "SustainedSlowdownRule": "_drift",
    "SyntheticKernelRecord": "_kernels",
    "SyntheticKernelTimer": "_kernels",
}

__all__ = [
    "CallableId",
    "CustomSection",
    "Detector",
    "KernelTimer",
    "KernelTimingStatus",
    "NameMapper",
    "NonComparable",
    "NullKernelTimer",
    "Report",
    "ReportGenerator",
    "ReportIntervalTracker",
    "Statistic",
    "StragglerDetector",
    "StragglerId",
    "SustainedSlowdown",
    "SustainedSlowdownRule",
    "SyntheticKernelRecord",
    "SyntheticKernelTimer",
    "__version__",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
