"""Local (node-memory) snapshots for Lightning: NVRx's ``local_checkpoint_callback``.

Two pieces, as in NVRx, and used the same way (NeMo's ``MCoreHierarchicalCheckpointIO``
subclasses :class:`HierarchicalCheckpointIO`):

- :class:`LocalCheckpointCallback` asks for a local snapshot every N training steps
  or T seconds, through ``storage_options={LOCAL_CKPT_OPTS_KEY: {...}}``;
- :class:`HierarchicalCheckpointIO` wraps the trainer's CheckpointIO: a save with
  those options goes to the local checkpoint manager
  (:class:`nvrx.ft.checkpointing.local.ckpt_managers.local_manager.LocalCheckpointManager`),
  any other save to the wrapped (global) CheckpointIO; a load takes the newer of the
  local snapshot and the global checkpoint, the local one when it is as new or newer.

What nvrx adds (NVRx code runs unchanged):

- Under ``ft_launcher`` with local snapshots on (``NVRX_LOCAL_CKPT_DIR`` is set), the
  callback alone is enough: when the trainer has no HierarchicalCheckpointIO it wraps
  the strategy's CheckpointIO in one whose manager lives in the launcher's directory,
  and takes its interval from the launcher when given none.
- A fit started without ``ckpt_path`` resumes from the newest local snapshot when
  there is one (Lightning would not ask the CheckpointIO at all): ``trainer.ckpt_path``
  then reads ``nvrx-local-snapshot:<iteration>``. ``resume_without_path=False`` turns
  this off.
- Every rank saves its own snapshot under the plain strategies (single device, DDP),
  whose ``save_checkpoint`` writes on rank 0 only; a strategy that overrides
  ``save_checkpoint`` (NeMo's MegatronStrategy) is called as NVRx calls it.
- The default :meth:`HierarchicalCheckpointIO.to_tensor_aware_state_dict` stores any
  Lightning checkpoint without pickle (NVRx's is abstract); the global iteration is
  read from a ``step=N`` file name, or from the checkpoint, when no function is given.
- A failed local save is one warning and training goes on; the global checkpoints
  are untouched.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch

from nvrx.ft.checkpointing.local.ckpt_managers.base_manager import (
    CheckpointingException as _CheckpointingException,
)

from ._compat import LightningModule, Trainer, lightning_module
from ._local_ckpt_codec import decode, encode
from ._local_ckpt_options import LOCAL_CKPT_OPTS_KEY

if TYPE_CHECKING:
    from lightning.fabric.plugins import CheckpointIO
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
    from lightning.pytorch.strategies import Strategy
else:
    import importlib

    _pl = lightning_module()
    ModelCheckpoint = _pl.callbacks.ModelCheckpoint
    Strategy = _pl.strategies.Strategy
    CheckpointIO = _pl.plugins.CheckpointIO
    _WrappingCheckpointIO = importlib.import_module(
        _pl.__name__ + ".plugins.io.wrapper"
    )._WrappingCheckpointIO

__all__ = ["LOCAL_CKPT_OPTS_KEY", "HierarchicalCheckpointIO", "LocalCheckpointCallback"]

_logger = logging.getLogger("nvrx.ptl.local_checkpoint")

LOCAL_PATH_PREFIX = "nvrx-local-snapshot:"
"""``trainer.ckpt_path`` after a fit without a path resumed from a local snapshot."""

_STEP_IN_NAME = re.compile(r"(?:^|[^A-Za-z0-9])step=(\d+)")
_warned: set[str] = set()


def _warn_once(key: str, msg: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        _logger.warning(msg, *args)
    else:
        _logger.debug(msg, *args)


class _Manager(Protocol):
    """What :class:`HierarchicalCheckpointIO` needs of a local checkpoint manager."""

    def save(self, state_dict: Any, iteration: int, is_async: bool = False) -> Any: ...

    def load(self) -> tuple[Any, Any]: ...

    def find_latest(self) -> int: ...


def _is_local_path(path: object) -> bool:
    return isinstance(path, str) and path.startswith(LOCAL_PATH_PREFIX)


class HierarchicalCheckpointIO(_WrappingCheckpointIO):
    """A CheckpointIO that saves local snapshots to a manager and loads the newer of two.

    Args:
        wrapped_checkpoint_io: the CheckpointIO of the global checkpoints (None: the
            strategy's default, filled in by Lightning).
        local_ckpt_manager: the local checkpoint manager (``save``, ``load``,
            ``find_latest``; :class:`LocalCheckpointManager` or an NVRx-style one).
        get_global_ckpt_iteration_fn: given a global checkpoint's path, its iteration
            (global step). None (nvrx): the ``step=N`` in the file name, else the
            ``global_step`` inside the checkpoint (then loaded once, not twice).
        async_save: passed to the manager's ``save(is_async=...)`` unless the save's
            options say otherwise.

    Saves whose ``storage_options`` hold :data:`LOCAL_CKPT_OPTS_KEY` (``{'iteration':
    int, 'is_async': bool (optional)}``) go to the manager, with no path (a path is a
    ValueError); the others to the wrapped CheckpointIO. ``load_checkpoint(path)``
    loads the local snapshot when its iteration is at least the global one, else the
    global checkpoint (with a warning), as NVRx does; a path of the form
    ``nvrx-local-snapshot:<iteration>`` loads the local snapshot only.
    """

    def __init__(
        self,
        wrapped_checkpoint_io: CheckpointIO | None,
        local_ckpt_manager: _Manager,
        get_global_ckpt_iteration_fn: Callable[[Any], int] | None = None,
        async_save: bool = False,
    ) -> None:
        super().__init__(wrapped_checkpoint_io)
        self.local_ckpt_manager = local_ckpt_manager
        self.get_global_ckpt_iteration_fn = get_global_ckpt_iteration_fn
        self.async_save = async_save
        self._global_loaded: tuple[Any, dict[str, Any]] | None = None
        self._local_loaded: Any = None

    def _wrapped(self) -> CheckpointIO:
        io = self.checkpoint_io
        if io is None:
            raise RuntimeError("HierarchicalCheckpointIO has no wrapped CheckpointIO yet")
        return io

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> Any:
        """Save a local snapshot (local options given) or a global checkpoint."""
        if not isinstance(storage_options, Mapping) or LOCAL_CKPT_OPTS_KEY not in storage_options:
            return self._wrapped().save_checkpoint(checkpoint, path, storage_options)
        if path is not None:
            raise ValueError(f"Path shouldn't be set for a local checkpoint, got: {path}.")
        return self._save_local_checkpoint(checkpoint, storage_options[LOCAL_CKPT_OPTS_KEY])

    def _save_local_checkpoint(
        self, checkpoint: dict[str, Any], local_ckpt_options: Mapping[str, Any]
    ) -> Any:
        """Hand the checkpoint to the manager as a tensor-aware state dict."""
        return self.local_ckpt_manager.save(
            self.to_tensor_aware_state_dict(checkpoint),
            int(local_ckpt_options["iteration"]),
            is_async=bool(local_ckpt_options.get("is_async", self.async_save)),
        )

    def latest_local_iteration(self) -> int:
        """The newest local snapshot every rank can load, -1 for none (a collective)."""
        return int(self.local_ckpt_manager.find_latest())

    def load_checkpoint(  # type: ignore[override]
        self, path: Any, map_location: Any | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Load the newer of the local snapshot and the global checkpoint at ``path``."""
        if _is_local_path(path):
            return self._load_local(map_location, **kwargs)
        local_iteration = self.latest_local_iteration()
        if local_iteration < 0:
            _logger.debug("no local checkpoint available")
            return self._load_global(path, map_location, **kwargs)
        global_iteration = self._global_iteration(path, map_location, **kwargs)
        if local_iteration >= global_iteration:
            _logger.info(
                "Resuming from a local checkpoint: local iteration %d, global %d (%s)",
                local_iteration,
                global_iteration,
                path,
            )
            self._global_loaded = None
            try:
                tasd = self.local_ckpt_manager.load()[0]
            except _CheckpointingException as exc:  # the same on every rank
                _logger.warning("loading the local checkpoint failed (%s): loading %s", exc, path)
                return self._load_global(path, map_location, **kwargs)
            return self._from_local(tasd, map_location, **kwargs)
        _logger.warning(
            "a local checkpoint of iteration %d is available, but the global checkpoint %s "
            "of iteration %d is newer: resuming from the global checkpoint",
            local_iteration,
            path,
            global_iteration,
        )
        return self._load_global(path, map_location, **kwargs)

    def _load_global(self, path: Any, map_location: Any, **kwargs: Any) -> dict[str, Any]:
        cached, self._global_loaded = self._global_loaded, None
        if cached is not None and cached[0] == path:
            checkpoint = cached[1]
        else:
            checkpoint = self._wrapped().load_checkpoint(path, map_location=map_location, **kwargs)
        self._record_global(checkpoint)
        return checkpoint

    def _record_global(self, checkpoint: Mapping[str, Any]) -> None:
        """Tell ft_launcher (through the manager's restore record) that this rank resumed
        from the global checkpoint; telemetry, so it never fails the load."""
        record = getattr(self.local_ckpt_manager, "record_global_restore", None)
        if not callable(record):
            return
        try:
            step = checkpoint.get("global_step")
            record(int(step) if isinstance(step, int) else None)
        except Exception as exc:
            _logger.debug("no restore record for the global checkpoint: %s", exc)

    def _global_iteration(self, path: Any, map_location: Any, **kwargs: Any) -> int:
        if self.get_global_ckpt_iteration_fn is not None:
            return int(self.get_global_ckpt_iteration_fn(path))
        match = _STEP_IN_NAME.search(os.path.basename(os.fspath(path)))
        if match:
            return int(match.group(1))
        checkpoint = self._wrapped().load_checkpoint(path, map_location=map_location, **kwargs)
        self._global_loaded = (path, checkpoint)
        return int(checkpoint.get("global_step", -1))

    def _load_local(self, map_location: Any, **kwargs: Any) -> dict[str, Any]:
        tasd, self._local_loaded = self._local_loaded, None
        if tasd is None:
            tasd = self.local_ckpt_manager.load()[0]
        return self._from_local(tasd, map_location, **kwargs)

    def _preload_local(self) -> bool:
        """Load the agreed local snapshot now (a collective); False when that failed.

        Used before Lightning is told to restore from it, so a snapshot that cannot be
        loaded (on any rank: the manager then raises on every rank) means a start
        without it instead of a failed fit.
        """
        try:
            self._local_loaded = self.local_ckpt_manager.load()[0]
        except _CheckpointingException as exc:
            _logger.warning("loading the local checkpoint failed (%s): not resuming from it", exc)
            return False
        return True

    def _from_local(self, tasd: Any, map_location: Any, **kwargs: Any) -> dict[str, Any]:
        checkpoint = self.from_tensor_aware_state_dict(tasd, **_accepted(self, kwargs))
        if isinstance(map_location, (str, torch.device)):
            checkpoint = _map_tensors(checkpoint, torch.device(map_location))
        return checkpoint  # type: ignore[no-any-return]

    def remove_checkpoint(self, path: Any) -> None:
        """Remove a global checkpoint (the manager removes old local snapshots itself)."""
        self._wrapped().remove_checkpoint(path)

    @classmethod
    def get_partial_wrapper_constructor(
        cls,
        local_ckpt_manager: _Manager,
        get_global_ckpt_iteration_fn: Callable[[Any], int] | None = None,
        async_save: bool = False,
    ) -> Callable[..., HierarchicalCheckpointIO]:
        """A constructor that still needs the wrapped CheckpointIO (its first argument)."""
        return functools.partial(
            cls,
            local_ckpt_manager=local_ckpt_manager,
            get_global_ckpt_iteration_fn=get_global_ckpt_iteration_fn,
            async_save=async_save,
        )

    def to_tensor_aware_state_dict(self, checkpoint: dict[str, Any]) -> Any:
        """The checkpoint as the manager's tensor-aware state dict (override for MCore).

        nvrx's default takes any Lightning checkpoint: values that are not tensors or
        JSON values (int keys, tuples, paths, non-finite floats) are tagged, never
        pickled (see :mod:`nvrx.ptl._local_ckpt_codec`).
        """
        from nvrx.ft.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict

        return BasicTensorAwareStateDict(encode(checkpoint))

    def from_tensor_aware_state_dict(self, tensor_aware_checkpoint: Any, **kwargs: Any) -> Any:
        """The Lightning checkpoint back from a loaded tensor-aware state dict."""
        to_state_dict = getattr(tensor_aware_checkpoint, "to_state_dict", None)
        tree = (
            to_state_dict()
            if callable(to_state_dict)
            else getattr(tensor_aware_checkpoint, "state_dict", tensor_aware_checkpoint)
        )
        return decode(tree)


def _accepted(io: HierarchicalCheckpointIO, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The load options ``from_tensor_aware_state_dict`` takes.

    Lightning's own strategies pass ``weights_only`` (a ``torch.load`` option), which
    NeMo's override, for one, does not take; MegatronStrategy passes its own options.
    """
    if not kwargs:
        return kwargs
    try:
        params = inspect.signature(io.from_tensor_aware_state_dict).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _map_tensors(tree: Any, device: torch.device) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: _map_tensors(v, device) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_map_tensors(v, device) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_map_tensors(v, device) for v in tree)
    return tree


def find_hierarchical_io(io: object) -> HierarchicalCheckpointIO | None:
    """The HierarchicalCheckpointIO in a chain of wrapping CheckpointIOs, or None."""
    seen = 0
    while io is not None and seen < 16:
        if isinstance(io, HierarchicalCheckpointIO):
            return io
        io = getattr(io, "checkpoint_io", None)
        seen += 1
    return None


def _saves_on_rank_zero_only(strategy: object) -> bool:
    """True for strategies whose save_checkpoint is Lightning's (rank 0 writes alone)."""
    return getattr(type(strategy), "save_checkpoint", None) is Strategy.save_checkpoint


def _settings_from_env() -> Any:
    """The launcher's local snapshot settings (None when not under ft_launcher)."""
    from nvrx.ft.checkpointing.local import LocalCkptSettings

    return LocalCkptSettings.from_env()


def _manager_from_env(settings: Any) -> _Manager:
    """A local checkpoint manager in the launcher's node directory, with its replicas."""
    from nvrx.ft.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
    from nvrx.ft.checkpointing.local.replication.strategies import CliqueReplicationStrategy

    replicas = int(settings.replicas)
    strategy = (
        CliqueReplicationStrategy(None, replication_factor=replicas + 1) if replicas > 0 else None
    )
    return LocalCheckpointManager(settings.node_dir, repl_strategy=strategy)


def _finish(request: Any) -> None:
    """Wait for an async local save and run its check (every rank, together)."""
    execute_sync = getattr(request, "execute_sync", None)
    if callable(execute_sync):
        execute_sync()


class LocalCheckpointCallback(ModelCheckpoint):
    """Take a local snapshot every N training steps or T seconds (NVRx's callback).

    A :class:`ModelCheckpoint` whose only save is the local snapshot after a training
    batch; epoch-end, validation-end, top-k and on-exception saves are skipped. Use it
    with a :class:`HierarchicalCheckpointIO` (set on the strategy before ``fit``, as
    NeMo's ``update_trainer_local_checkpoint_io`` does), or, under ``ft_launcher``
    with local snapshots on, alone. Put it after the trainer's global
    ModelCheckpoint: Lightning takes the first ModelCheckpoint for ``ckpt_path="best"``.

    Args:
        every_n_train_steps: a snapshot every this many training steps.
        train_time_interval: a snapshot when this much time passed since the last
            (a timedelta, as ModelCheckpoint takes, or seconds). Giving both is an
            error, as in ModelCheckpoint; giving neither takes the launcher's
            ``NVRX_LOCAL_CKPT_EVERY_N_STEPS``/``NVRX_LOCAL_CKPT_EVERY_S``.
        resume_without_path: nvrx; a fit started without ``ckpt_path`` resumes from
            the newest local snapshot if there is one (True by default).
    """

    def __init__(
        self,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | float | None = None,
        *,
        resume_without_path: bool = True,
    ) -> None:
        every_s: float | None = None
        if every_n_train_steps is None and train_time_interval is None:
            with contextlib.suppress(Exception):  # no launcher settings: no interval
                settings = _settings_from_env()
                if settings is not None:
                    every_n_train_steps = settings.every_n_steps
                    every_s = settings.every_s
        elif isinstance(train_time_interval, (int, float)):
            every_s = float(train_time_interval)
        elif train_time_interval is not None:
            every_s = train_time_interval.total_seconds()
        both = every_n_train_steps is not None and every_s is not None
        super().__init__(
            save_top_k=0,
            every_n_train_steps=every_n_train_steps,
            train_time_interval=(
                None
                if every_s is None or (both and train_time_interval is None)
                else timedelta(seconds=every_s)
            ),
        )
        self._local_every_n = every_n_train_steps or 0
        self._local_every_s = every_s
        self.resume_without_path = resume_without_path
        self._hooked: tuple[object, Callable[..., Any]] | None = None
        self._pending: Any = None  # the last async save's request, finished at the next
        self._installed: tuple[object, HierarchicalCheckpointIO] | None = None

    # -- what ModelCheckpoint would save: nothing but the local snapshot ---------------

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """No save at epoch end (local snapshots are taken after training batches)."""

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """No save after validation."""

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """No save on an exception (the last snapshot stays)."""

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """No "last" save at the end of training; the last async save is finished."""
        self._finish_pending()

    def _save_topk_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, Any]) -> None:
        """No top-k saves."""

    def _save_last_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, Any]) -> None:
        """The "last" save is the local snapshot (as in NVRx)."""
        self._save_local(trainer)

    # -- set-up: the CheckpointIO and the resume without a path ------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Find (or, under ft_launcher, install) the HierarchicalCheckpointIO."""
        super().setup(trainer, pl_module, stage)
        if stage != "fit":
            return
        io = find_hierarchical_io(trainer.strategy.checkpoint_io)
        if io is None:
            io = self._install_from_env(trainer)
        if io is None:
            _warn_once(
                "no-io",
                "LocalCheckpointCallback: the trainer has no HierarchicalCheckpointIO and "
                "NVRX_LOCAL_CKPT_DIR is not set (not under ft_launcher with local "
                "snapshots on): no local snapshots are taken",
            )
            return
        if not self._local_every_n and self._local_every_s is None:
            _warn_once(
                "no-interval",
                "LocalCheckpointCallback: neither every_n_train_steps nor "
                "train_time_interval is set (nor the launcher's interval): no local "
                "snapshots are taken",
            )
        if self.resume_without_path:
            self._hook_resume(trainer)

    def _install_from_env(self, trainer: Trainer) -> HierarchicalCheckpointIO | None:
        try:
            settings = _settings_from_env()
            if settings is None:
                return None
            manager = _manager_from_env(settings)
        except Exception as exc:  # a rank never fails for its local snapshot set-up
            _warn_once("env-io", "LocalCheckpointCallback: no local snapshots: %s", exc)
            return None
        # async: the step pays for the copy only; the callback finishes each save later
        io = HierarchicalCheckpointIO(trainer.strategy.checkpoint_io, manager, async_save=True)
        trainer.strategy.checkpoint_io = io
        self._installed = (trainer.strategy, io)
        _logger.info("local snapshots in %s", settings.node_dir)
        return io

    def _hook_resume(self, trainer: Trainer) -> None:
        """Make a fit without ``ckpt_path`` resume from the newest local snapshot.

        Lightning's checkpoint connector reads no checkpoint when no path was chosen,
        so its ``resume_start`` (the one place every restore starts, on every rank) is
        wrapped for this trainer: without a path, it is given the local snapshot's.
        """
        connector = trainer._checkpoint_connector
        if self._hooked is not None and self._hooked[0] is connector:
            return
        original = connector.resume_start

        @functools.wraps(original)
        def resume_start(checkpoint_path: Any = None, *args: Any, **kwargs: Any) -> Any:
            if not checkpoint_path and trainer.state.fn == "fit":
                checkpoint_path = self._local_resume_path(trainer)
            return original(checkpoint_path, *args, **kwargs)

        connector.resume_start = resume_start  # type: ignore[method-assign]
        self._hooked = (connector, resume_start)

    def _local_resume_path(self, trainer: Trainer) -> str | None:
        io = find_hierarchical_io(trainer.strategy.checkpoint_io)
        if io is None:
            return None
        try:
            iteration = io.latest_local_iteration()
        except Exception as exc:  # not usable: start without it (every rank alike)
            _warn_once("find-latest", "cannot look for local snapshots: %r", exc)
            return None
        if iteration < 0 or not io._preload_local():
            return None
        _logger.info("Resuming from a local checkpoint of iteration %d (no ckpt_path)", iteration)
        return f"{LOCAL_PATH_PREFIX}{iteration}"

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Give the trainer its own ``resume_start`` and CheckpointIO back.

        The manager this callback made (under ft_launcher) is closed: its last save
        is finished and its background threads stop. Snapshots stay for the launcher.
        """
        super().teardown(trainer, pl_module, stage)
        if self._hooked is not None:
            connector, wrapper = self._hooked
            if vars(connector).get("resume_start") is wrapper:
                del connector.resume_start  # type: ignore[attr-defined]
            self._hooked = None
        if self._installed is not None:
            strategy, io = self._installed
            self._installed = None
            if getattr(strategy, "checkpoint_io", None) is io and io.checkpoint_io is not None:
                strategy.checkpoint_io = io.checkpoint_io  # type: ignore[attr-defined]
            close = getattr(io.local_ckpt_manager, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as exc:
                    _warn_once("close", "closing the local checkpoint manager: %r", exc)

    # -- the save ---------------------------------------------------------------------

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Take a snapshot when the step count or the time interval says so."""
        if (
            getattr(trainer, "fast_dev_run", False)
            or trainer.state.fn != "fit"
            or trainer.sanity_checking
            or self._last_global_step_saved == trainer.global_step
        ):
            return
        step = trainer.global_step
        due = self._local_every_n >= 1 and step % self._local_every_n == 0
        if self._local_every_s is not None:
            now = time.monotonic()
            last = self._last_time_checked
            time_due = last is not None and now - last >= self._local_every_s
            time_due = bool(trainer.strategy.broadcast(time_due))  # the same on every rank
            if time_due:
                self._last_time_checked = now
            due = due or time_due
        if due:
            self._save_local(trainer)

    def _save_local(self, trainer: Trainer) -> None:
        strategy = trainer.strategy
        if find_hierarchical_io(strategy.checkpoint_io) is None:
            _warn_once(
                "save-no-io",
                "LocalCheckpointCallback: no HierarchicalCheckpointIO: snapshot skipped",
            )
            return
        self._finish_pending()
        step = trainer.global_step
        options = {LOCAL_CKPT_OPTS_KEY: {"ckpt_type": "local", "iteration": step}}
        try:
            if _saves_on_rank_zero_only(strategy):
                # Lightning's own strategies write on rank 0 only; every rank has a snapshot
                checkpoint = trainer._checkpoint_connector.dump_checkpoint(False)
                io = strategy.checkpoint_io
                self._pending = io.save_checkpoint(checkpoint, None, storage_options=options)  # type: ignore[arg-type]
            else:
                trainer.save_checkpoint(None, storage_options=options)  # type: ignore[arg-type]
        except Exception as exc:  # the previous snapshot stays valid: keep training
            _warn_once(
                "save-failed",
                "local snapshot of step %d failed, training goes on: %r",
                step,
                exc,
            )
            return
        self._last_global_step_saved = step
        self._last_checkpoint_saved = f"{LOCAL_PATH_PREFIX}{step}"

    def _finish_pending(self) -> None:
        request, self._pending = self._pending, None
        if request is None:
            return
        try:
            _finish(request)
        except Exception as exc:  # that snapshot is not usable; the one before stays
            _warn_once("finish-failed", "a local snapshot failed, training goes on: %r", exc)
