"""The launcher as child subreaper: orphans of the job are killed when it ends.

Real processes: a shell that starts ``sleep`` in a new session and exits at once, so the
sleeper is orphaned the way a rank's daemonised helper is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from nvrx.launcher import _reaper
from nvrx.launcher._events import WorkersStarted, WorkersStopped
from nvrx.launcher._reaper import Reaper, _children

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux prctl")


def _orphan() -> int:
    """Start ``setsid sleep 120`` from a shell that exits; the sleeper's pid."""
    out = subprocess.run(
        ["sh", "-c", "setsid sleep 120 </dev/null >/dev/null 2>&1 & echo $!"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(60)
def test_an_orphan_comes_to_the_reaper_and_is_killed_at_close() -> None:
    before = subprocess.Popen(["sleep", "120"])  # a child from before: not ours to kill
    reaper = Reaper()
    try:
        assert reaper.active
        orphan = _orphan()
        deadline = time.monotonic() + 10
        while orphan not in _children(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert orphan in _children(os.getpid())  # re-parented here, not to init
        assert reaper.close() == [orphan]
        assert not _alive(orphan)
        assert orphan not in _children(os.getpid())  # reaped, not left a zombie
        assert before.poll() is None
    finally:
        reaper.close()
        before.kill()
        before.wait()
    # The caller's setting is back: a later orphan goes to init again.
    later = _orphan()  # re-parented when its shell exited, before _orphan returned
    try:
        assert later not in _children(os.getpid())
    finally:
        os.kill(later, 9)


@pytest.mark.timeout(60)
def test_close_reaches_every_generation() -> None:
    reaper = Reaper()
    try:
        # A daemon that keeps a child of its own: killing it hands the child to us.
        out = subprocess.run(
            ["sh", "-c", "setsid sh -c 'sleep 120 & wait' </dev/null >/dev/null 2>&1 & echo $!"],
            check=True,
            capture_output=True,
            text=True,
        )
        daemon = int(out.stdout)
        deadline = time.monotonic() + 10
        while not _children(daemon) and time.monotonic() < deadline:
            time.sleep(0.01)
        killed = reaper.close()
        assert daemon in killed
        assert len(killed) == 2, killed
        assert not [p for p in killed if _alive(p)]
    finally:
        reaper.close()


@pytest.mark.timeout(60)
def test_an_orphan_that_ends_while_the_job_runs_is_reaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_reaper, "_ORPHAN_REAP_S", 0.05)
    reaper = Reaper()
    try:
        # Like a rank's guard: born in another process's group, orphaned, then it ends.
        out = subprocess.run(
            ["sh", "-c", "sleep 0.2 </dev/null >/dev/null 2>&1 & echo $!"],
            check=True,
            capture_output=True,
            text=True,
            start_new_session=True,
        )
        orphan = int(out.stdout)
        deadline = time.monotonic() + 20
        while orphan in _children(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphan not in _children(os.getpid())  # not left a zombie until the end
        assert reaper.close() == []
    finally:
        reaper.close()


def _rank_orphan(run_id: str, restart_count: str) -> int:
    """A daemon started by a 'rank' of ``run_id`` (torch's variables), orphaned to us."""
    env = dict(os.environ, TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT=restart_count)
    out = subprocess.run(
        ["sh", "-c", "setsid sh -c 'sleep 120 & wait' </dev/null >/dev/null 2>&1 & echo $!"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    daemon = int(out.stdout)
    deadline = time.monotonic() + 10
    while not _children(daemon) and time.monotonic() < deadline:
        time.sleep(0.01)
    return daemon


@pytest.mark.timeout(60)
def test_a_cycle_end_kills_what_its_ranks_left_and_nothing_else() -> None:
    reaper = Reaper()
    try:  # the daemons start inside: close() ends them even if one fails to start
        mine = _rank_orphan("job-a", "0")
        grandchild = next(iter(_children(mine)))
        other_run = _rank_orphan("job-b", "0")
        unmarked = _orphan()
        leftovers = _reaper.RankLeftovers("job-a")
        leftovers(
            WorkersStarted(
                cycle=0,
                restart_count=0,
                group_rank=0,
                group_world_size=1,
                ranks={},
                pids={},
                warm_local_ranks=[],
            ),
            {},
        )
        assert _alive(mine), "only a stop or a start sweeps"
        leftovers(WorkersStopped(cycle=0, workers_stopped=0.0), {})
        # Both generations: killing the daemon hands its child to us, then it goes too.
        assert not _alive(mine)
        assert not _alive(grandchild)
        assert mine not in _children(os.getpid()), "killed and reaped, not a zombie"
        assert _alive(other_run), "another run's daemon stays"
        assert _alive(unmarked), "an unmarked daemon stays (until the launcher's end)"
    finally:
        killed = reaper.close()
    assert set(killed) >= {other_run, unmarked}
    assert mine not in killed
    assert grandchild not in killed


def test_a_rank_environment_is_recognised_by_run_and_restart_count() -> None:
    matches = _reaper.started_by_a_rank("job-a")
    assert matches({"TORCHELASTIC_RUN_ID": "job-a", "TORCHELASTIC_RESTART_COUNT": "3"})
    assert not matches({"TORCHELASTIC_RUN_ID": "job-b", "TORCHELASTIC_RESTART_COUNT": "3"})
    assert not matches({"TORCHELASTIC_RUN_ID": "job-a"}), "a launcher's own environment"
    assert not matches({})
