"""FaultToleranceSectionsCallback: FT sections 'setup', 'step' and 'checkpointing'."""

from __future__ import annotations

import collections
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from nvrx.ft import RankMonitorClientError, WorkloadAction, WorkloadControlRequest

from ._compat import LightningModule, Trainer
from ._ft_base import FtCallbackBase
from .ft_state import SECTIONS_STATE_FILENAME
from .simulated_fault import SimulatedFaultParams
from .training_state import TrainingStateMachine, is_clean_stop

__all__ = ["SECTION_NAMES", "FaultToleranceSectionsCallback"]

#: The sections this callback opens; the FT config's rank_section_timeouts must list exactly these.
SECTION_NAMES = ("setup", "step", "checkpointing")

#: Step timeouts need this many training iterations in the job.
MIN_TR_ITERS_FOR_STEP_TIMEOUT_UPDATE = 16

# Strategy methods timed by each section. 'step' nests (optimizer_step runs the closure
# that calls training_step and backward), and a section counts its nesting depth.
_STEP_METHODS = ("training_step", "backward", "optimizer_step", "validation_step")
_CHECKPOINT_METHODS = ("save_checkpoint", "remove_checkpoint")


class FaultToleranceSectionsCallback(FtCallbackBase):
    """Lightning callback that reports FT sections, so each phase gets its own timeout.

    Sections: ``setup`` (from the fit's setup, including checkpoint loading, to the
    first training or validation batch), ``step`` (each training step: forward,
    backward and optimizer step; and each validation step) and ``checkpointing``
    (checkpoint saves, from building the checkpoint to writing it, and removals,
    including an async save's finalisation).
    Everything else is out-of-section. Sections are closed in ``finally`` blocks, so
    an exception never leaves one open. The FT config's ``rank_section_timeouts``
    must name exactly these three sections.

    Arguments are those of :class:`FaultToleranceCallback`, plus ``exc_handling_policy``:
    a function that maps an exception ending the fit to a
    :class:`nvrx.ft.WorkloadControlRequest` sent to the launcher (e.g. exclude this
    node, or shut the workload down; the latter also creates the finished flag so an
    autoresume loop stops).

    Section timeouts are calculated (with ``calculate_timeouts``) after each
    checkpoint save and at the end of the job: 'setup' once a checkpoint was loaded,
    'step' after more than 16 iterations, 'checkpointing' once a (synchronous) save
    completed, and the out-of-section timeout at the end of a job that saw all three.
    They are kept in ``<exp_dir>/_ft_state_.json`` (:attr:`TIMEOUTS_FILENAME`), NVRx's
    name for this callback's state, so timeouts calculated under NVRx carry over.

    The default logger is NVRx's, ``"nemo_logger.FaultToleranceCallback"`` (the same as
    :class:`FaultToleranceCallback`'s); pass ``logger_name`` to log elsewhere. Hooks
    accept the call shapes NVRx's accept.
    """

    TIMEOUTS_FILENAME = SECTIONS_STATE_FILENAME
    # 'setup' runs once per job, and longer in a job that loads a checkpoint: as in
    # NVRx, only a job that loaded one calculates it.
    _LEARNED_SECTIONS = ("step", "checkpointing")
    _STATE_PART = "section"

    def __init__(
        self,
        autoresume: bool,
        calculate_timeouts: bool,
        simulated_fault_params: SimulatedFaultParams | dict[str, Any] | Any | None = None,
        exp_dir: str | os.PathLike[str] | None = None,
        logger_name: str | None = "nemo_logger.FaultToleranceCallback",
        exc_handling_policy: Callable[[BaseException], WorkloadControlRequest] | None = None,
    ) -> None:
        super().__init__(
            autoresume=autoresume,
            calculate_timeouts=calculate_timeouts,
            simulated_fault_params=simulated_fault_params,
            exp_dir=exp_dir,
            logger_name=logger_name,
        )
        if exc_handling_policy is not None and not callable(exc_handling_policy):
            raise ValueError(f"exc_handling_policy must be callable, got {exc_handling_policy!r}")
        self.exc_handling_policy = exc_handling_policy
        self._reset_run_state()

    def _reset_run_state(self) -> None:
        self.state_machine = TrainingStateMachine()
        self.last_checkpoint_iter = 0
        self.last_timeouts_upd_iter = 0
        self.seen_checkpoint_save = False
        self.uses_async_checkpointing = False
        self._open_depth: collections.Counter[str] = collections.Counter()
        self._wrapped: list[tuple[object, str, bool, Any, Any]] = []

    # -- sections ----------------------------------------------------------------------------

    def _start_section(self, name: str) -> None:
        client = self.fault_tol_client
        if client is None:
            return
        self._open_depth[name] += 1
        if self._open_depth[name] == 1:
            client.start_section(name)

    def _end_section(self, name: str) -> None:
        client = self.fault_tol_client
        if client is None or self._open_depth[name] == 0:
            return
        self._open_depth[name] -= 1
        if self._open_depth[name] == 0:
            client.end_section(name)

    def _close_setup_section(self) -> None:
        """Close 'setup' if it is still open (it is opened once, at the fit's setup)."""
        self._end_section("setup")

    def _wrap(self, obj: object, method: str, section: str) -> None:
        original = getattr(obj, method, None)
        if original is None:
            return

        @functools.wraps(original)
        def in_section(*args: Any, **kwargs: Any) -> Any:
            self._start_section(section)
            try:
                return original(*args, **kwargs)
            finally:
                self._end_section(section)

        own = method in vars(obj)
        setattr(obj, method, in_section)
        self._wrapped.append((obj, method, own, original, in_section))

    def _wrap_strategy(self, trainer: Trainer) -> None:
        # trainer.save_checkpoint also covers building the checkpoint (state dicts, hooks)
        self._wrap(trainer, "save_checkpoint", "checkpointing")
        strategy = trainer.strategy
        for method in _STEP_METHODS:
            self._wrap(strategy, method, "step")
        for method in _CHECKPOINT_METHODS:
            self._wrap(strategy, method, "checkpointing")
        checkpoint_io = strategy.checkpoint_io
        if hasattr(checkpoint_io, "maybe_finalize_save_checkpoint"):
            self.uses_async_checkpointing = True
            self._wrap(checkpoint_io, "maybe_finalize_save_checkpoint", "checkpointing")

    def _unwrap_strategy(self) -> None:
        for obj, method, own, original, wrapper in reversed(self._wrapped):
            if vars(obj).get(method) is not wrapper:
                continue  # wrapped again on top of ours: leave it (ours now passes through)
            if own:
                setattr(obj, method, original)
            else:
                delattr(obj, method)
        self._wrapped.clear()

    # -- set-up and tear-down ----------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Connect to the monitor, load calculated timeouts, wrap the strategy, open 'setup'."""
        if stage != "fit":
            return
        self._verify_env(trainer)
        self._reset_run_state()
        client = self._setup_fault_tolerance(trainer)
        configured = set(client.section_timeouts.section if client.section_timeouts else ())
        if configured != set(SECTION_NAMES):
            self._shutdown_fault_tolerance()
            raise ValueError(
                "FT config rank_section_timeouts must have exactly the sections "
                f"{list(SECTION_NAMES)} for {type(self).__name__}, got {sorted(configured)}"
            )
        self._log0(
            logging.INFO,
            "Fault tolerance client initialized. Timeouts: %s",
            client.section_timeouts,
        )
        self._enable_learning(client, trainer, pl_module)
        self._setup_simulated_fault(trainer)
        self._wrap_strategy(trainer)
        self._start_section("setup")

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exc: BaseException
    ) -> None:
        """An exception ends fit: update timeouts (not after a failure), apply the policy.

        The argument is named ``exc``, as in NVRx's FaultToleranceSectionsCallback.
        """
        super().on_exception(trainer, pl_module, exc)

    def _last_report(self, exception: BaseException | None) -> None:
        """Close 'setup', update timeouts (not after a failure), apply the exception policy."""
        self._close_setup_section()
        self._update_timeouts_safely(lambda: self._maybe_update_timeouts(is_final=True))
        if (
            exception is not None
            and self.exc_handling_policy is not None
            and not is_clean_stop(exception)
        ):
            self._apply_exc_policy(exception)

    def _apply_exc_policy(self, exception: BaseException) -> None:
        assert self.exc_handling_policy is not None
        client = self.fault_tol_client
        assert client is not None
        try:
            request: object = self.exc_handling_policy(exception)
        except Exception as exc:  # the policy must not hide the original exception
            self._log_own(logging.ERROR, "exc_handling_policy raised %r; no request sent", exc)
            return
        if not isinstance(request, WorkloadControlRequest):
            self._log_own(
                logging.ERROR,
                "exc_handling_policy returned %r, not a WorkloadControlRequest; ignored",
                request,
            )
            return
        self._log_own(logging.WARNING, "Exception %r: sending %s", exception, request)
        try:
            client.send_workload_control_request(request)
        except RankMonitorClientError as exc:  # must not hide the original exception either
            self._log_own(logging.ERROR, "Could not send %s: %s", request, exc)
        if request.action == WorkloadAction.ShutdownWorkload and self.autoresume:
            self._log_own(
                logging.WARNING, "Shutdown workload requested, so creating the finished flag file"
            )
            self._create_finished_flag_file()

    def _close(self) -> None:
        """Close every section, unwrap the strategy, disconnect."""
        client = self.fault_tol_client
        if client is not None:
            client.end_all_sections()
        self._open_depth.clear()
        self._unwrap_strategy()
        self._shutdown_fault_tolerance()

    # -- progress ----------------------------------------------------------------------------

    def on_train_start(self, *args: Any, **kwargs: Any) -> None:
        """Log the restart cycle's metrics (once per fit)."""
        self._report_cycle(args, kwargs)

    def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
        """First batch ends 'setup'; count iterations."""
        if self.fault_tol_client is None:
            return
        self._close_setup_section()
        self.state_machine.on_train_iteration()

    def on_train_batch_end(self, trainer: Trainer, *args: Any, **kwargs: Any) -> None:
        """After a completed checkpoint save, update the timeouts."""
        if self.fault_tol_client is None:
            return
        if self.last_timeouts_upd_iter < self.last_checkpoint_iter:
            self._update_timeouts_safely(lambda: self._maybe_update_timeouts(is_final=False))
            self.last_timeouts_upd_iter = trainer.global_step

    def on_validation_batch_start(self, *args: Any, **kwargs: Any) -> None:
        """The first validation batch (e.g. a sanity check) also ends 'setup'."""
        if self.fault_tol_client is None:
            return
        self._close_setup_section()

    def on_validation_start(self, trainer: Any = None, *args: Any, **kwargs: Any) -> None:
        """Note the validation (learned timeouts)."""
        self._note("validation", trainer)

    def on_save_checkpoint(self, trainer: Trainer, *args: Any, **kwargs: Any) -> None:
        """Note the iteration of the last checkpoint."""
        if self.fault_tol_client is not None:
            self.seen_checkpoint_save = True
            self.last_checkpoint_iter = trainer.global_step
            self._note("checkpoint")

    # -- timeouts ----------------------------------------------------------------------------

    def _maybe_update_timeouts(self, is_final: bool) -> None:
        client = self.fault_tol_client
        if client is None or not self.calculate_timeouts:
            return
        if self.state_machine.failed:
            self._log_own(logging.INFO, "Rank exits due to a failure, won't update the FT timeouts")
            return
        why = logging.INFO if is_final else logging.DEBUG  # mid-run: say why only in debug
        selected = []
        if self.state_machine.loaded_checkpoint:
            selected.append("setup")
        else:
            self._log0(
                why,
                "Can't update the setup section timeout until a checkpoint was loaded",
            )
        if self.state_machine.num_tr_iters_total > MIN_TR_ITERS_FOR_STEP_TIMEOUT_UPDATE:
            selected.append("step")
        else:
            self._log0(
                why,
                "Need more than %d training iterations to update the step section timeout",
                MIN_TR_ITERS_FOR_STEP_TIMEOUT_UPDATE,
            )
        if self.uses_async_checkpointing:
            self._log0(why, "Can't update the checkpointing section timeout with async saves")
        elif self.seen_checkpoint_save:
            selected.append("checkpointing")
        else:
            self._log0(
                why,
                "The checkpointing section timeout is not updated until a checkpoint was saved",
            )
        update_oos = is_final and {"setup", "step"} <= set(selected) and self.seen_checkpoint_save
        if not update_oos:
            self._log0(
                why,
                "The out-of-section timeout won't be updated until all FT sections were seen",
            )
        if not selected:
            return
        self._log0(
            logging.INFO,
            "Updating FT timeouts for: %s update out-of-section: %s",
            selected,
            update_oos,
        )
        updated = client.calculate_and_set_section_timeouts(
            selected_sections=selected, calc_out_of_section=update_oos, skip_if_not_ready=True
        )
        if not updated:
            self._log0(logging.WARNING, "FT timeouts not updated: not enough data observed yet")
            return
        self._log0(logging.INFO, "Updated FT timeouts. New values: %s", client.section_timeouts)
        self._save_timeouts()
