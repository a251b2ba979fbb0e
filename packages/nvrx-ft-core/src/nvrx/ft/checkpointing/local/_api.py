"""The plain-PyTorch API: :class:`LocalCheckpoints` and :class:`RestoreResult`."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from nvrx.ft.checkpointing.local._contract import LocalCkptSettings, RestoreSource
from nvrx.ft.checkpointing.local._engine import Engine, warn_disabled_once

__all__ = ["LocalCheckpoints", "RestoreResult"]

_logger = logging.getLogger("nvrx.ft.local_checkpoint")


@dataclasses.dataclass(frozen=True)
class RestoreResult:
    """What :meth:`LocalCheckpoints.restore` found.

    ``source`` is OWN (this node's memory), PEER (a replica another node sent), GLOBAL
    (load the global/disk checkpoint: ``iteration`` is the global iteration given, if
    any) or NONE (nothing to restore: a fresh start). ``state`` is the restored nested
    state with OWN/PEER, else None. ``seconds`` is the restore's wall time.
    """

    source: RestoreSource
    iteration: int | None
    state: dict[str, Any] | None
    seconds: float


class LocalCheckpoints:
    """In-memory, peer-replicated snapshots of one rank's training state.

    Build it on every rank after ``torch.distributed.init_process_group`` (it creates one
    dedicated gloo group, a collective). ``settings`` None reads the launcher's
    environment (:meth:`LocalCkptSettings.from_env`); without one the manager is
    disabled: saves do nothing and ``restore`` answers GLOBAL (or NONE).
    ``group``: a process group spanning every rank that supports CPU point-to-point
    (gloo) to use instead of making one.
    """

    def __init__(
        self,
        settings: LocalCkptSettings | None = None,
        *,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        self.settings = settings if settings is not None else LocalCkptSettings.from_env()
        self._engine: Engine | None = None
        if self.settings is None:
            warn_disabled_once()
        else:
            self._engine = Engine(self.settings, group)
        self._last_save_time = time.monotonic()
        self._timer_work: Any = None
        self._timer_flag: torch.Tensor | None = None

    @property
    def enabled(self) -> bool:
        """Whether snapshots are taken (settings were given or found)."""
        return self._engine is not None

    def restore(
        self,
        template: Mapping[str, Any] | None = None,
        *,
        global_iteration: int | None = None,
    ) -> RestoreResult:
        """Agree on and load the newest snapshot every rank can restore; collective.

        ``template``: a state shaped like the saved one (e.g. the freshly built
        model's); each restored tensor goes to the device of the template's tensor at
        the same key path (else to the device it was saved from, when present, else the
        CPU). ``global_iteration``: the iteration of the global (disk) checkpoint this
        rank would otherwise load; when it is as new or newer, the answer is GLOBAL.
        Never raises; every rank gets the same source and iteration.
        """
        if self._engine is None:
            source = RestoreSource.GLOBAL if global_iteration is not None else RestoreSource.NONE
            return RestoreResult(source, global_iteration, None, 0.0)
        out = self._engine.restore(template, global_iteration)
        return RestoreResult(out.source, out.iteration, out.state, out.seconds)

    def save(self, iteration: int, state: Mapping[str, Any]) -> bool:
        """Snapshot ``state`` as ``iteration``: copied now, written and replicated in the
        background. False (one warning per reason) when skipped; never raises."""
        if self._engine is None:
            return False
        ok = self._engine.save(iteration, state)
        if ok:
            self._last_save_time = time.monotonic()
        return ok

    def maybe_save(self, iteration: int, state: Mapping[str, Any]) -> bool:
        """Save when the interval says so: ``every_n_steps`` (iteration divisible by
        it), ``every_s`` (seconds since the last save), every step when neither is set.

        With ``every_s`` on several ranks, call it at every step on every rank: the
        ranks agree through a tiny background all-reduce, so they all save at the same
        iteration (a snapshot is usable only when every rank has that iteration).
        """
        if self._engine is None:
            return False
        s = self.settings
        assert s is not None
        due = False
        if s.every_n_steps is not None and iteration % s.every_n_steps == 0:
            due = True
        if s.every_s is not None:
            due = self._timer_due(s.every_s) or due
        if s.every_n_steps is None and s.every_s is None:
            due = True
        return self.save(iteration, state) if due else False

    def _timer_due(self, every_s: float) -> bool:
        assert self._engine is not None
        expired = time.monotonic() - self._last_save_time >= every_s
        group = self._engine.group
        if group is None:
            return expired
        due = False
        try:
            if self._timer_work is not None:
                self._timer_work.wait()
                assert self._timer_flag is not None
                due = bool(self._timer_flag.item())
            self._timer_flag = torch.tensor([1 if expired and not due else 0], dtype=torch.int64)
            self._timer_work = dist.all_reduce(
                self._timer_flag, op=dist.ReduceOp.MAX, group=group, async_op=True
            )
        except Exception as exc:
            _logger.warning("local checkpoint timer agreement failed: %s", exc)
            self._timer_work = None
        return due

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the last save is written and replicated; False on timeout."""
        return True if self._engine is None else self._engine.wait(timeout)

    def close(self) -> None:
        """Finish the last save, stop the background threads and release the slots."""
        if self._engine is not None:
            if self._timer_work is not None:
                try:
                    self._timer_work.wait()
                except Exception as exc:
                    _logger.debug("timer all-reduce at close: %s", exc)
                self._timer_work = None
            self._engine.close()
