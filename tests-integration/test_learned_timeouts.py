"""Learned timeouts under ft_launcher, with real processes (issue 27 items 1 and 3).

The loop (scripts/learned_loop.py): 0.2 s steps, a save 5 steps long every 50 steps,
a validation every 100, an epoch boundary with a slow data loader every 150 and one
step 10x slower at step 230, under NeMo's 300 s heartbeat timeout. Learned timeouts
become active after 16 steps, a save and a validation (about step 100): the timeout
is then about 5 x the save's interval, 6 s.

- The soak runs the loop for several minutes (``NVRX_SOAK_SECONDS``, default 240) and
  is never killed. It runs only with NVRX_SOAK=1, as the other soak test.
- The stopped rank: the same loop, one rank SIGSTOPped once learned timeouts are
  active, is detected by its learned timeout, not the configured 300 s.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time
from typing import Any

import pytest
from conftest import Launch
from itest_harness import HERE, Event, LauncherRun, read_jsonl

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = HERE / "scripts" / "learned_loop.py"
SOAK_S = float(os.environ.get("NVRX_SOAK_SECONDS", "240"))
NEMO = [
    "--ft-initial-rank-heartbeat-timeout=1800",
    "--ft-rank-heartbeat-timeout=300",
]
#: What the monitor may take beyond the timeout to act (it wakes when a timeout is due).
DETECTION_SLACK_S = 0.25


def _events(run: LauncherRun, kind: str, attempt: int = 0) -> list[Event]:
    return [e for e in run.journal() if e["event"] == kind and e.get("attempt") == attempt]


def _learned(run: LauncherRun) -> dict[int, Event]:
    return {e["rank"]: e for e in _events(run, "learned")}


@pytest.mark.skipif(os.environ.get("NVRX_SOAK") != "1", reason="soak test: set NVRX_SOAK=1")
@pytest.mark.timeout(SOAK_S + 300)
def test_learned_timeouts_soak_is_never_killed(launch: Launch, out_dir: pathlib.Path) -> None:
    run = launch([], [*NEMO, "--max-restarts=0"], script=SCRIPT, nproc=2)
    run.wait_until(lambda: len(_learned(run)) == 2, 120, "learned timeouts active")
    learned = _learned(run)
    for event in learned.values():
        assert 0 < event["timeout"] < 300.0, event
    deadline = time.monotonic() + SOAK_S
    while time.monotonic() < deadline:
        assert run.proc.poll() is None, run.log()[-6000:]
        time.sleep(1.0)
    (out_dir / "stop").touch()
    run.expect_exit(0, timeout=120)
    assert run.restarts() == []
    done = _events(run, "done")
    assert len(done) == 2, done
    # Several saves, validations, epoch boundaries and the 10x step happened.
    assert min(e["step"] for e in done) > 300, done
    print(f"soak: learned {[e['timeout'] for e in learned.values()]}, done {done}")


@pytest.mark.timeout(300)
def test_a_stopped_rank_is_caught_by_its_learned_timeout(
    launch: Launch, out_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    ft_journal = tmp_path / "ft_journal.jsonl"
    run = launch(
        [], [*NEMO, "--max-restarts=1", f"--ft-journal={ft_journal}"], script=SCRIPT, nproc=2
    )
    run.wait_until(lambda: len(_learned(run)) == 2, 180, "learned timeouts active")
    learned = _learned(run)
    pid = {e["rank"]: e["pid"] for e in _events(run, "ready")}[1]
    time.sleep(1.0)
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)

    def terminated() -> list[dict[str, Any]]:
        return [e for e in read_jsonl(ft_journal) if e["event"] == "rank_terminated_by_monitor"]

    run.wait_until(lambda: bool(terminated()), 120, "the stopped rank terminated")
    (out_dir / "stop").touch()
    event = terminated()[0]
    assert (event["rank"], event["cause"]) == (1, "heartbeat_timeout"), event
    assert "Did not get subsequent heartbeat" in event["message"]
    # The learned timeout, not the configured 300 s (it may have loosened since).
    assert learned[1]["timeout"] - 0.001 <= event["limit_s"] < 30.0, (learned[1], event)
    assert event["observed_s"] - event["limit_s"] <= DETECTION_SLACK_S, event
    print(
        f"stopped rank: learned {event['limit_s']:.2f} s, detected "
        f"{event['t'] - stopped_at:.2f} s after SIGSTOP"
    )
    run.expect_exit(0, timeout=120)
