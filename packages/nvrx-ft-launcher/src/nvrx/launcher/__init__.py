"""The ft_launcher console script: torchrun with hang detection and in-job restarts.

Use it from the command line (``ft_launcher --help``); :func:`nvrx.launcher.cli.get_parser`
returns its argument parser and :class:`ExitCode` lists what its exit codes mean.
"""

from importlib.metadata import version as _version

from nvrx.launcher.exit_codes import ExitCode

__version__: str = _version("nvrx-ft-launcher")

__all__ = ["ExitCode", "__version__"]
