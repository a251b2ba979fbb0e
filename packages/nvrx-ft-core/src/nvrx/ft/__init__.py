"""Fault tolerance inside each training rank and its monitor process."""

from importlib.metadata import version as _version

__version__: str = _version("nvrx-ft-core")

__all__ = ["__version__"]
