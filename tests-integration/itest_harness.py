"""Run real ft_launcher processes for the integration tests, and prove none of them leaks.

Every launcher started here gets a unique marker in its environment, which all its
descendants inherit (monitors, ranks, anything they start, even after a double fork
or ``setsid``). After the test, :meth:`LauncherRun.cleanup` looks for processes
carrying the marker: a launcher that exited on its own must have left none behind;
one still running (the test failed or timed out) is killed together with everything
carrying its marker. Either way nothing started by a test survives it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psutil

__all__ = [
    "DDP_STEPS",
    "FAST_FT",
    "LIGHTNING_STEPS",
    "MARKER_ENV",
    "Event",
    "LauncherRun",
    "assert_every_step_once",
    "free_port",
    "launcher_command",
    "marked_processes",
    "matches",
    "restart_reasons",
    "wait_for",
]

HERE = pathlib.Path(__file__).resolve().parent
DDP_STEPS = HERE / "scripts" / "ddp_steps.py"
LIGHTNING_STEPS = HERE / "scripts" / "lightning_steps.py"

#: Environment variable carrying the run's marker into every descendant of a launcher.
MARKER_ENV = "NVRX_ITEST_RUN"

#: Launcher options for every test: quick to notice and act, patient with start-up.
FAST_FT: list[str] = [
    "--monitor-interval=0.1",
    "--workers-stop-timeout=3",
    "--term-timeout=5",
    "--ft-workload-check-interval=0.1",
    "--ft-initial-rank-heartbeat-timeout=30",
    "--ft-rank-heartbeat-timeout=4",
    "--ft-rank-termination-grace-period=2",
    "--ft-enable-gpu-monitor=false",
    "--max-restarts=3",
]

_PR_SET_PDEATHSIG = 1

#: How long processes of a launcher that exited on its own may take to disappear.
LEAK_GRACE_S = 5.0

#: One JSON line of a journal or cycle log.
Event = dict[str, Any]


def launcher_command() -> list[str]:
    """The ``ft_launcher`` console script of this interpreter's environment."""
    script = pathlib.Path(sys.executable).with_name("ft_launcher")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "nvrx.launcher"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def marked_processes(marker: str) -> list[psutil.Process]:
    """Every live (non-zombie) process whose environment carries ``marker``."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(MARKER_ENV) == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def _describe(procs: Sequence[psutil.Process]) -> str:
    lines = []
    for proc in procs:
        try:
            lines.append(f"  pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            lines.append(f"  pid {proc.pid}: (gone)")
    return "\n".join(lines)


def _die_with_parent() -> None:
    """In the launcher before exec: SIGTERM it when pytest dies (Linux), so even a
    hard kill of the test run stops the launcher, which then stops its ranks."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def read_jsonl(path: pathlib.Path) -> list[Event]:
    """The JSON objects of a JSON-lines file; a torn or bad line is skipped."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def journal_events(path: pathlib.Path, kind: str) -> list[Event]:
    """The records of one event type in a journal."""
    return [r for r in read_jsonl(path) if r.get("event") == kind]


def wait_for_store(port: int, timeout: float = 120.0) -> None:
    """Wait until a launcher hosts the rendezvous store on ``port`` of 127.0.0.1.

    Every launcher on 127.0.0.1 may host it and the first to bind does; tests start a
    node that stays in the job first, as a scheduler's head node would: the store's host
    leaving ends the rendezvous for everyone.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"no rendezvous store on port {port} after {timeout:.0f} s")


class LauncherRun:
    """One ft_launcher process in its own session, with its log, journal and cycle log."""

    def __init__(
        self, name: str, args: Sequence[str], out: pathlib.Path, logs: pathlib.Path
    ) -> None:
        self.name = name
        self.out = out
        self.marker = f"{name}-{uuid.uuid4().hex}"
        self.log_path = logs / f"{name}.log"
        self.cycle_log = logs / f"{name}.cycles.jsonl"
        self.journal_path = out / "journal.jsonl"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env[MARKER_ENV] = self.marker
        for name_ in ("NVRX_FT_MONITOR_SOCKET", "TORCHELASTIC_RESTART_COUNT"):
            env.pop(name_, None)
        command = [
            *launcher_command(),
            f"--log-dir={logs / name / 'ranks'}",
            "--tee=3",
            f"--ft-cycle-log={self.cycle_log}",
            *args,
        ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.exit_code: int | None = None

    @property
    def pid(self) -> int:
        """The launcher's pid."""
        return self.proc.pid

    def log(self) -> str:
        """Everything the launcher, its monitors and (teed) its ranks printed so far."""
        return self.log_path.read_text(errors="replace")

    def journal(self) -> list[Event]:
        """The JSON lines the training scripts appended to ``<out>/journal.jsonl``."""
        return read_jsonl(self.journal_path)

    def cycles(self) -> list[Event]:
        """The launcher's cycle log: one record per restart, stop or finish."""
        return read_jsonl(self.cycle_log)

    def restarts(self) -> list[Event]:
        """The cycle log's restart records, in order."""
        return [c for c in self.cycles() if c.get("action") == "restart"]

    def steps_done(self, *, rank: int, attempt: int | None = None) -> int:
        """The last step ``rank`` finished in ``attempt`` (any attempt: None); 0 when none."""
        steps = [
            e["step"]
            for e in self.journal()
            if e["event"] == "step"
            and e["rank"] == rank
            and (attempt is None or e["attempt"] == attempt)
        ]
        return max(steps, default=0)

    def at_a_checkpoint_step(self, *, rank: int, at_least: int, every: int) -> bool:
        """Whether ``rank``'s last journalled step is a checkpoint step of ``at_least`` or more.

        The moment to SIGKILL that rank's node: a rank journals a step after its
        all-reduce and its step time, so a kill can fall in between, and that step is
        never journalled. Killed at a checkpoint step, the next checkpoint would need
        this rank's next ``every`` steps, so none can hold a step it did not journal.
        """
        step = self.steps_done(rank=rank)
        return step >= at_least and step % every == 0

    def wait_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """:func:`wait_for`, failing with the launcher's state and log tail."""
        try:
            wait_for(condition, timeout, what)
        except AssertionError as exc:
            state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
            raise AssertionError(
                f"{self.name}: {exc} (ft_launcher {state}); log tail:\n{self.log()[-6000:]}"
            ) from None

    def wait(self, timeout: float) -> int:
        """The launcher's exit code; fail with the end of its log if it runs too long."""
        try:
            self.exit_code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name}: ft_launcher still running after {timeout:.0f} s; log tail:\n"
                f"{self.log()[-6000:]}"
            ) from None
        return self.exit_code

    def expect_exit(self, code: int, timeout: float) -> None:
        """Wait for the launcher and check its exit code, showing the log on a mismatch."""
        got = self.wait(timeout)
        assert got == code, (
            f"{self.name}: exit code {got}, expected {code}; log tail:\n" + (self.log()[-6000:])
        )

    def monitor_pid(self, local_rank: int) -> int:
        """The pid of the live rank monitor serving ``local_rank``."""
        for proc in marked_processes(self.marker):
            with contextlib.suppress(psutil.Error):
                cmd = proc.cmdline()
                if "nvrx.ft._monitor_main" in cmd and cmd[cmd.index("--local-rank") + 1] == str(
                    local_rank
                ):
                    return proc.pid
        raise AssertionError(f"{self.name}: no monitor for local rank {local_rank}")

    def runtime_dirs(self) -> set[pathlib.Path]:
        """The private runtime directories holding this launcher's monitor sockets."""
        found = re.findall(r"listening on (\S+)/monitor-\d+\.sock", self.log())
        return {pathlib.Path(d) for d in found}

    def cleanup(self, grace: float = LEAK_GRACE_S) -> list[str]:
        """Kill whatever is left; return one problem per process the launcher left behind.

        Processes of a launcher that exited on its own get ``grace`` seconds to go.
        """
        problems = []
        if self.proc.poll() is None:
            # The test ended early (failed or timed out): stop everything, no blame.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        else:
            deadline = time.monotonic() + grace
            while marked_processes(self.marker) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = marked_processes(self.marker)
            if left:
                problems.append(
                    f"{self.name}: ft_launcher exited ({self.proc.returncode}) but left "
                    f"{len(left)} process(es) behind:\n{_describe(left)}"
                )
            if self.proc.returncode >= 0:  # it exited by itself, so it could clean up
                kept = [d for d in self.runtime_dirs() if d.exists()]
                if kept:
                    problems.append(f"{self.name}: runtime dir(s) left behind: {kept}")
        left = marked_processes(self.marker)
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _, alive = psutil.wait_procs(left, timeout=10)
        if alive:
            problems.append(f"{self.name}: could not kill:\n{_describe(alive)}")
        return problems


def assert_every_step_once(
    journal: Sequence[Event],
    steps: int,
    ranks: Sequence[int] = (0, 1),
    *,
    last_record_may_be_lost: bool = False,
) -> dict[int, int]:
    """Check that training ran every step exactly once once restarts are accounted for.

    A restarted attempt resumes from the last checkpoint, so the steps a failed attempt
    ran after that checkpoint are run again: for each rank, the steps of an attempt
    count only up to the step the next attempt resumed from. What counts must be
    every step 1..``steps`` exactly once, each attempt must run its steps in order from
    its resume point, and the last attempt must finish. Returns the resume step of
    each attempt (rank 0's view; every rank resumes from the same checkpoint).

    ``last_record_may_be_lost``: a rank that runs on until its SIGTERM lands (a hang the
    monitor ended with SIGCONT then SIGTERM) can take part in a step's all-reduce and die
    before it journals that step; the step the next attempt resumed from then counts as
    run once for that rank if it is the one missing.
    """
    resumes: dict[int, int] = {}
    for rank in ranks:
        events = [e for e in journal if e["rank"] == rank]
        attempts = sorted({e["attempt"] for e in events})
        assert attempts, f"rank {rank} never started"
        resume = {e["attempt"]: e["step"] for e in events if e["event"] == "resume"}
        counted: list[int] = []
        for i, attempt in enumerate(attempts):
            ran = [e["step"] for e in events if e["event"] == "step" and e["attempt"] == attempt]
            if ran:
                assert attempt in resume, f"rank {rank} attempt {attempt} ran without resuming"
                first = resume[attempt] + 1
                assert ran == list(range(first, first + len(ran))), (
                    f"rank {rank} attempt {attempt} resumed from {resume[attempt]} "
                    f"but ran steps {ran}"
                )
            later = [resume[a] for a in attempts[i + 1 :] if a in resume]
            limit = later[0] if later else steps
            counted.extend(s for s in ran if s <= limit)
            if last_record_may_be_lost and later and ran and ran[-1] == limit - 1:
                counted.append(limit)
        assert sorted(counted) == list(range(1, steps + 1)), (
            f"rank {rank}: steps counted across attempts {sorted(counted)} are not 1..{steps} "
            f"each once (resume points {resume})"
        )
        done = [e for e in events if e["event"] == "done"]
        assert done, f"rank {rank} did not finish"
        assert done[-1]["attempt"] == attempts[-1], f"rank {rank} did not finish its last attempt"
        if rank == ranks[0]:
            resumes = resume
        else:
            same = {a: s for a, s in resume.items() if a in resumes}
            assert same == {a: resumes[a] for a in same}, (
                f"ranks resumed from different steps: {resumes} vs {resume}"
            )
    return resumes


def restart_reasons(cycles: Sequence[Event]) -> list[str]:
    """The reason of each restart in a cycle log, in order."""
    return [c["reason"] for c in cycles if c.get("action") == "restart"]


def matches(pattern: str, text: str) -> bool:
    """``re.search`` as a bool, for assertions that print both sides."""
    return re.search(pattern, text) is not None
