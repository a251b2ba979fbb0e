"""NVRx's module path ``nvidia_resiliency_ext.straggler.straggler``, as in the seeds."""

from __future__ import annotations

from nvrx.straggler._detector import Detector
from nvrx.straggler._wrapping import CallableId
from nvrx.straggler.sections import CustomSection

__all__ = ["CallableId", "CustomSection", "Detector"]
