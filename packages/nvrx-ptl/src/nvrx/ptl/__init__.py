"""Lightning callbacks for fault tolerance, straggler detection and local snapshots.

``import nvrx.ptl`` needs no Lightning; the callbacks are loaded on first use and
then need ``lightning`` or ``pytorch_lightning`` (see :mod:`nvrx.ptl._compat`).
"""

from __future__ import annotations

import importlib
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from ._local_ckpt_codec import LOCAL_CKPT_OPTS_KEY
from .simulated_fault import SimulatedFaultParams

if TYPE_CHECKING:
    from .fault_tolerance_callback import FaultToleranceCallback
    from .fault_tolerance_sections_callback import FaultToleranceSectionsCallback
    from .local_checkpoint_callback import HierarchicalCheckpointIO, LocalCheckpointCallback
    from .straggler_detection_callback import StragglerDetectionCallback

__version__: str = _version("nvrx-ptl")

__all__ = [
    "LOCAL_CKPT_OPTS_KEY",
    "FaultToleranceCallback",
    "FaultToleranceSectionsCallback",
    "HierarchicalCheckpointIO",
    "LocalCheckpointCallback",
    "SimulatedFaultParams",
    "StragglerDetectionCallback",
    "__version__",
]

_LAZY = {
    "FaultToleranceCallback": ".fault_tolerance_callback",
    "FaultToleranceSectionsCallback": ".fault_tolerance_sections_callback",
    "HierarchicalCheckpointIO": ".local_checkpoint_callback",
    "LocalCheckpointCallback": ".local_checkpoint_callback",
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
