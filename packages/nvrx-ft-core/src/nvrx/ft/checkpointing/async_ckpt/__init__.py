"""NVRx's ``checkpointing.async_ckpt`` names (see :mod:`.core`)."""

__all__: list[str] = []
