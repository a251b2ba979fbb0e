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
    from nvrx.straggler._detector import Detector as Detector
    from nvrx.straggler._detector import StragglerDetector as StragglerDetector
    from nvrx.straggler._drift import SustainedSlowdown as SustainedSlowdown
    from nvrx.straggler._drift import SustainedSlowdownRule as SustainedSlowdownRule
    from nvrx.straggler._interval import ReportIntervalTracker as ReportIntervalTracker
    from nvrx.straggler._kernels import KernelTimer as KernelTimer
    from nvrx.straggler._kernels import KernelTimingStatus as KernelTimingStatus
    from nvrx.straggler._kernels import NullKernelTimer as NullKernelTimer
    from nvrx.straggler._kernels import SyntheticKernelRecord as SyntheticKernelRecord
    from nvrx.straggler._kernels import SyntheticKernelTimer as SyntheticKernelTimer
    from nvrx.straggler._names import NameMapper as NameMapper
    from nvrx.straggler._report import NonComparable as NonComparable
    from nvrx.straggler._report import Report as Report
    from nvrx.straggler._report import StragglerId as StragglerId
    from nvrx.straggler._report_generator import ReportGenerator as ReportGenerator
    from nvrx.straggler._wrapping import CallableId as CallableId
    from nvrx.straggler.sections import CustomSection as CustomSection
    from nvrx.straggler.statistics import Statistic as Statistic

__version__: str = _version("nvrx-straggler")

#: The public names, by the module that defines each: the one list. ``__all__`` and the
#: lazy imports are built from it; the ``TYPE_CHECKING`` imports above say the same for
#: static tools (``from m import X as X`` re-exports X), checked to agree with it by
#: tests-integration/test_facades.py.
_PUBLIC: dict[str, tuple[str, ...]] = {
    "_detector": ("Detector", "StragglerDetector"),
    "_drift": ("SustainedSlowdown", "SustainedSlowdownRule"),
    "_interval": ("ReportIntervalTracker",),
    "_kernels": (
        "KernelTimer",
        "KernelTimingStatus",
        "NullKernelTimer",
        "SyntheticKernelRecord",
        "SyntheticKernelTimer",
    ),
    "_names": ("NameMapper",),
    "_report": ("NonComparable", "Report", "StragglerId"),
    "_report_generator": ("ReportGenerator",),
    "_wrapping": ("CallableId",),
    "sections": ("CustomSection",),
    "statistics": ("Statistic",),
}

#: Each public name's module, for :func:`__getattr__`.
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted([*_HOME, "__version__"])


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
