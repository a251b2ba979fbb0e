"""Checkpointing helpers of nvrx (NVRx's ``checkpointing`` package): see :mod:`.local`."""

__all__: list[str] = []
