"""Find the Lightning flavour that is installed: ``lightning`` or ``pytorch_lightning``.

Both distributions ship the same trainer under different import names, and a
callback must subclass the ``Callback`` of the trainer it is given to. The
callbacks import their base classes from here, so ``import nvrx.ptl`` works with
either flavour (and with neither, until a callback is used).

``NVRX_PTL_LIGHTNING`` (``lightning`` or ``pytorch_lightning``) picks one when both
are installed; by default ``lightning`` wins, as it is the one NeMo uses.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = [
    "LIGHTNING_ENV",
    "Callback",
    "LightningModule",
    "Timer",
    "Trainer",
    "lightning_module",
]

#: Environment variable that chooses the Lightning flavour when both are installed.
LIGHTNING_ENV = "NVRX_PTL_LIGHTNING"

_FLAVOURS = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}


def lightning_module() -> ModuleType:
    """Return ``lightning.pytorch`` or ``pytorch_lightning``, whichever is installed.

    Raises ImportError naming both packages when neither is installed, and
    ValueError when ``NVRX_PTL_LIGHTNING`` names something else.
    """
    wanted = os.environ.get(LIGHTNING_ENV, "").strip()
    if wanted and wanted not in _FLAVOURS:
        raise ValueError(
            f"{LIGHTNING_ENV}={wanted!r} is not valid: use 'lightning' or 'pytorch_lightning'"
        )
    for top, module in _FLAVOURS.items():
        if wanted and top != wanted:
            continue
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name not in (top, module):
                raise  # installed but broken: show the real cause
    raise ImportError(
        "nvrx.ptl callbacks need Lightning, but "
        + (
            f"{wanted!r} (chosen by {LIGHTNING_ENV}) is"
            if wanted
            else "neither 'lightning' nor 'pytorch_lightning' is"
        )
        + " installed: pip install 'nvrx-ptl[lightning]' (or 'nvrx-ptl[pytorch-lightning]')"
    )


if TYPE_CHECKING:
    from lightning.pytorch import Callback, LightningModule, Trainer
    from lightning.pytorch.callbacks import Timer
else:
    _pl = lightning_module()
    Callback = _pl.Callback
    LightningModule = _pl.LightningModule
    Trainer = _pl.Trainer
    Timer = _pl.callbacks.Timer
