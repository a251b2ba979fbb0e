"""NVRx's ``checkpointing.local.ckpt_managers`` (see :mod:`.local_manager`)."""

__all__: list[str] = []
