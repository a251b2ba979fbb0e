"""NVRx's ``checkpointing.local.replication`` names (see :mod:`.strategies`)."""

__all__: list[str] = []
