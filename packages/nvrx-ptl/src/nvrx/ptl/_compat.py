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
    "save_last_checkpoint",
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


def save_last_checkpoint(trainer: Trainer, checkpoint_callback: object) -> str | None:
    """Save a "last" checkpoint of the current step now; return its path (None: nowhere).

    With ``save_last=True`` the checkpoint callback saves it under its own name
    (``last.ckpt``, or NeMo's ``...-last`` naming, which NeMo's auto-resume looks
    for) through ModelCheckpoint's private ``_monitor_candidates`` and
    ``_save_last_checkpoint``, as NVRx does: the only Lightning private names nvrx.ptl
    touches, tested in test_straggler_callback.py. Otherwise (no ``save_last``,
    ``save_last="link"``, which would link an older checkpoint, or a callback without
    those methods) the trainer saves ``last-straggler-stop-step=<N>.ckpt`` in the
    callback's directory, which ``ckpt_path="last"`` also finds. Collective: call it
    on every rank.
    """
    save_last = getattr(checkpoint_callback, "save_last", None)
    monitor_candidates = getattr(checkpoint_callback, "_monitor_candidates", None)
    save = getattr(checkpoint_callback, "_save_last_checkpoint", None)
    if save_last is True and callable(monitor_candidates) and callable(save):
        save(trainer, monitor_candidates(trainer))
        path = getattr(checkpoint_callback, "last_model_path", None)
        return str(path) if path else None
    dirpath = getattr(checkpoint_callback, "dirpath", None)
    if not dirpath:
        return None
    path = os.path.join(dirpath, f"last-straggler-stop-step={trainer.global_step}.ckpt")
    trainer.save_checkpoint(path)
    return path
