"""The launcher checks that monitors make progress, not only that they exist (SIGSTOP)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator

import psutil
import pytest
from launcher_testkit import Launcher, read_events, wait_for  # type: ignore[import-not-found]

from nvrx.ft import FaultToleranceConfig
from nvrx.launcher._monitors import MonitorSupervisor

STALL_S = 2.5


@pytest.fixture
def supervisor() -> Iterator[MonitorSupervisor]:
    # a monitor starved of the CPU for a second on a loaded machine is not stalled
    monitors = MonitorSupervisor(FaultToleranceConfig(), 2, stall_timeout=STALL_S)
    started: list[int] = []
    try:
        monitors.start()
        monitors.wait_ready()
        started.extend(monitors.pids().values())
        yield monitors
    finally:
        started.extend(monitors.pids().values())
        for pid in started:  # a stopped monitor must not survive a failed test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        monitors.close()
        for pid in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _wait_dead(monitors: MonitorSupervisor, timeout: float) -> dict[int, int | None]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = monitors.dead()
        if dead:
            return dead
        time.sleep(0.05)
    return {}


@pytest.mark.timeout(120)
def test_a_stopped_monitor_is_reported_killed_and_replaced(
    supervisor: MonitorSupervisor,
) -> None:
    assert supervisor.dead() == {}
    time.sleep(STALL_S + 0.5)  # longer than the stall timeout: running monitors keep beating
    assert supervisor.dead() == {}
    stopped = supervisor.pids()[1]
    os.kill(stopped, signal.SIGSTOP)
    dead = _wait_dead(supervisor, timeout=30)
    assert dead == {1: -signal.SIGKILL}
    assert not psutil.pid_exists(stopped) or (
        psutil.Process(stopped).status() == psutil.STATUS_ZOMBIE
    )
    supervisor.replace(1)
    supervisor.wait_ready()
    assert supervisor.pids()[1] != stopped
    assert supervisor.dead() == {}


@pytest.mark.timeout(120)
def test_a_monitor_stopped_briefly_is_left_alone(supervisor: MonitorSupervisor) -> None:
    pid = supervisor.pids()[0]
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.3)
    assert supervisor.dead() == {}
    os.kill(pid, signal.SIGCONT)
    time.sleep(STALL_S + 0.5)
    assert supervisor.dead() == {}
    assert supervisor.pids()[0] == pid


@pytest.mark.timeout(180)
def test_launcher_replaces_a_stopped_monitor_and_restarts_its_rank(
    start_launcher: Callable[..., Launcher],
) -> None:
    launcher = start_launcher(
        ["--nproc-per-node", "1", "--max-restarts", "2"],
        ["--steps", "150", "--step-time", "0.1"],
    )
    wait_for(lambda: len(read_events(launcher.out)) >= 4, what="training steps")
    [old] = launcher.monitor_pids()
    os.kill(old, signal.SIGSTOP)
    try:
        assert launcher.wait(150) == 0, launcher.log()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(old, signal.SIGCONT)
    log = launcher.log()
    assert "made no progress" in log
    assert "restarting, since its rank was unwatched" in log
    assert any(
        e.get("event") == "resume" and e.get("cycle") == 1 for e in read_events(launcher.out)
    )
