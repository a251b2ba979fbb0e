"""The detection rules as pure functions: which checks are armed, and when they fire."""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from nvrx.ft._detection import ActiveTimeouts, find_violation, next_deadline_ns
from nvrx.ft._shm import RankSnapshot
from nvrx.ft._termination import RankProcess, Terminator

S = 1_000_000_000
INIT = 1000 * S


def snap(
    last_hb: float = 0,
    oos_since: float | None = None,
    used: bool = False,
    opened: tuple[tuple[str, float], ...] = (),
) -> RankSnapshot:
    oos = INIT if oos_since is None else int(oos_since * S)
    return RankSnapshot(
        last_hb_ns=int(last_hb * S),
        oos_since_ns=oos,
        sections_used=used or bool(opened),
        open_sections=tuple((n, int(t * S)) for n, t in opened),
    )


T = ActiveTimeouts(
    initial_heartbeat=10.0, heartbeat=2.0, sections={"a": 5.0, "b": None}, out_of_section=None
)


def at(seconds: float) -> int:
    return INIT + int(seconds * S)


def test_initial_heartbeat_fires_only_after_its_timeout() -> None:
    assert find_violation(snap(), T, INIT, at(9.9)) is None
    v = find_violation(snap(), T, INIT, at(10.1))
    assert v is not None
    assert v.cause == "initial_heartbeat_timeout"
    assert next_deadline_ns(snap(), T, INIT) == at(10)


def test_sections_only_rank_is_not_held_to_heartbeats() -> None:
    s = snap(oos_since=0, opened=(("a", 1000 + 100),))
    assert find_violation(s, T, INIT, at(101)) is None
    closed = snap(oos_since=1000 + 102, used=True)
    assert find_violation(closed, T, INIT, at(5000)) is None


def test_heartbeat_after_first_applies_even_with_sections() -> None:
    s = snap(last_hb=1000 + 50, oos_since=0, opened=(("b", 1000 + 40),))
    assert find_violation(s, T, INIT, at(51.5)) is None
    v = find_violation(s, T, INIT, at(52.5))
    assert v is not None
    assert v.cause == "heartbeat_timeout"
    assert v.observed_s > v.limit_s


def test_most_overdue_open_section_is_reported_and_none_disables() -> None:
    t = ActiveTimeouts(None, None, {"a": 5.0, "b": 1.0, "c": None}, None)
    s = snap(oos_since=0, opened=(("a", 1000), ("b", 1000 + 3), ("c", 1000)))
    v = find_violation(s, t, INIT, at(6))
    assert v is not None
    assert (v.cause, v.section) == ("section_timeout", "b")  # 2 s over beats a's 1 s over
    assert find_violation(snap(oos_since=0, opened=(("c", 1000),)), t, INIT, at(1e6)) is None


def test_out_of_section_from_last_close_and_torn_read_skipped() -> None:
    t = ActiveTimeouts(None, None, {"a": 5.0}, 3.0)
    assert find_violation(snap(oos_since=1000 + 10, used=True), t, INIT, at(12)) is None
    v = find_violation(snap(oos_since=1000 + 10, used=True), t, INIT, at(13.5))
    assert v is not None
    assert v.cause == "out_of_section_timeout"
    # No section open but the out-of-section start not yet written: skip this round.
    assert find_violation(snap(oos_since=0, used=True), t, INIT, at(1e6)) is None


def test_everything_disabled_never_fires() -> None:
    t = ActiveTimeouts(None, None, {}, None)
    assert find_violation(snap(), t, INIT, at(1e9)) is None
    assert next_deadline_ns(snap(), t, INIT) is None


W = ActiveTimeouts(
    initial_heartbeat=None,
    heartbeat=None,
    sections={"step": 1.0, "warmup": 10.0, "ckpt": 2.0},
    out_of_section=1.0,
)


def warm(steps: int, n: int = 3, **kw: object) -> RankSnapshot:
    base = snap(**kw)  # type: ignore[arg-type]
    return RankSnapshot(
        base.last_hb_ns, base.oos_since_ns, base.sections_used, base.open_sections, n, steps
    )


def test_warmup_steps_use_the_warmup_timeout_and_skip_out_of_section() -> None:
    # Step 2 of 3 open for 5 s: within the warmup timeout.
    assert find_violation(warm(2, opened=(("step", 1000.0),)), W, INIT, at(5)) is None
    # Step 3 of 3 open for 11 s: over the warmup timeout, reported as the step section.
    v = find_violation(warm(3, opened=(("step", 1000.0),)), W, INIT, at(11))
    assert v is not None
    assert (v.section, v.limit_s) == ("step", 10.0)
    # Step 4: the steady-state step timeout.
    v = find_violation(warm(4, opened=(("step", 1000.0),)), W, INIT, at(1.5))
    assert v is not None
    assert v.limit_s == 1.0
    # Out of section between warmup steps 1 and 2: not checked; after step 3: checked.
    assert find_violation(warm(1, used=True, oos_since=1000.0), W, INIT, at(50)) is None
    v = find_violation(warm(3, used=True, oos_since=1000.0), W, INIT, at(2))
    assert v is not None
    assert v.cause == "out_of_section_timeout"
    # Other sections are checked during warmup.
    v = find_violation(warm(1, opened=(("ckpt", 1000.0),)), W, INIT, at(3))
    assert v is not None
    assert v.section == "ckpt"


def test_warmup_without_a_warmup_timeout_or_a_step_section() -> None:
    no_warmup = ActiveTimeouts(None, None, {"step": 1.0}, 1.0)
    assert find_violation(warm(2, opened=(("step", 1000.0),)), no_warmup, INIT, at(100)) is None
    no_step = ActiveTimeouts(None, None, {"train": 1.0}, 1.0)
    v = find_violation(warm(0, used=True, oos_since=1000.0), no_step, INIT, at(2))
    assert v is not None  # no 'step' section: warmup never applies


def test_violation_messages_keep_nvrx_wording_beside_ours() -> None:
    from nvrx.ft._detection import Violation

    hb = Violation("heartbeat_timeout", 5.02, 5.0)
    assert "Did not get subsequent heartbeat. Waited 5.00 seconds." in hb.message
    assert hb.message.startswith("heartbeat_timeout: no heartbeat for 5.020 s")
    initial = Violation("initial_heartbeat_timeout", 61.0, 60.0).message
    assert "Did not get initial heartbeat. Waited 60.00 seconds." in initial
    section = Violation("section_timeout", 12.5, 10.0, "step").message
    assert "Section 'step' has been open for 12.50 seconds. Timeout is 10.00 seconds." in section
    oos = Violation("out_of_section_timeout", 3.0, 2.0).message
    assert "Was out of section for 3.00 seconds. Timeout is 2.00 seconds." in oos
    assert Violation("gpu_unhealthy", 0.0, 0.0).nvrx_wording is None


@pytest.mark.timeout(60)
def test_the_stack_dump_signal_reaches_the_rank_alone_not_its_children(
    tmp_path: pathlib.Path,
) -> None:
    """A rank in its own session with a child (a DataLoader worker): only the rank dumps."""
    script = (
        "import os, signal, sys, time\n"
        "def mark(who):\n"
        "    def handler(signum, frame):\n"
        f"        open({str(tmp_path)!r} + '/' + who, 'w').close()\n"
        "    return handler\n"
        "if os.fork() == 0:\n"
        "    signal.signal(signal.SIGUSR2, mark('child'))\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "signal.signal(signal.SIGUSR2, mark('rank'))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    popen = subprocess.Popen(
        [sys.executable, "-c", script], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert popen.stdout is not None
        assert popen.stdout.readline() == b"ready\n"
        time.sleep(0.2)  # the child's handler is installed
        term = Terminator(
            RankProcess(popen.pid),
            term_signal=signal.SIGTERM,
            grace_period_s=2.0,
            dump_signal=signal.SIGUSR2,
            logger=logging.getLogger("test"),
        )
        assert term.target == f"process group {popen.pid}"
        due = term.advance(time.monotonic_ns())
        assert due is not None
        deadline = time.monotonic() + 30
        while not (tmp_path / "rank").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (tmp_path / "rank").exists()
        time.sleep(0.2)
        assert not (tmp_path / "child").exists()
        while term.advance(time.monotonic_ns()) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert popen.wait(timeout=30) == -signal.SIGTERM
        term.proc.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=10)
