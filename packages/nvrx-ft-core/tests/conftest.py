"""Fixtures that start real monitors and scripted ranks, and always clean them up."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from nvrx.ft import (
    MONITOR_SOCKET_ENV,
    FaultToleranceConfig,
    MonitorEvent,
    MonitorProcess,
    RankMonitorServer,
    create_runtime_dir,
    parse_monitor_event,
)

WORKER = pathlib.Path(__file__).with_name("rank_worker.py")
LOADED_DEADLINE_S = 30.0  # generous: the machine is a loaded 2-core box


class Events:
    """The launcher's side of the events socket."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.seen: list[MonitorEvent] = []

    def wait(self, kind: str, timeout: float = LOADED_DEADLINE_S) -> MonitorEvent:
        """The next event of ``kind`` (earlier ones of other kinds are kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind} event within {timeout} s; saw {self.seen}")
            self.sock.settimeout(left)
            try:
                event = parse_monitor_event(self.sock.recv(65536))
            except TimeoutError:
                continue
            self.seen.append(event)
            if event.event == kind:
                return event

    def drain(self) -> list[MonitorEvent]:
        """Events already queued."""
        self.sock.setblocking(False)
        try:
            while True:
                self.seen.append(parse_monitor_event(self.sock.recv(65536)))
        except BlockingIOError:
            pass
        finally:
            self.sock.setblocking(True)
        return self.seen

    def close(self) -> None:
        self.sock.close()


class Rank:
    """A scripted rank process in its own session, like the launcher starts it."""

    def __init__(self, popen: subprocess.Popen[str], log: pathlib.Path) -> None:
        self.popen = popen
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_output(self, text: str, timeout: float = LOADED_DEADLINE_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.popen.poll() is not None and text not in self.output():
                raise AssertionError(
                    f"rank exited ({self.popen.returncode}) before {text!r}:\n{self.output()}"
                )
            time.sleep(0.02)
        raise AssertionError(f"rank never printed {text!r}:\n{self.output()}")

    def wait_exit(self, timeout: float = LOADED_DEADLINE_S) -> int:
        return self.popen.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def node_dir() -> Iterator[pathlib.Path]:
    """A fresh directory on tmpfs (/dev/shm where there is one), as local checkpoints use."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = pathlib.Path(tempfile.mkdtemp(prefix="nvrx-test-lc-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def runtime_dir() -> Iterator[pathlib.Path]:
    path = create_runtime_dir()
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


@pytest.fixture
def events(runtime_dir: pathlib.Path) -> Iterator[Events]:
    ev = Events(runtime_dir / "events.sock")
    try:
        yield ev
    finally:
        ev.close()


MonitorFactory = Callable[..., tuple[MonitorProcess, pathlib.Path]]


@pytest.fixture
def start_monitor(
    runtime_dir: pathlib.Path, events: Events, tmp_path: pathlib.Path
) -> Iterator[MonitorFactory]:
    started: list[MonitorProcess] = []
    logs: list[pathlib.Path] = []

    def start(
        cfg: FaultToleranceConfig, local_rank: int = 0
    ) -> tuple[MonitorProcess, pathlib.Path]:
        sock = runtime_dir / f"monitor-{local_rank}.sock"
        log = tmp_path / f"monitor-{local_rank}-{len(started)}.log"
        with log.open("wb") as stream:
            proc = RankMonitorServer.start_in_subprocess(
                cfg, sock, local_rank=local_rank, events_socket=events.path, stderr=stream.fileno()
            )
        started.append(proc)
        logs.append(log)
        proc.wait_ready(timeout=LOADED_DEADLINE_S)
        return proc, log

    try:
        yield start
    finally:
        for proc in started:
            proc.stop(timeout=5.0)
        for log in logs:
            sys.stderr.write(f"--- {log.name}\n{log.read_text(errors='replace')}")


RankFactory = Callable[..., Rank]


@pytest.fixture
def start_rank(runtime_dir: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[RankFactory]:
    ranks: list[Rank] = []

    def start(steps: list[list[object]], local_rank: int = 0, rank: int = 0) -> Rank:
        log = tmp_path / f"rank-{len(ranks)}.log"
        env = {
            **os.environ,
            MONITOR_SOCKET_ENV: str(runtime_dir / f"monitor-{local_rank}.sock"),
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
        }
        with log.open("w") as stream:
            popen = subprocess.Popen(
                [sys.executable, str(WORKER), json.dumps(steps)],
                env=env,
                stdout=stream,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        r = Rank(popen, log)
        ranks.append(r)
        return r

    try:
        yield start
    finally:
        for r in ranks:
            if r.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.pid, signal.SIGKILL)
            r.popen.wait(timeout=10)


def _fast_config(**overrides: object) -> FaultToleranceConfig:
    values: dict[str, object] = {
        "initial_rank_heartbeat_timeout": None,
        "rank_heartbeat_timeout": None,
        "rank_termination_grace_period": 1.0,
        "min_calculated_timeout": None,
        "enable_gpu_monitor": False,
        "log_level": "DEBUG",
    }
    values.update(overrides)
    return FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, **values)


MakeConfig = Callable[..., FaultToleranceConfig]


@pytest.fixture
def make_config() -> MakeConfig:
    """Build a config for tests: heartbeat checks off, short grace, no GPU check."""
    return _fast_config
