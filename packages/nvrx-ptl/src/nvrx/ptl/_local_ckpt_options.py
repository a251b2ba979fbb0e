"""The ``storage_options`` key of a local snapshot save (no torch or Lightning import)."""

from __future__ import annotations

__all__ = ["LOCAL_CKPT_OPTS_KEY"]

LOCAL_CKPT_OPTS_KEY = "local_checkpoint_options"
"""The ``storage_options`` key that marks a save as a local snapshot (NVRx's name and value)."""
