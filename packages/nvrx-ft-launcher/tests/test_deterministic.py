"""No futile restarts: the signature rule as pure functions, then real launchers."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from launcher_testkit import Launcher  # type: ignore[import-not-found]

from nvrx.launcher._coordination import Action, JobState, StopCause
from nvrx.launcher._deterministic import (
    FailureSignature,
    RankOutcome,
    RepeatWatch,
    cycle_signature,
    is_infrastructure_error,
    parse_traceback,
    repeats,
)
from nvrx.launcher._policy import RestartPolicy, Trigger, decide
from nvrx.launcher.exit_codes import ExitCode

TB = """Traceback (most recent call last):
  File "/job/train.py", line 40, in <module>
    main()
  File "/job/train.py", line 12, in main
    open(args.data)
FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-0'
"""
CHAINED = """Traceback (most recent call last):
  File "/job/a.py", line 3, in f
    x = d["k"]
KeyError: 'k'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/job/a.py", line 9, in <module>
    f()
  File "/job/a.py", line 5, in f
    raise ValueError("bad config")
ValueError: bad config
"""
NCCL = TB.replace(
    "FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-0'",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970",
)


def test_a_traceback_gives_the_type_and_the_raising_line() -> None:
    assert parse_traceback(TB) == (
        "FileNotFoundError",
        "/job/train.py",
        12,
        "[Errno 2] No such file or directory: '/data/shard-0'",
    )
    assert parse_traceback(CHAINED) == ("ValueError", "/job/a.py", 5, "bad config")
    assert parse_traceback("no traceback here") is None
    assert parse_traceback("Traceback (most recent call last):\n  File") is None


def test_communication_and_device_errors_never_count() -> None:
    assert is_infrastructure_error("torch.distributed.DistBackendError", "NCCL error")
    assert is_infrastructure_error("RuntimeError", "Connection reset by peer")
    assert is_infrastructure_error("RuntimeError", "CUDA error: an illegal memory access")
    assert is_infrastructure_error("torch.OutOfMemoryError", "CUDA out of memory")
    assert is_infrastructure_error("TimeoutError", "")
    assert is_infrastructure_error(
        "RuntimeError", "[Rank 1] Watchdog caught collective operation timeout"
    )
    assert not is_infrastructure_error("FileNotFoundError", "No such file: '/data/x'")
    assert not is_infrastructure_error("ValueError", "bad config")


def _outcome(rank: int = 1, exitcode: int = 1, tb: str | None = TB, **kw: Any) -> RankOutcome:
    return RankOutcome(rank=rank, exitcode=exitcode, traceback=tb, **kw)


def test_a_cycle_signature_needs_an_exception_before_the_first_step() -> None:
    sig = cycle_signature([_outcome()], first_step_seen=False)
    assert sig == FailureSignature(
        "FileNotFoundError",
        "/job/train.py",
        12,
        1,
        "[Errno 2] No such file or directory: '/data/shard-0'",
    )
    assert sig.describe().startswith("FileNotFoundError at /job/train.py:12 on rank 1: ")
    assert cycle_signature([_outcome()], first_step_seen=True) is None
    assert cycle_signature([_outcome(tb=NCCL)], first_step_seen=False) is None
    assert cycle_signature([_outcome(tb=None)], first_step_seen=False) is None
    # A killed or hung rank in the cycle: a node problem may be behind everything.
    killed = [_outcome(), _outcome(rank=0, exitcode=-9, tb=None)]
    assert cycle_signature(killed, first_step_seen=False) is None
    hung = [_outcome(), _outcome(rank=0, terminated_by_monitor=True)]
    assert cycle_signature(hung, first_step_seen=False) is None
    # Peers that fail with communication errors do not hide the culprit's signature.
    both = [_outcome(rank=0, tb=NCCL), _outcome(rank=3)]
    found = cycle_signature(both, first_step_seen=False)
    assert found is not None
    assert found.rank == 3


def test_two_cycles_repeat_on_the_same_type_and_line_whatever_the_rank() -> None:
    first = cycle_signature([_outcome(rank=1)], first_step_seen=False)
    second = cycle_signature([_outcome(rank=0)], first_step_seen=False)
    assert repeats(first, second)
    assert second is not None
    other_line = dataclasses.replace(second, line=13)
    assert not repeats(first, other_line)
    assert not repeats(None, second)
    assert not repeats(first, None)


def test_the_repeat_watch_names_a_repeat_and_forgets_a_cycle_that_does_not_count() -> None:
    watch = RepeatWatch()
    assert watch.repeated_error([_outcome(rank=1)], first_step_seen=False) is None
    repeated = watch.repeated_error([_outcome(rank=0)], first_step_seen=False)
    assert repeated is not None
    assert "FileNotFoundError" in repeated
    # A cycle past its first step is no repeat, and the one after it starts over.
    assert watch.repeated_error([_outcome(rank=0)], first_step_seen=True) is None
    assert watch.repeated_error([_outcome(rank=0)], first_step_seen=False) is None
    watch.forget()  # e.g. a dead monitor ended the cycle in between
    assert watch.repeated_error([_outcome(rank=0)], first_step_seen=False) is None
    assert watch.repeated_error([_outcome(rank=0)], first_step_seen=False) is not None


POLICY = RestartPolicy(
    max_restarts=10, workers_stop_timeout=5, max_no_progress_restarts=0, min_progress_iterations=1
)


def test_a_repeated_error_stops_with_its_own_exit_code_unless_turned_off() -> None:
    d = decide(
        JobState(1, 1, 0),
        Trigger.FAILURE,
        policy=POLICY,
        node="n",
        reason="rank 1 exited with code 1",
        repeated_error="FileNotFoundError at /job/train.py:12 on rank 1",
    )
    assert (d.action, d.stop_cause, d.exit_code) == (
        Action.STOP,
        StopCause.DETERMINISTIC_FAILURE,
        ExitCode.DETERMINISTIC_FAILURE,
    )
    assert "FileNotFoundError at /job/train.py:12 on rank 1" in d.reason
    off = dataclasses.replace(POLICY, stop_on_repeated_error=False)
    d = decide(
        JobState(1, 1, 0),
        Trigger.FAILURE,
        policy=off,
        node="n",
        reason="why",
        repeated_error="FileNotFoundError at /job/train.py:12 on rank 1",
    )
    assert d.action is Action.RESTART
    assert int(ExitCode.DETERMINISTIC_FAILURE) == 6


Start = Callable[..., Launcher]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_same_error_twice_stops_while_a_killed_rank_is_restarted(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    log_dir = tmp_path / "logs"
    raising = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "5", "--log-dir", str(log_dir)],
        ["--steps", "6", "--fault", "raise:1:1:*", "--record"],
    )
    assert raising.wait() == ExitCode.DETERMINISTIC_FAILURE, raising.log()
    log = raising.log()
    assert "deterministic failure, the same in two cycles in a row" in log
    assert "RuntimeError at " in log
    assert "train_script.py:" in log
    journal = [json.loads(ln) for ln in (log_dir / "ft_launcher_events.jsonl").open()]
    failed_cycles = {e["cycle"] for e in journal if e["event"] == "rank_failed"}
    assert failed_cycles == {0, 1}, failed_cycles
    killed = start_launcher(
        [
            *("--nproc-per-node", "2", "--max-restarts", "2", "--log-dir", str(tmp_path / "k")),
            *("--rdzv-id", "killed"),
        ],
        ["--steps", "6", "--fault", "sigkill:1:1:*", "--record"],
        name="killed",
    )
    assert killed.wait() == ExitCode.RESTARTS_EXHAUSTED, killed.log()
