"""Node-local, peer-replicated, in-memory checkpoints (NVRx's ``checkpointing.local``)."""

__all__: list[str] = []
