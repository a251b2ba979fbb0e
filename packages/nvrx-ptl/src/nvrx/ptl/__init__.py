"""Lightning callbacks for fault tolerance, straggler detection and local snapshots.

``import nvrx.ptl`` needs no Lightning; every name is loaded on first use, and the
callbacks then need ``lightning`` or ``pytorch_lightning`` (see :mod:`nvrx.ptl._compat`).
"""

from __future__ import annotations

import importlib
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._local_ckpt_options import LOCAL_CKPT_OPTS_KEY as LOCAL_CKPT_OPTS_KEY
    from .fault_tolerance_callback import FaultToleranceCallback as FaultToleranceCallback
    from .fault_tolerance_sections_callback import (
        FaultToleranceSectionsCallback as FaultToleranceSectionsCallback,
    )
    from .local_checkpoint_callback import HierarchicalCheckpointIO as HierarchicalCheckpointIO
    from .local_checkpoint_callback import LocalCheckpointCallback as LocalCheckpointCallback
    from .simulated_fault import SimulatedFaultParams as SimulatedFaultParams
    from .straggler_detection_callback import (
        StragglerDetectionCallback as StragglerDetectionCallback,
    )

__version__: str = _version("nvrx-ptl")

#: The public names, by the module that defines each: the one list. ``__all__`` and the
#: lazy imports are built from it; the ``TYPE_CHECKING`` imports above say the same for
#: static tools (``from m import X as X`` re-exports X), checked to agree with it by
#: tests-integration/test_facades.py.
_PUBLIC: dict[str, tuple[str, ...]] = {
    "_local_ckpt_options": ("LOCAL_CKPT_OPTS_KEY",),
    "fault_tolerance_callback": ("FaultToleranceCallback",),
    "fault_tolerance_sections_callback": ("FaultToleranceSectionsCallback",),
    "local_checkpoint_callback": ("HierarchicalCheckpointIO", "LocalCheckpointCallback"),
    "simulated_fault": ("SimulatedFaultParams",),
    "straggler_detection_callback": ("StragglerDetectionCallback",),
}

#: Each public name's module, for :func:`__getattr__`.
_LAZY = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted([*_LAZY, "__version__"])


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
