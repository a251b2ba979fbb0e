"""The training state machine decides completion and when timeouts may be calculated."""

from __future__ import annotations

import pytest

from nvrx.ptl.training_state import TrainingProgress, TrainingStateMachine, is_clean_stop


def _resumed_job_with_save(iters: int = 3) -> TrainingStateMachine:
    """A job that loaded a checkpoint, ran ``iters`` iterations and saved mid-way."""
    sm = TrainingStateMachine()
    sm.on_load_checkpoint()
    sm.on_heartbeat_sent()  # train start
    for i in range(iters):
        sm.on_train_iteration()
        sm.on_heartbeat_sent()
        if i == 0:
            sm.on_save_checkpoint()
            sm.on_heartbeat_sent()
    return sm


def test_fresh_state_cannot_update_and_is_not_complete() -> None:
    sm = TrainingStateMachine()
    assert not sm.can_update_timeouts
    assert not sm.is_training_completed(TrainingProgress(global_step=5, current_epoch=0))


def test_timeouts_need_a_loaded_and_a_saved_checkpoint() -> None:
    assert _resumed_job_with_save().can_update_timeouts

    no_load = TrainingStateMachine()
    no_load.on_heartbeat_sent()
    no_load.on_train_iteration()
    no_load.on_train_iteration()
    no_load.on_save_checkpoint()
    no_load.on_heartbeat_sent()
    assert not no_load.can_update_timeouts, "a job started from scratch must not calculate"

    no_save = TrainingStateMachine()
    no_save.on_load_checkpoint()
    for _ in range(5):
        no_save.on_train_iteration()
        no_save.on_heartbeat_sent()
    assert not no_save.can_update_timeouts


def test_save_must_be_followed_by_a_heartbeat() -> None:
    sm = TrainingStateMachine()
    sm.on_load_checkpoint()
    sm.on_heartbeat_sent()
    sm.on_train_iteration()
    sm.on_train_iteration()
    sm.on_save_checkpoint()
    before = (sm.seen_checkpointing, sm.can_update_timeouts)
    sm.on_heartbeat_sent()
    assert before == (False, False)
    assert (sm.seen_checkpointing, sm.can_update_timeouts) == (True, True)


def test_save_before_any_heartbeat_does_not_count() -> None:
    sm = TrainingStateMachine()
    sm.on_load_checkpoint()
    sm.on_save_checkpoint()  # no heartbeat before it
    for _ in range(3):
        sm.on_train_iteration()
        sm.on_heartbeat_sent()
    assert not sm.seen_checkpointing


def test_timeouts_need_two_iterations() -> None:
    assert not _resumed_job_with_save(iters=1).can_update_timeouts
    assert _resumed_job_with_save(iters=2).can_update_timeouts


def test_timeouts_are_updated_once() -> None:
    sm = _resumed_job_with_save()
    sm.on_timeouts_updated()
    assert not sm.can_update_timeouts


def test_failure_blocks_update_but_clean_exit_does_not() -> None:
    failed = _resumed_job_with_save()
    failed.on_exception(RuntimeError("boom"))
    assert failed.failed
    assert not failed.can_update_timeouts

    stopped = _resumed_job_with_save()
    stopped.on_exception(SystemExit(0))
    assert not stopped.failed
    assert stopped.can_update_timeouts

    exit_1 = _resumed_job_with_save()
    exit_1.on_exception(SystemExit(1))
    assert exit_1.failed


@pytest.mark.parametrize(
    ("exc", "clean"),
    [
        (SystemExit(0), True),
        (SystemExit(None), True),
        (SystemExit(2), False),
        (SystemExit("error text"), False),
        (KeyboardInterrupt(), False),
        (ValueError(), False),
    ],
)
def test_clean_stop(exc: BaseException, clean: bool) -> None:
    assert is_clean_stop(exc) is clean


def test_completed_by_max_steps() -> None:
    sm = _resumed_job_with_save(iters=10)
    sm.on_teardown()
    assert sm.is_training_completed(TrainingProgress(global_step=20, current_epoch=0, max_steps=20))
    assert not sm.is_training_completed(
        TrainingProgress(global_step=19, current_epoch=0, max_steps=20)
    )


def test_completed_by_max_epochs() -> None:
    sm = _resumed_job_with_save(iters=10)
    sm.on_teardown()
    done = TrainingProgress(global_step=7, current_epoch=3, max_steps=-1, max_epochs=3)
    assert sm.is_training_completed(done)
    not_done = TrainingProgress(global_step=7, current_epoch=2, max_steps=-1, max_epochs=3)
    assert not sm.is_training_completed(not_done)


@pytest.mark.parametrize("limit", [None, -1, 0])
def test_unset_limits_never_complete(limit: int | None) -> None:
    sm = _resumed_job_with_save(iters=10)
    sm.on_teardown()
    progress = TrainingProgress(
        global_step=100, current_epoch=100, max_steps=limit, max_epochs=limit
    )
    assert not sm.is_training_completed(progress)


def test_completed_by_early_stopping() -> None:
    sm = _resumed_job_with_save(iters=10)
    sm.on_teardown()
    progress = TrainingProgress(global_step=5, current_epoch=1, max_steps=100, early_stopped=True)
    assert sm.is_training_completed(progress)


@pytest.mark.parametrize("iters", [0, 1])
def test_empty_run_is_complete(iters: int) -> None:
    sm = TrainingStateMachine()
    sm.on_load_checkpoint()
    for _ in range(iters):
        sm.on_train_iteration()
    sm.on_teardown()
    progress = TrainingProgress(global_step=50, current_epoch=0, max_steps=100)
    assert sm.is_training_completed(progress)


def test_empty_run_needs_teardown_and_no_exception() -> None:
    progress = TrainingProgress(global_step=50, current_epoch=0, max_steps=100)
    not_ended = TrainingStateMachine()
    assert not not_ended.is_training_completed(progress)

    preempted = TrainingStateMachine()
    preempted.on_exception(SystemExit(0))
    preempted.on_teardown()
    assert not preempted.is_training_completed(progress), "a clean stop at start is not the end"


def test_two_iterations_is_not_an_empty_run() -> None:
    sm = _resumed_job_with_save(iters=2)
    sm.on_teardown()
    assert not sm.is_training_completed(
        TrainingProgress(global_step=50, current_epoch=0, max_steps=100)
    )


def test_failed_job_is_never_complete() -> None:
    sm = _resumed_job_with_save(iters=10)
    sm.on_exception(RuntimeError("crash at the very end"))
    sm.on_teardown()
    assert not sm.is_training_completed(
        TrainingProgress(global_step=100, current_epoch=1, max_steps=100)
    )


def test_completed_by_time_limit() -> None:
    sm = _resumed_job_with_save(iters=10)
    sm.on_teardown()
    progress = TrainingProgress(
        global_step=5, current_epoch=1, max_steps=100, time_limit_reached=True
    )
    assert sm.is_training_completed(progress)
