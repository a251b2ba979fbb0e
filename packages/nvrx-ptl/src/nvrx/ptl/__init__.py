"""Lightning callbacks for fault tolerance and straggler detection."""

from importlib.metadata import version as _version

__version__: str = _version("nvrx-ptl")

__all__ = ["__version__"]
