"""Warm spares: the spare program on its own, and real ft_launcher restarts through spares."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator

import psutil
import pytest
from launcher_testkit import (  # type: ignore[import-not-found]
    Launcher,
    all_gone,
    read_events,
    wait_for,
)

from nvrx.launcher import ExitCode
from nvrx.launcher._spares import PythonCommand, python_command, spare_command

Start = Callable[..., Launcher]
StartSpare = Callable[..., tuple["subprocess.Popen[bytes]", socket.socket]]
PY = sys.executable
SPARE = "_warm_spare.py"  # in the command line of every spare
#: ... and of each spare's guard (the exec shim's detached copy, which the launcher, a
#: subreaper, adopts), whose command line starts with the shim.
GUARD = "_worker_exec.py"


def _spares(launcher: Launcher) -> list[psutil.Process]:
    """The launcher's warm spares, not their guards."""
    return [p for p in launcher.running(SPARE) if GUARD not in " ".join(p.cmdline())]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ([PY, "-u", "t.py", "--lr", "1"], PythonCommand(PY, ("-u",), ("t.py", "--lr", "1"))),
        ([PY, "-u", "-m", "pkg.t", "-x"], PythonCommand(PY, ("-u",), ("-m", "pkg.t", "-x"))),
        ([PY, "t.py"], PythonCommand(PY, (), ("t.py",))),
        (["/bin/train"], None),  # --no-python
        ([sys.executable, "-c", "print(1)"], None),
        ([sys.executable, "-X", "dev", "t.py"], None),  # an option a spare cannot take over
        ([sys.executable, "-u", "-m"], None),
        ([sys.executable, "-u"], None),
        (["/other/python", "-u", "t.py"], None),
    ],
)  # fmt: skip
def test_which_commands_a_spare_can_run(command: list[str], expected: PythonCommand | None) -> None:
    assert python_command(command) == expected


@pytest.fixture
def start_spare() -> Iterator[StartSpare]:
    """Start spares as the pool does (through the exec shim); all are killed after."""
    started: list[subprocess.Popen[bytes]] = []

    def start(
        cwd: pathlib.Path | None = None, launcher_pid: int | None = None
    ) -> tuple[subprocess.Popen[bytes], socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = PythonCommand(PY, ("-u",), ("prog.py",))
        argv = spare_command(command, ["json"], theirs.fileno())
        if launcher_pid is not None:  # pretend another process is its launcher
            argv[argv.index(str(os.getpid()))] = str(launcher_pid)
        proc = subprocess.Popen(
            argv,
            pass_fds=(theirs.fileno(),),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )
        theirs.close()
        started.append(proc)
        return proc, ours

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def _hand_over(
    sock: socket.socket, argv: list[str], env: dict[str, str], out: pathlib.Path
) -> None:
    with (out / "stdout").open("w") as stdout, (out / "stderr").open("w") as stderr:
        message = json.dumps({"argv": argv, "env": env, "streams": [1, 2]}).encode()
        socket.send_fds(sock, [message], [stdout.fileno(), stderr.fileno()])
    sock.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("as_module", [False, True])
def test_spare_runs_the_program_as_main_with_its_env_argv_and_streams(
    start_spare: StartSpare, tmp_path: pathlib.Path, as_module: bool
) -> None:
    (tmp_path / "prog.py").write_text(
        "import os, sys\n"
        "print('argv', sys.argv[1:], 'rank', os.environ['RANK'], 'main', __name__)\n"
        "print('path0', sys.path[0])\n"
        "print('oops', file=sys.stderr)\n"
        "sys.exit(int(os.environ['CODE']))\n"
    )
    # As with ``python -m``, a module is found from the working directory.
    cwd = tmp_path if as_module else pathlib.Path.cwd()
    proc, sock = start_spare(cwd=cwd)
    env = {"RANK": "5", "CODE": "7"}
    argv = ["-m", "prog", "--a", "b"] if as_module else [str(tmp_path / "prog.py"), "--a", "b"]
    _hand_over(sock, argv, env, tmp_path)
    assert proc.wait(30) == 7
    stdout = (tmp_path / "stdout").read_text().splitlines()
    assert stdout[0] == "argv ['--a', 'b'] rank 5 main __main__"
    assert stdout[1] == f"path0 {tmp_path}"
    assert (tmp_path / "stderr").read_text() == "oops\n"


@pytest.mark.timeout(60)
def test_spare_exception_exits_1_with_the_traceback_on_its_stderr(
    start_spare: StartSpare, tmp_path: pathlib.Path
) -> None:
    (tmp_path / "prog.py").write_text("raise RuntimeError('boom in rank')\n")
    proc, sock = start_spare()
    _hand_over(sock, [str(tmp_path / "prog.py")], {}, tmp_path)
    assert proc.wait(30) == 1
    assert "RuntimeError: boom in rank" in (tmp_path / "stderr").read_text()


@pytest.mark.timeout(60)
def test_unneeded_spare_exits_when_its_socket_closes(start_spare: StartSpare) -> None:
    proc, sock = start_spare()
    sock.close()
    assert proc.wait(30) == 0


@pytest.mark.timeout(60)
def test_spare_whose_launcher_is_gone_does_not_stay(start_spare: StartSpare) -> None:
    # A launcher pid that is not the spare's parent: it must not wait for work.
    proc, sock = start_spare(launcher_pid=1)
    assert proc.wait(30) == 128 + signal.SIGKILL
    sock.close()


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_restart_through_warm_spares_resumes_and_logs_per_rank(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    log_dir = tmp_path / "logs"
    # Every cycle raises at step 3: cycle 0 starts cold, cycle 1 from the spares; the
    # warm rank's traceback must land in its own attempt's stderr file.
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--warm-spares",
         "--log-dir", str(log_dir), "-r", "3"],
        ["--steps", "20", "--step-time", "0.3", "--fault", "raise:1:3:*"],
    )  # fmt: skip
    assert launcher.wait() == ExitCode.RESTARTS_EXHAUSTED, launcher.log()
    journal = [json.loads(line) for line in (log_dir / "ft_launcher_events.jsonl").open()]
    started = [e for e in journal if e["event"] == "workers_started"]
    assert [e["warm_local_ranks"] for e in started] == [[], [0, 1]]
    assert "local ranks [0, 1] started from warm spares" in launcher.log()
    stderr = next(log_dir.glob("*/attempt_1/1/stderr.log")).read_text()
    assert "RuntimeError: injected failure at step 3" in stderr
    # The warm ranks resumed from the checkpoint as rank 0 and 1 of attempt 1.
    resumed = [e for e in read_events(launcher.out) if e["event"] == "resume" and e["cycle"] == 1]
    assert sorted(e["rank"] for e in resumed) == [0, 1]
    assert all(e["step"] == 2 for e in resumed), resumed
    failed = [e for e in journal if e["event"] == "rank_failed"]
    assert [(e["cycle"], e["rank"], e["exit_code"]) for e in failed] == [(0, 1, 1), (1, 1, 1)]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_spares_are_stopped_on_success_and_die_with_a_killed_launcher(
    start_launcher: Start,
) -> None:
    finished = start_launcher(
        ["--nproc-per-node", "2", "--warm-spares"], ["--steps", "40", "--step-time", "0.1"],
        name="finished",
    )  # fmt: skip
    wait_for(lambda: len(_spares(finished)) == 2, timeout=60, what="two warm spares")
    spares = finished.running(SPARE)  # and their guards: all must go
    assert finished.wait() == ExitCode.SUCCESS, finished.log()
    assert all_gone(spares)

    killed = start_launcher(
        ["--nproc-per-node", "2", "--warm-spares"], ["--steps", "100000"], name="killed"
    )
    wait_for(lambda: len(_spares(killed)) == 2, timeout=60, what="two warm spares")
    spares = killed.running(SPARE)
    killed.proc.send_signal(signal.SIGKILL)
    killed.wait(30)
    wait_for(lambda: all_gone(spares), timeout=30, what="the spares to die with their launcher")
