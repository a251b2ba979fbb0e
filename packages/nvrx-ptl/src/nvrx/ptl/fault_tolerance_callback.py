"""FaultToleranceCallback: heartbeats from Lightning's hooks to the rank monitor."""

from __future__ import annotations

import logging
import os
from typing import Any

from ._compat import LightningModule, Trainer
from ._ft_base import FtCallbackBase
from .ft_state import HEARTBEAT_STATE_FILENAME
from .simulated_fault import SimulatedFaultParams
from .training_state import TrainingStateMachine

__all__ = ["FaultToleranceCallback", "SimulatedFaultParams"]  # both, as in NVRx


class FaultToleranceCallback(FtCallbackBase):
    """Lightning callback that sends FT heartbeats, so a hung rank is detected and restarted.

    FT is only active during the 'fit' stage, and the training must run under
    ``ft_launcher`` (which starts the rank monitors): ``setup`` raises a clear error
    otherwise. Heartbeats are sent at train start, after each training batch, around
    validation, when a checkpoint is saved, at train end, at teardown and on an
    exception.

    Args:
        autoresume: True when several training jobs run one after another
            (auto-resume); the file named by ``FAULT_TOL_FINISHED_FLAG_FILE`` is then
            created when training completes.
        calculate_timeouts: True to calculate heartbeat timeouts from the observed
            intervals; they are calculated at the end of a job that loaded and saved a
            checkpoint (so the second job of a training started from scratch), saved
            under ``exp_dir`` and used by the next jobs instead of the FT config's.
        simulated_fault_params: a simulated fault for testing (a
            :class:`SimulatedFaultParams`, a dict or a DictConfig); None for none.
        exp_dir: directory of the FT state, shared by all the jobs of a training.
            Defaults to ``trainer.log_dir/ft_state`` (beware: Lightning may move or
            version its log dir, so prefer an explicit one).
        logger_name: name of the logger of this callback's messages; NVRx's default,
            ``"nemo_logger.FaultToleranceCallback"``, where NeMo's handlers listen (and
            its tests look). Pass another name to log elsewhere; None: the default.

    The calculated timeouts are kept in ``<exp_dir>/_ft_state.json``
    (:attr:`TIMEOUTS_FILENAME`), NVRx's name for this callback's state, so timeouts
    calculated under NVRx carry over. Hooks accept any call shape, as NVRx's do.
    """

    TIMEOUTS_FILENAME = HEARTBEAT_STATE_FILENAME
    _STATE_PART = "heartbeat"

    def __init__(
        self,
        autoresume: bool,
        calculate_timeouts: bool,
        simulated_fault_params: SimulatedFaultParams | dict[str, Any] | Any | None = None,
        exp_dir: str | os.PathLike[str] | None = None,
        logger_name: str | None = "nemo_logger.FaultToleranceCallback",
    ) -> None:
        super().__init__(
            autoresume=autoresume,
            calculate_timeouts=calculate_timeouts,
            simulated_fault_params=simulated_fault_params,
            exp_dir=exp_dir,
            logger_name=logger_name,
        )

    # -- set-up and tear-down ----------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Connect to the rank monitor and load calculated timeouts (fit only)."""
        if stage != "fit":
            return
        self._verify_env(trainer)
        self.state_machine = TrainingStateMachine()
        client = self._setup_fault_tolerance(trainer)
        timeouts = client.hb_timeouts
        if timeouts is not None and timeouts.are_valid:
            self._log0(logging.INFO, "Fault tolerance client initialized. Timeouts: %s", timeouts)
        elif self.calculate_timeouts:
            self._log0(
                logging.INFO,
                "Fault tolerance client initialized. Timeouts: not calculated yet (%s)",
                timeouts,
            )
        else:
            self._shutdown_fault_tolerance()
            raise RuntimeError(
                "Fault tolerance has no valid heartbeat timeouts and calculate_timeouts is False: "
                "set initial_rank_heartbeat_timeout and rank_heartbeat_timeout in the FT config, "
                f"or use calculate_timeouts=True (current: {timeouts})"
            )
        self._enable_learning(client, trainer, pl_module)
        self._setup_simulated_fault(trainer)

    def _last_report(self, exception: BaseException | None) -> None:
        """A last heartbeat, then the timeouts update (skipped after a failure)."""
        self._heartbeat()
        self._update_timeouts_safely(self._maybe_update_timeouts)

    # -- heartbeats --------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        client = self.fault_tol_client
        if client is not None:
            client.send_heartbeat()
            self.state_machine.on_heartbeat_sent()

    def on_train_start(self, *args: Any, **kwargs: Any) -> None:
        """Heartbeat when training starts; log the restart cycle's metrics."""
        self._heartbeat()
        self._report_cycle(args, kwargs)

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        """Heartbeat and count the iteration after each training batch."""
        if self.fault_tol_client is not None:
            self.state_machine.on_train_iteration()
            self._heartbeat()

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        """Heartbeat when training ends."""
        self._heartbeat()

    def on_validation_start(self, trainer: Any = None, *args: Any, **kwargs: Any) -> None:
        """Heartbeat when validation starts, then note it (learned timeouts)."""
        self._heartbeat()
        self._note("validation", trainer)

    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        """Heartbeat after each validation batch."""
        self._heartbeat()

    def on_validation_end(self, *args: Any, **kwargs: Any) -> None:
        """Heartbeat when validation ends."""
        self._heartbeat()

    def on_save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Note the save and heartbeat (back-to-back saves must not look like a hang)."""
        if self.fault_tol_client is not None:
            self.state_machine.on_save_checkpoint()
            self._heartbeat()
            self._note("checkpoint")  # after the heartbeat: the next one measures the save

    # -- timeouts ----------------------------------------------------------------------------

    def _maybe_update_timeouts(self) -> None:
        client = self.fault_tol_client
        if client is None or not self.calculate_timeouts:
            return
        if not self.state_machine.can_update_timeouts:
            self._log0(
                logging.INFO,
                "FT timeouts not updated in this job (needs a loaded and a saved checkpoint, "
                ">= 2 iterations and no failure)",
            )
            return
        self._log0(logging.INFO, "Updating FT timeouts...")
        if not client.calculate_and_set_hb_timeouts(skip_if_not_ready=True):
            self._log0(logging.WARNING, "FT timeouts not updated: not enough heartbeats observed")
            return
        self.state_machine.on_timeouts_updated()
        self._log0(logging.INFO, "Updated FT timeouts. New values: %s", client.hb_timeouts)
        self._save_timeouts()
