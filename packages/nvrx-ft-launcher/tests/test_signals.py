"""Signals to the launcher: forwarded, escalated, and nothing outlives it."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import psutil
import pytest
from launcher_testkit import (  # type: ignore[import-not-found]
    Launcher,
    all_gone,
    read_events,
    wait_for,
)

from nvrx.launcher.exit_codes import exit_code_for_signal

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]


def _running(launcher: Launcher, ranks: int) -> list[psutil.Process]:
    """Wait until every rank trains; return the launcher's children (ranks and monitors)."""
    wait_for(
        lambda: (
            {e["rank"] for e in read_events(launcher.out) if e["event"] == "step"}
            == set(range(ranks))
        ),
        what="every rank training",
    )
    procs: list[psutil.Process] = launcher.descendants()
    assert len(launcher.monitor_pids()) == ranks
    assert len(procs) >= 2 * ranks
    return procs


def _all_gone(procs: list[psutil.Process], timeout: float = 30.0) -> None:
    wait_for(lambda: all_gone(procs), timeout=timeout, what="every rank and monitor to exit")


@pytest.mark.timeout(120)
def test_sigterm_is_forwarded_and_no_process_is_left(start_launcher: Start) -> None:
    sig = signal.SIGTERM
    launcher = start_launcher(["--nproc-per-node", "2"], ["--steps", "100000"])
    procs = _running(launcher, 2)
    launcher.proc.send_signal(sig)
    assert launcher.wait(60) == exit_code_for_signal(sig), launcher.log()
    # The launcher exits only after every child is gone.
    for proc in procs:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE


@pytest.mark.timeout(120)
def test_rank_ignoring_sigterm_is_killed_after_term_timeout(start_launcher: Start) -> None:
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--term-timeout", "1"], ["--steps", "100000", "--ignore-sigterm"]
    )
    procs = _running(launcher, 2)
    sent = time.monotonic()
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == exit_code_for_signal(signal.SIGTERM), launcher.log()
    assert time.monotonic() - sent >= 1.0
    _all_gone(procs, timeout=1.0)


@pytest.mark.timeout(120)
def test_sigkill_of_the_launcher_takes_its_children_along(start_launcher: Start) -> None:
    launcher = start_launcher(["--nproc-per-node", "2"], ["--steps", "100000"])
    procs = _running(launcher, 2)
    launcher.proc.send_signal(signal.SIGKILL)
    launcher.wait(30)
    _all_gone(procs)


@pytest.mark.timeout(120)
def test_second_signal_skips_the_term_timeout(start_launcher: Start) -> None:
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--term-timeout", "600"],
        ["--steps", "100000", "--ignore-sigterm"],
    )
    procs = _running(launcher, 2)
    launcher.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "closing signal SIGTERM" in launcher.log(), what="SIGTERM forwarded")
    time.sleep(0.5)
    launcher.proc.send_signal(signal.SIGINT)
    assert launcher.wait(60) == exit_code_for_signal(signal.SIGINT), launcher.log()
    _all_gone(procs, timeout=1.0)


def _pids_mentioning(fragment: str) -> list[int]:
    """Live, non-zombie processes anywhere whose command line contains ``fragment``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if fragment in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def _children(launcher: Launcher, ranks: int) -> list[psutil.Process]:
    wait_for(
        lambda: len([e for e in read_events(launcher.out) if e["event"] == "child"]) == ranks,
        what="every rank's child",
    )
    return [psutil.Process(e["pid"]) for e in read_events(launcher.out) if e["event"] == "child"]


@pytest.mark.timeout(120)
def test_sigkill_of_the_launcher_takes_the_ranks_own_children_along(start_launcher: Start) -> None:
    launcher = start_launcher(["--nproc-per-node", "2"], ["--steps", "100000", "--spawn-child"])
    procs = _running(launcher, 2)
    children = _children(launcher, 2)
    assert all(c.is_running() for c in children)
    # Each rank's own child is not the rank: PDEATHSIG alone would leave it running.
    assert not {c.pid for c in children} & {p.pid for p in procs if "train_script" in p.name()}
    launcher.proc.send_signal(signal.SIGKILL)
    launcher.wait(30)
    wait_for(lambda: all_gone(procs + children), timeout=30, what="ranks and their children")
    # Nothing that mentions this job's output directory runs any more (guards included).
    wait_for(lambda: not _pids_mentioning(str(launcher.out)), timeout=10, what="no leftovers")


@pytest.mark.timeout(120)
def test_the_ranks_guards_leave_with_the_ranks(start_launcher: Start) -> None:
    launcher = start_launcher(["--nproc-per-node", "2"], ["--steps", "6"])
    assert launcher.wait(60) == 0, launcher.log()
    wait_for(lambda: not _pids_mentioning(str(launcher.out)), timeout=10, what="no leftovers")
