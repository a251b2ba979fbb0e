"""Lightning callbacks for fault tolerance and straggler detection.

``import nvrx.ptl`` needs no Lightning; the callbacks are loaded on first use and
then need ``lightning`` or ``pytorch_lightning`` (see :mod:`nvrx.ptl._compat`).
"""

from __future__ import annotations

import importlib
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from .simulated_fault import SimulatedFaultParams

if TYPE_CHECKING:
    from .fault_tolerance_callback import FaultToleranceCallback
    from .fault_tolerance_sections_callback import FaultToleranceSectionsCallback
    from .straggler_detection_callback import StragglerDetectionCallback

__version__: str = _version("nvrx-ptl")

__all__ = [
    "FaultToleranceCallback",
    "FaultToleranceSectionsCallback",
    "SimulatedFaultParams",
    "StragglerDetectionCallback",
    "__version__",
]

_LAZY = {
    "FaultToleranceCallback": ".fault_tolerance_callback",
    "FaultToleranceSectionsCallback": ".fault_tolerance_sections_callback",
    "StragglerDetectionCallback": ".straggler_detection_callback",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
