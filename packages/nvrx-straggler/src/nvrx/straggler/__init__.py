"""Straggler detection: which ranks slow the whole job down."""

from importlib.metadata import version as _version

__version__: str = _version("nvrx-straggler")

__all__ = ["__version__"]
