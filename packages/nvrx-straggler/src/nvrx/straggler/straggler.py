"""NVRx's module path ``nvidia_resiliency_ext.straggler.straggler``, as in the seeds."""

from __future__ import annotations

from nvrx.straggler.detector import Detector
from nvrx.straggler.sections import CustomSection
from nvrx.straggler.wrapping import CallableId

__all__ = ["CallableId", "CustomSection", "Detector"]
