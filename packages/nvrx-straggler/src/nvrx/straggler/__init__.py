"""Straggler detection: which ranks slow the whole job down.

Time code sections (``Detector.detection_section``) and, with the ``cupti`` extra on a
GPU, the CUDA kernels they launch; score every rank against its peers (relative) and
against its own recent best (individual); report the slow ones.
"""

from importlib.metadata import version as _version

from nvrx.straggler.detector import Detector, StragglerDetector
from nvrx.straggler.interval import ReportIntervalTracker
from nvrx.straggler.kernels import (
    KernelTimer,
    KernelTimingStatus,
    NullKernelTimer,
    SyntheticKernelRecord,
    SyntheticKernelTimer,
)
from nvrx.straggler.names import NameMapper
from nvrx.straggler.reporting import NonComparable, Report, ReportGenerator, StragglerId
from nvrx.straggler.sections import CustomSection
from nvrx.straggler.statistics import Statistic
from nvrx.straggler.wrapping import CallableId

__version__: str = _version("nvrx-straggler")

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
    "SyntheticKernelRecord",
    "SyntheticKernelTimer",
    "__version__",
]
