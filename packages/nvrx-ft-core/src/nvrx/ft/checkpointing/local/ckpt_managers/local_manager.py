"""NVRx's ``LocalCheckpointManager``: snapshots in a node-local directory (tmpfs or SSD).

Layout: ``<root_local_ckpt_dir>/<session_id>/<rank>/<owner>.<slot>.snap`` in nvrx's own
format (raw tensor bytes + JSON manifest + checksums). NVRx's ``iter_*_local.pt``
files are neither written nor read: these checkpoints are ephemeral.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from nvrx.ft.checkpointing.local._contract import (
    DEFAULT_MAX_SHARE,
    ENV_JOB,
    LocalCkptSettings,
)
from nvrx.ft.checkpointing.local.ckpt_managers.base_manager import BaseCheckpointManager

__all__ = ["LocalCheckpointManager"]


class LocalCheckpointManager(BaseCheckpointManager):
    """Save, find and load every rank's local checkpoint under ``root_local_ckpt_dir``.

    ``repl_strategy``: None keeps no replica; a
    :class:`~nvrx.ft.checkpointing.local.replication.strategies.CliqueReplicationStrategy`
    (or its lazy form) with replication factor F keeps each snapshot on F - 1 other
    nodes. The job identity a snapshot must carry is ft_launcher's
    (``NVRX_LOCAL_CKPT_JOB``) when launched by it, else ``session_id``.
    """

    def __init__(
        self,
        root_local_ckpt_dir: str | os.PathLike[str],
        session_id: str = "",
        repl_strategy: Any = None,
    ) -> None:
        super().__init__(session_id, repl_strategy)
        self.root = pathlib.Path(root_local_ckpt_dir)
        self.local_ckpt_dir = self.root / session_id if session_id else self.root

    def _settings(self) -> LocalCkptSettings:
        from_env = LocalCkptSettings.from_env()
        job = os.environ.get(ENV_JOB) or f"session:{self.session_id}"
        replicas = 0 if self.repl_strategy is None else int(self.repl_strategy.replicas)
        return LocalCkptSettings(
            node_dir=self.local_ckpt_dir,
            job_id=job[:128],
            replicas=replicas,
            max_share=from_env.max_share if from_env is not None else DEFAULT_MAX_SHARE,
        )

    def _rank_dir(self) -> pathlib.Path:
        self.local_ckpt_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.local_ckpt_dir / str(self.rank)
