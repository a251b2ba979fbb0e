"""The ft_launcher console script: torchrun with hang detection and in-job restarts."""

from importlib.metadata import version as _version

__version__: str = _version("nvrx-ft-launcher")

__all__ = ["__version__"]
