"""Node-local, peer-replicated, in-memory checkpoints (NVRx's ``checkpointing.local``).

:class:`LocalCheckpoints` is the plain-PyTorch API: ``restore`` at start (collective),
``save``/``maybe_save`` every N steps (copy now, write and replicate in the background).
The NVRx names live under the same module tree as in NVRx (``base_state_dict``,
``basic_state_dict``, ``ckpt_managers``, ``replication``). See
``docs/guides/local-checkpoints.md``.
"""

from nvrx.ft.checkpointing.local._api import LocalCheckpoints, RestoreResult
from nvrx.ft.checkpointing.local._contract import LocalCkptSettings, RestoreSource

__all__ = ["LocalCheckpoints", "LocalCkptSettings", "RestoreResult", "RestoreSource"]
