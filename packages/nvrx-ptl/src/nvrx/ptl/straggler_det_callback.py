"""NVRx's module name for :mod:`nvrx.ptl.straggler_detection_callback`.

NVRx code imports ``nvidia_resiliency_ext.ptl_resiliency.straggler_det_callback``;
with this alias, replacing the package prefix by ``nvrx.ptl`` is the whole port.
"""

from .straggler_detection_callback import StragglerDetectionCallback

__all__ = ["StragglerDetectionCallback"]
