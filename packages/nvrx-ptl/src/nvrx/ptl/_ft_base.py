"""What both FT callbacks share: environment checks, the FT state directory, the
monitor client's life cycle, timeout persistence and the simulated fault."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvrx.ft import (
    MONITOR_SOCKET_ENV,
    RankMonitorClient,
    RankMonitorClientError,
    monitor_socket_from_env,
)

from ._compat import Callback, LightningModule, Timer, Trainer
from ._cycle_metrics import report_cycle_metrics, trainer_and_module
from .ft_state import FT_DIR_NAME, StatePart, load_ft_state, save_ft_state
from .simulated_fault import (
    SimulatedFault,
    SimulatedFaultParams,
    parse_simulated_fault_params,
    plan_simulated_fault,
)
from .training_state import TrainingProgress, TrainingStateMachine

__all__ = ["FINISHED_FLAG_ENV", "FtCallbackBase", "progress_from_trainer"]

#: Environment variable naming the file that marks a finished training (autoresume).
FINISHED_FLAG_ENV = "FAULT_TOL_FINISHED_FLAG_FILE"


def _time_limit_reached(trainer: Trainer) -> bool:
    """True when a Timer whose elapsed time persists across jobs (``max_time``) ran out.

    A timer that does not save its state (e.g. NeMo's StatelessTimer) is a per-job
    budget: running out of it does not end the training.
    """
    for cb in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(cb, Timer) and type(cb).state_dict is Timer.state_dict:
            remaining = cb.time_remaining()
            if remaining is not None and remaining <= 0:
                return True
    return False


def _overrides(module: object, name: str) -> bool:
    """True when ``module``'s class (not Lightning's base class) defines ``name``."""
    for cls in type(module).__mro__:
        if name in vars(cls):
            return not cls.__module__.startswith(("lightning.", "pytorch_lightning."))
    return False


def _learn_expectations(trainer: Any, pl_module: Any) -> list[str]:
    """The slow events this fit has, which learned timeouts must see first."""
    expect = []
    if getattr(trainer, "checkpoint_callback", None) is not None:
        expect.append("checkpoint")
    if getattr(trainer, "limit_val_batches", 1) != 0 and _overrides(pl_module, "validation_step"):
        expect.append("validation")
    return expect


def progress_from_trainer(trainer: Trainer) -> TrainingProgress:
    """Snapshot the limits and counters that decide whether training is complete."""
    early_stopped = False
    for cb in trainer.early_stopping_callbacks:
        reason = getattr(cb, "stopping_reason", None)
        if reason is not None:
            early_stopped = early_stopped or getattr(reason, "name", "NOT_STOPPED") != "NOT_STOPPED"
        else:
            early_stopped = early_stopped or cb.stopped_epoch > 0
    return TrainingProgress(
        global_step=trainer.global_step,
        current_epoch=trainer.current_epoch,
        max_steps=trainer.max_steps,
        max_epochs=trainer.max_epochs,
        early_stopped=early_stopped,
        time_limit_reached=_time_limit_reached(trainer),
    )


class FtCallbackBase(Callback):
    """Base of the FT callbacks: constructor arguments, set-up and shut-down of FT."""

    #: Name of the FT state file in the FT directory (NVRx's name for the same callback).
    TIMEOUTS_FILENAME: str
    #: Directory of the FT state under ``trainer.log_dir`` when no ``exp_dir`` is given.
    FT_DIR_NAME = FT_DIR_NAME
    #: The part of the FT state this callback calculates and loads.
    _STATE_PART: StatePart
    #: Logs the restart cycle, restart count and goodput at on_train_start (the first nvrx
    #: callback on the trainer that does is the one that logs them).
    _reports_cycle_metrics = True
    #: Sections whose timeouts are learned within the job (None: all).
    _LEARNED_SECTIONS: tuple[str, ...] | None = None

    def __init__(
        self,
        autoresume: bool,
        calculate_timeouts: bool,
        simulated_fault_params: Any = None,
        exp_dir: str | os.PathLike[str] | None = None,
        logger_name: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(autoresume, bool):
            raise ValueError(f"autoresume must be a bool, got {autoresume!r}")
        if not isinstance(calculate_timeouts, bool):
            raise ValueError(f"calculate_timeouts must be a bool, got {calculate_timeouts!r}")
        self.autoresume = autoresume
        self.calculate_timeouts = calculate_timeouts
        self.simulated_fault_params: SimulatedFaultParams | None = parse_simulated_fault_params(
            simulated_fault_params
        )
        self.exp_dir = Path(exp_dir) if exp_dir is not None else None
        self.logger = logging.getLogger(logger_name or "nemo_logger.FaultToleranceCallback")
        self.fault_tol_client: RankMonitorClient | None = None
        self.state_file_path: Path | None = None
        self.simulated_fault: SimulatedFault | None = None
        self.state_machine = TrainingStateMachine()
        self._rank = 0
        self._is_rank0 = True
        self._epoch_starts = 0

    @property
    def is_initialized(self) -> bool:
        """True while FT monitoring is active (between a fit's setup and its end)."""
        return self.fault_tol_client is not None

    # -- logging: rank 0 speaks for the job, other ranks only about themselves ---------------

    def _log0(self, level: int, msg: str, *args: object) -> None:
        if self._is_rank0:
            self._log_own(level, msg, *args)

    def _log_own(self, level: int, msg: str, *args: object) -> None:
        self.logger.log(level, f"[{type(self).__name__}@rank{self._rank}] {msg}", *args)

    # -- set-up ------------------------------------------------------------------------------

    def _verify_env(self, trainer: Trainer) -> None:
        others = [
            type(cb).__name__
            for cb in trainer.callbacks  # type: ignore[attr-defined]
            if isinstance(cb, FtCallbackBase) and cb is not self
        ]
        if others:
            raise ValueError(
                f"{type(self).__name__} cannot be used together with {', '.join(others)}: "
                "a rank has one monitor connection; use heartbeats or sections, not both"
            )
        if self.autoresume and not os.environ.get(FINISHED_FLAG_ENV):
            raise RuntimeError(
                f"{type(self).__name__}(autoresume=True) needs the {FINISHED_FLAG_ENV} "
                "environment variable (the file created when training completes, read by your "
                "autoresume loop), but it is not set. Set it, or use autoresume=False."
            )
        if monitor_socket_from_env(os.environ) is None:
            raise RankMonitorClientError(
                f"{type(self).__name__} needs a rank monitor, but {MONITOR_SOCKET_ENV} is not "
                "set: run the training with ft_launcher (a torchrun replacement), or remove the "
                "callback to train without fault tolerance."
            )

    def _resolve_ft_dir(self, trainer: Trainer) -> Path:
        if self.exp_dir is not None:
            ft_dir = self.exp_dir
        else:
            log_dir = trainer.log_dir
            base = Path(log_dir if log_dir is not None else trainer.default_root_dir)
            ft_dir = base / self.FT_DIR_NAME
            if self.calculate_timeouts and re.fullmatch(r"version_\d+", base.name):
                self._log0(
                    logging.WARNING,
                    "The FT state goes to %s, inside this run's logger version directory: the "
                    "next job gets a new version and will not find the calculated timeouts. "
                    "Pass exp_dir= (a directory every job of this training sees).",
                    ft_dir,
                )
        ft_dir.mkdir(parents=True, exist_ok=True)
        return ft_dir

    def _setup_fault_tolerance(self, trainer: Trainer) -> RankMonitorClient:
        """Connect to the monitor and load the previous job's calculated timeouts."""
        self._rank = trainer.global_rank
        self._is_rank0 = trainer.is_global_zero
        ft_dir = self._resolve_ft_dir(trainer)
        self.state_file_path = ft_dir / self.TIMEOUTS_FILENAME
        self._log0(logging.INFO, "Fault tolerance dir: %s", ft_dir)
        client = RankMonitorClient()
        client.init_workload_monitoring()
        self.fault_tol_client = client
        if self.calculate_timeouts:
            self._maybe_load_timeouts(client, self.state_file_path)
        return client

    def _enable_learning(
        self, client: RankMonitorClient, trainer: Trainer, pl_module: LightningModule
    ) -> None:
        """Learned timeouts with ``calculate_timeouts`` (or ``learn_timeouts: true``).

        They wait for a first checkpoint save when the trainer has a checkpoint callback
        and for a first validation when the module has a validation step.
        """
        self._epoch_starts = 0
        cfg = client.cfg
        if not (self.calculate_timeouts or (cfg is not None and cfg.learn_timeouts)):
            return
        try:
            client.enable_learned_timeouts(
                _learn_expectations(trainer, pl_module), self._LEARNED_SECTIONS
            )
        except Exception as exc:  # never fail the fit for it
            self._log_own(logging.WARNING, "learned timeouts not enabled: %s", exc)

    def _note(self, kind: str, trainer: Any = None) -> None:
        """Tell the client a checkpoint save, validation or epoch boundary is starting."""
        client = self.fault_tol_client
        if client is None or getattr(trainer, "sanity_checking", False):
            return
        try:
            if kind == "checkpoint":
                client.note_checkpoint_save()
            elif kind == "validation":
                client.note_validation()
            else:
                client.note_epoch_boundary()
        except Exception:  # monitoring never breaks training
            self._log_own(logging.DEBUG, "could not note %s", kind)

    def on_train_epoch_start(self, *args: Any, **kwargs: Any) -> None:
        """A later epoch's start is an epoch boundary (its data loader starts next)."""
        self._epoch_starts += 1
        if self._epoch_starts > 1:
            self._note("epoch")

    def _maybe_load_timeouts(self, client: RankMonitorClient, path: Path) -> None:
        """Load the calculated timeouts of earlier jobs; a bad file never fails set-up."""
        try:
            state = load_ft_state(path, self._STATE_PART)
            if state is None:
                return
            client.load_state_dict(state)
        except Exception as exc:  # whatever is wrong with the file, the config's timeouts apply
            self._log0(
                logging.WARNING,
                "Ignoring the FT state file %s, not an FT state nvrx can use (%s); "
                "using the timeouts of the FT config",
                path,
                exc,
            )
            return
        self._log0(logging.INFO, "Fault tolerance timeouts loaded from %s", path)

    def _setup_simulated_fault(self, trainer: Trainer) -> None:
        params = self.simulated_fault_params
        if params is None:
            return
        self._log0(logging.WARNING, "Initializing simulated fault: %s", params)
        plan = plan_simulated_fault(params, trainer.world_size, trainer.strategy.root_device)
        if plan.rank_to_fail != self._rank:
            return
        self._log_own(
            logging.WARNING,
            "Simulated fault %s will hit this rank in %.2f s",
            plan.fault_type,
            plan.delay,
        )
        self.simulated_fault = SimulatedFault(plan, self._rank, self.logger)
        self.simulated_fault.start()

    def _report_cycle(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The cycle-info metrics, once per fit (a rank lives for one restart cycle)."""
        trainer, pl_module = trainer_and_module(args, kwargs)
        report_cycle_metrics(self, trainer, pl_module, self._log0)

    # -- end of fit: the same frame for both callbacks ---------------------------------------

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """End of fit: finished flag, the callback's last report, disconnect."""
        if stage != "fit" or not self.is_initialized:
            return
        try:
            self._end_fit(trainer)
            self._last_report(None)
        finally:
            self._close()

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """An exception ends fit: the callback's last report, then disconnect."""
        if not self.is_initialized:
            return
        try:
            self.state_machine.on_exception(exception)
            self._last_report(exception)
        finally:
            self._close()

    def on_load_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Note that this job resumed from a checkpoint (any call shape, as NVRx's)."""
        if self.fault_tol_client is not None:
            self.state_machine.on_load_checkpoint()

    def _last_report(self, exception: BaseException | None) -> None:
        """What the callback tells the monitor before fit ends (``exception``: why)."""
        raise NotImplementedError

    def _close(self) -> None:
        """Disconnect from the monitor; subclasses undo their own set-up first."""
        self._shutdown_fault_tolerance()

    def _save_timeouts(self) -> None:
        """Persist the calculated timeouts (rank 0 writes; the state is the same on all ranks)."""
        client = self.fault_tol_client
        if client is None or self.state_file_path is None or not self._is_rank0:
            return
        save_ft_state(self.state_file_path, client.state_dict())
        self._log0(logging.INFO, "Fault tolerance state saved to %s", self.state_file_path)

    def _update_timeouts_safely(self, update: Callable[[], None]) -> None:
        """Run a timeouts update; a failure is logged and never fails the job."""
        try:
            update()
        except Exception as exc:
            self._log_own(logging.ERROR, "FT timeouts not updated: %r", exc)

    def _end_fit(self, trainer: Trainer) -> None:
        """Teardown of fit: with autoresume, rank 0 flags a completed training as finished."""
        self.state_machine.on_teardown()
        if (
            self.autoresume
            and self._is_rank0
            and self.state_machine.is_training_completed(progress_from_trainer(trainer))
        ):
            self._create_finished_flag_file()

    def _create_finished_flag_file(self) -> None:
        flag = os.environ.get(FINISHED_FLAG_ENV, "")
        try:
            path = Path(flag)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        except OSError as exc:
            self._log_own(
                logging.ERROR, "Could not create the finished flag file %r: %s", flag, exc
            )
            return
        self._log_own(logging.INFO, "Training completed: created the finished flag file %s", flag)

    def _shutdown_fault_tolerance(self) -> None:
        if self.simulated_fault is not None:
            self.simulated_fault.cancel()
            self.simulated_fault = None
        client = self.fault_tol_client
        self.fault_tol_client = None
        if client is not None:
            client.shutdown_workload_monitoring()
