"""Training-state rules of the FT callbacks: is training complete, may timeouts be calculated.

Kept free of Lightning so the rules can be unit-tested directly: the callbacks feed
the state machine events from their hooks and a :class:`TrainingProgress` snapshot
of the trainer at teardown.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MIN_ITERS_FOR_TIMEOUT_UPDATE",
    "TrainingProgress",
    "TrainingStateMachine",
    "is_clean_stop",
]

#: Heartbeat timeouts need at least this many training iterations in the job.
MIN_ITERS_FOR_TIMEOUT_UPDATE = 2


def is_clean_stop(exc: BaseException) -> bool:
    """True for ``sys.exit(0)`` or ``sys.exit()``: a deliberate stop, not a failure."""
    return isinstance(exc, SystemExit) and not exc.code


@dataclass(frozen=True)
class TrainingProgress:
    """The trainer's limits and counters that decide whether training is complete.

    ``max_steps``/``max_epochs`` count only when they are ints > 0 (Lightning uses
    -1 and None for "no limit"); ``early_stopped`` is True when an early-stopping
    callback ended training on purpose; ``time_limit_reached`` when a training time
    limit that spans jobs (Lightning's ``max_time`` timer, whose elapsed time is
    saved in checkpoints) ran out.
    """

    global_step: int
    current_epoch: int
    max_steps: int | None = None
    max_epochs: int | None = None
    early_stopped: bool = False
    time_limit_reached: bool = False


def _limit_reached(value: int, limit: int | None) -> bool:
    return isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 and value >= limit


class TrainingStateMachine:
    """Follows one training job (one ``fit``) through the FT callback's hooks.

    Rules (those of the reference, with its max_time/early-stop gap closed):

    * training is complete when the job did not fail and either ``max_steps`` or
      ``max_epochs`` is reached, an early-stopping callback stopped it, the
      training-time limit ran out (so no extra "empty" job is needed), or the job
      ended after at most one iteration (an "empty" run: a job resumed from a
      checkpoint taken at the end of training, e.g. after a ``max_time`` stop; a
      job stopped by an exception, even ``sys.exit(0)``, is never "empty");
    * timeouts may be calculated once per job, when a checkpoint was loaded, a
      checkpoint was saved and heartbeats were seen both before and after that
      save, at least :data:`MIN_ITERS_FOR_TIMEOUT_UPDATE` iterations ran, and the
      job did not fail (``sys.exit(0)`` is a clean stop, not a failure).

    A job started from scratch therefore gets calculated timeouts at the end of
    the second job, since the first loads no checkpoint.
    """

    def __init__(self) -> None:
        self.num_tr_iters_total = 0
        self.num_hb_total = 0
        self.num_hb_at_last_save: int | None = None
        self.seen_checkpointing = False
        self.loaded_checkpoint = False
        self.caught_exception = False
        self.is_stop_exception = False
        self.training_ended = False
        self.timeouts_updated = False

    @property
    def failed(self) -> bool:
        """True when the job hit an exception that is not a clean stop."""
        return self.caught_exception and not self.is_stop_exception

    def on_load_checkpoint(self) -> None:
        """A checkpoint was loaded: the job resumes earlier training."""
        self.loaded_checkpoint = True

    def on_save_checkpoint(self) -> None:
        """A checkpoint is being saved; heartbeats after it prove the save finished."""
        self.num_hb_at_last_save = self.num_hb_total

    def on_heartbeat_sent(self) -> None:
        """Count a heartbeat; a heartbeat on each side of a save marks checkpointing as seen."""
        self.num_hb_total += 1
        if not self.seen_checkpointing and self.num_hb_at_last_save is not None:
            before = self.num_hb_at_last_save
            after = self.num_hb_total - self.num_hb_at_last_save
            self.seen_checkpointing = before > 0 and after > 0

    def on_train_iteration(self) -> None:
        """Count a finished training iteration."""
        self.num_tr_iters_total += 1

    def on_exception(self, exc: BaseException) -> None:
        """Remember that the job was interrupted, and whether it was a clean stop."""
        self.caught_exception = True
        self.is_stop_exception = is_clean_stop(exc)

    def on_teardown(self) -> None:
        """Fitting ended (normally or not)."""
        self.training_ended = True

    def on_timeouts_updated(self) -> None:
        """Timeouts were calculated; they are calculated at most once per job."""
        self.timeouts_updated = True

    @property
    def can_update_timeouts(self) -> bool:
        """True when this job has seen enough to calculate timeouts (see the class doc)."""
        return (
            not self.timeouts_updated
            and self.num_tr_iters_total >= MIN_ITERS_FOR_TIMEOUT_UPDATE
            and not self.failed
            and self.loaded_checkpoint
            and self.seen_checkpointing
        )

    def is_training_completed(self, progress: TrainingProgress) -> bool:
        """True when this job finished the whole training (see the class doc)."""
        if self.failed:
            return False
        if self.training_ended and not self.caught_exception and self.num_tr_iters_total <= 1:
            return True
        return (
            _limit_reached(progress.global_step, progress.max_steps)
            or _limit_reached(progress.current_epoch, progress.max_epochs)
            or progress.early_stopped
            or progress.time_limit_reached
        )
