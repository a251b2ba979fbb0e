"""Stack dump summaries: parsed from real faulthandler output, carried in the event."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from nvrx.ft import MonitorEvent, StackSummary, parse_monitor_event
from nvrx.ft._stacks import summarize_dump

if TYPE_CHECKING:
    from tests.conftest import Events, MakeConfig, MonitorFactory, RankFactory

_DIST = "/venv/lib/python3.11/site-packages/torch/distributed"
IN_ALL_REDUCE = f"""\
Thread 0x00007f29ace1d6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f29ad893b80 (most recent call first):
  File "{_DIST}/distributed_c10d.py", line 2501 in all_reduce
  File "{_DIST}/c10d_logger.py", line 81 in wrapper
  File "/job/train.py", line 40 in step
  File "/job/train.py", line 60 in <module>
"""


def test_blocked_in_all_reduce() -> None:
    got = summarize_dump("earlier output\n" + IN_ALL_REDUCE + "Terminated\n")
    assert got == StackSummary("all_reduce", "train.py:40", "step")
    assert got.describe() == "blocked in all_reduce"


def test_main_thread_is_chosen_over_the_current_one() -> None:
    text = """\
Current thread 0x0000000000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x0000000000000002 (most recent call first):
  File "/job/train.py", line 53 in step
  File "/job/train.py", line 60 in <module>
"""
    assert summarize_dump(text) == StackSummary(None, "train.py:53", "step")


def test_a_collective_name_outside_torch_distributed_is_user_code() -> None:
    text = IN_ALL_REDUCE.replace(_DIST, "/job/mylib")
    assert summarize_dump(text) == StackSummary(None, "distributed_c10d.py:2501", "all_reduce")


_AUTOGRAD = "/venv/lib/python3.11/site-packages/torch/autograd"
IN_DDP_BACKWARD = f"""\
Current thread 0x00007f4b5f881b80 (most recent call first):
  File "{_AUTOGRAD}/graph.py", line 979 in _engine_run_backward
  File "{_AUTOGRAD}/__init__.py", line 395 in backward
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 623 in backward
  File "/job/train.py", line 52 in step
  File "/job/train.py", line 60 in <module>
"""


def test_waiting_in_the_autograd_engine_counts_as_a_collective() -> None:
    # DDP's gradient all-reduce runs in C++ under backward(): the rank waiting for its
    # peers shows the engine innermost (seen in the demo's Lightning DDP hang).
    got = summarize_dump(IN_DDP_BACKWARD)
    assert got == StackSummary("backward", "train.py:52", "step")
    assert StackSummary.from_json(got.to_json()) == got


def test_a_users_own_backward_function_is_user_code() -> None:
    # A custom autograd Function's backward in user code is where that rank is, not a wait.
    text = IN_DDP_BACKWARD.replace(
        f'  File "{_AUTOGRAD}/graph.py", line 979 in _engine_run_backward\n',
        '  File "/job/ops.py", line 9 in backward\n'
        f'  File "{_AUTOGRAD}/graph.py", line 979 in _engine_run_backward\n',
    )
    assert summarize_dump(text) == StackSummary(None, "ops.py:9", "backward")


def test_the_last_of_two_dumps_counts() -> None:
    second = IN_ALL_REDUCE.replace("line 2501 in all_reduce", "line 9 in helper").replace(
        f"{_DIST}/distributed_c10d.py", "/job/util.py"
    )
    got = summarize_dump(IN_ALL_REDUCE + "\n" + second)
    assert got == StackSummary(None, "util.py:9", "helper")


@pytest.mark.parametrize("text", ["", "no dump here\n", "Thread 0x1 (most recent call first):\n"])
def test_no_dump_is_none(text: str) -> None:
    assert summarize_dump(text) is None


def test_real_faulthandler_output() -> None:
    code = (
        "import faulthandler, os, signal, sys, time\n"
        "faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)\n"
        "def work():\n"
        "    os.kill(os.getpid(), signal.SIGUSR2)\n"
        "work()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert summarize_dump(out.stderr) == StackSummary(None, "<string>:4", "work")


def test_event_round_trip_and_bad_stacks() -> None:
    ev = MonitorEvent(
        "rank_terminated", 0, 1, 9, cause="heartbeat_timeout", message="m",
        last_activity_s=4.0, last_activity_wall=1.7e9, last_heartbeat_s=4.0,
        open_sections=("step",), stack=StackSummary("barrier", "t.py:1", "f"),
    )  # fmt: skip
    assert parse_monitor_event(ev.to_bytes()) == ev
    old = MonitorEvent("rank_terminated", 0, 1, 9, cause="heartbeat_timeout", message="m")
    assert parse_monitor_event(old.to_bytes()).stack is None  # older monitors: still parsed
    for bad in (
        b'"stack":{"collective":"rm -rf","location":"a","function":"f"}',
        b'"stack":{"collective":null,"location":"a"}',
        b'"open_sections":[1]',
        b'"last_activity_s":"x"',
    ):
        data = old.to_bytes()[:-1] + b"," + bad + b"}"
        with pytest.raises(ValueError, match="bad monitor event"):
            parse_monitor_event(data)


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_monitor_event_carries_the_hung_ranks_stack(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=1.0, initial_rank_heartbeat_timeout=30.0))
    rank = start_rank([["init"], ["hb"], ["hang"]])
    ev = events.wait("rank_terminated")
    assert rank.wait_exit() == -signal.SIGTERM
    assert ev.cause == "heartbeat_timeout"
    assert ev.stack is not None, rank.output()
    assert ev.stack.collective is None
    assert ev.stack.location.startswith("rank_worker.py:")
    assert ev.last_heartbeat_s is not None
    assert ev.last_activity_s is not None
    assert ev.last_heartbeat_s >= 1.0
    assert ev.last_activity_wall is not None
    assert ev.open_sections == ()
    assert "Current thread" in rank.output()  # the dump is still in the rank's own log
