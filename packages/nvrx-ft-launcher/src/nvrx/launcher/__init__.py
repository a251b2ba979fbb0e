"""The ft_launcher console script: torchrun with hang detection and in-job restarts.

Use it from the command line (``ft_launcher --help``); :func:`nvrx.launcher.cli.get_parser`
returns its argument parser and :class:`ExitCode` lists what its exit codes mean.
"""

import argparse
from importlib.metadata import version as _version

from nvrx.launcher.exit_codes import ExitCode

__version__: str = _version("nvrx-ft-launcher")

__all__ = ["ExitCode", "__version__", "get_args_parser"]


def get_args_parser() -> argparse.ArgumentParser:
    """ft_launcher's argument parser, under the name NVRx's launcher module gives it.

    Imported on call: reading the package's version or exit codes needs no torch.
    """
    from nvrx.launcher.cli import get_parser

    return get_parser()
