"""NVRx's ``BaseCheckpointManager`` over nvrx's local checkpoint engine.

Same calls and collective rules as NVRx (``find_latest``, ``load``, ``save`` on every
rank together). What differs, all of it documented in the migration guide:

- nothing is pickled: a state is stored as raw tensor bytes plus JSON, so ``save``
  takes a :class:`~nvrx.ft.checkpointing.local.basic_state_dict.BasicTensorAwareStateDict`
  (or any TensorAwareStateDict with a ``state_dict`` mapping of tensors and plain
  values) and ``load`` returns a ``BasicTensorAwareStateDict``;
- ``find_latest`` is one fixed-size ``all_gather`` (no pickled id lists) and counts a
  snapshot only when its checksums, format version and job identity check out;
- each rank keeps its two newest snapshots, so losing the newest file makes
  ``find_latest`` return the previous complete iteration instead of -1;
- a failed save raises CheckpointingException on every rank at finalize, as in NVRx,
  but the previous snapshot stays valid (it is never deleted first).
"""

from __future__ import annotations

import abc
import logging
import pathlib
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch.distributed as dist

from nvrx.ft.checkpointing.async_ckpt.core import AsyncRequest
from nvrx.ft.checkpointing.local import _agreement
from nvrx.ft.checkpointing.local._contract import LocalCkptSettings, RestoreSource
from nvrx.ft.checkpointing.local._engine import Engine, Restored, _Valid
from nvrx.ft.checkpointing.local.base_state_dict import TensorAwareStateDict
from nvrx.ft.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict

__all__ = [
    "BaseCheckpointManager",
    "CheckpointingException",
    "CkptID",
    "SameMachineReplicationException",
]

_logger = logging.getLogger("nvrx.ft.local_checkpoint")


class CheckpointingException(Exception):
    """A local checkpoint could not be saved or loaded."""


class SameMachineReplicationException(CheckpointingException):
    """NVRx's error for a replica written twice on one machine (kept for imports)."""


class CkptID(NamedTuple):
    """A snapshot's identity: ``(iteration, rank, session_id)``."""

    iteration: int
    rank: int
    session_id: str


class BaseCheckpointManager(abc.ABC):
    """Collective save / find_latest / load of every rank's local checkpoint."""

    def __init__(self, session_id: str, repl_strategy: Any = None) -> None:
        self.session_id = session_id
        self.repl_strategy = repl_strategy
        self.latest_iteration = -1
        self._engine: Engine | None = None
        self._plan: _agreement.Plan | None = None
        self._valid: list[_Valid] = []
        self._rank: int | None = None
        self._agree_s = 0.0

    @property
    def rank(self) -> int:
        """This process's global rank (0, with a warning, before torch.distributed)."""
        if self._rank is None:
            if dist.is_available() and dist.is_initialized():
                self._rank = dist.get_rank()
            else:
                _logger.warning("torch.distributed is not initialized: using rank 0")
                self._rank = 0
        return self._rank

    @abc.abstractmethod
    def _settings(self) -> LocalCkptSettings:
        """Where and how this manager keeps snapshots."""

    @abc.abstractmethod
    def _rank_dir(self) -> pathlib.Path:
        """This rank's directory."""

    @property
    def engine(self) -> Engine:
        """The engine, made on first use (a collective: it creates the snapshot group)."""
        if self._engine is None:
            self._engine = Engine(self._settings(), None, rank_dir=self._rank_dir())
        return self._engine

    def find_latest(self) -> int:
        """The newest iteration every rank can load (own node or a replica), or -1.

        A collective, except when an iteration is already cached.
        """
        if self.latest_iteration != -1:
            return self.latest_iteration
        t0 = time.monotonic()
        plan, valid = self.engine.agree(None)
        self._agree_s = time.monotonic() - t0
        self._plan, self._valid = plan, valid
        if plan is None or plan.iteration is None:
            self.latest_iteration = -1
        else:
            self.latest_iteration = plan.iteration
        return self.latest_iteration

    def load(self) -> tuple[BasicTensorAwareStateDict, CkptID]:
        """Load the iteration ``find_latest`` found (fetching from peers); a collective."""
        plan = self._plan
        if self.latest_iteration == -1 or plan is None or plan.iteration is None:
            raise CheckpointingException("no local checkpoint to load (call find_latest first)")
        t0 = time.monotonic()
        state, source, wall = self.engine.load_agreed(plan, self._valid, None)
        if state is None:
            raise CheckpointingException(
                f"loading local checkpoint iteration {plan.iteration} failed on some rank"
            )
        seconds = self._agree_s + time.monotonic() - t0
        self.engine.record(Restored(source, plan.iteration, None, seconds, wall))
        return BasicTensorAwareStateDict(state), CkptID(plan.iteration, self.rank, self.session_id)

    def record_global_restore(self, iteration: int | None) -> None:
        """Record that this rank resumed from the global checkpoint of ``iteration``
        (nvrx addition: a caller that chose the global checkpoint over a local one tells
        ft_launcher, whose journal and goodput account say where the state came from)."""
        source = RestoreSource.NONE if iteration is None else RestoreSource.GLOBAL
        self.engine.record(Restored(source, iteration, None, 0.0))

    def save(
        self, state_dict: TensorAwareStateDict, iteration: int, is_async: bool = False
    ) -> AsyncRequest | None:
        """Save ``state_dict`` as ``iteration`` on every rank; a collective.

        The tensors are copied before this returns. Sync: written (and replicated),
        then checked on every rank. Async: returns an AsyncRequest whose work waits for
        the background write and whose finalize function does the check. A save that
        failed on any rank raises CheckpointingException on every rank at that check.
        """
        assert self.latest_iteration < iteration, (
            f"A newer checkpoint is already available (iteration {self.latest_iteration})"
        )
        if state_dict.is_hollow:
            raise CheckpointingException("cannot save a hollow TensorAwareStateDict")
        state = getattr(state_dict, "state_dict", None)
        if not isinstance(state, Mapping):
            raise CheckpointingException(
                f"{type(state_dict).__name__} has no state_dict mapping: nvrx stores a "
                "BasicTensorAwareStateDict's tensors and plain values, never a pickle"
            )
        engine = self.engine
        self.latest_iteration = -1
        self._plan = None
        engine.wait()  # the previous save's background work: never skip this one as busy
        accepted = engine.save(iteration, state)

        def finalize() -> None:
            engine.wait()
            ok = accepted and engine.last_committed == iteration
            if not engine.all_ok(ok):
                raise CheckpointingException(
                    f"Failure during saving local checkpoint of iteration {iteration} "
                    "(the previous one stays valid)"
                )

        if is_async:
            return AsyncRequest(engine.wait, (), [finalize])
        engine.wait()
        finalize()
        return None

    def close(self) -> None:
        """Stop the background threads (nvrx addition)."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
