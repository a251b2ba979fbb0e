"""The monitor process: readiness, restarts of its rank, a dead monitor, sockets, bad input."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from nvrx.ft import RankMonitorServer, create_runtime_dir
from nvrx.ft._runtime import release_runtime_dir

if TYPE_CHECKING:
    from tests.conftest import Events, MakeConfig, MonitorFactory, RankFactory

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(90)]


def _wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_runtime_dir_is_private_and_unique() -> None:
    a, b = create_runtime_dir(), create_runtime_dir()
    try:
        assert a != b
        for d in (a, b):
            st = d.stat()
            assert st.st_mode & 0o777 == 0o700
            assert st.st_uid == os.getuid()
    finally:
        release_runtime_dir(a)
        release_runtime_dir(b)


def test_monitor_refuses_a_shared_directory(
    make_config: MakeConfig, tmp_path: pathlib.Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    proc = RankMonitorServer.start_in_subprocess(
        make_config(), shared / "monitor-0.sock", stderr=subprocess.DEVNULL
    )
    try:
        with pytest.raises(RuntimeError, match="exited with code"):
            proc.wait_ready(timeout=30)
    finally:
        proc.stop()
    assert not (shared / "monitor-0.sock").exists()


def test_socket_file_is_private_and_removed_on_stop(
    start_monitor: MonitorFactory, make_config: MakeConfig
) -> None:
    proc, _ = start_monitor(make_config())
    st = proc.socket_path.stat()
    assert st.st_mode & 0o077 == 0
    assert proc.stop() == 0
    assert not proc.socket_path.exists()


def test_stale_socket_is_replaced(
    runtime_dir: pathlib.Path, start_monitor: MonitorFactory, make_config: MakeConfig
) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(runtime_dir / "monitor-0.sock"))
    stale.close()  # a crashed run leaves the file, nobody listens
    proc, log = start_monitor(make_config())
    assert proc.is_alive()
    assert "removing stale socket" in log.read_text()


def test_second_monitor_on_a_live_socket_fails(
    runtime_dir: pathlib.Path, start_monitor: MonitorFactory, make_config: MakeConfig
) -> None:
    start_monitor(make_config())
    other = RankMonitorServer.start_in_subprocess(
        make_config(), runtime_dir / "monitor-0.sock", stderr=subprocess.DEVNULL
    )
    try:
        with pytest.raises(RuntimeError):
            other.wait_ready(timeout=30)
    finally:
        other.stop()
    assert (runtime_dir / "monitor-0.sock").exists()


def test_monitor_exits_when_its_parent_dies(
    runtime_dir: pathlib.Path, make_config: MakeConfig
) -> None:
    code = (
        "import sys, time\n"
        "from nvrx.ft import RankMonitorServer, FaultToleranceConfig\n"
        "p = RankMonitorServer.run_in_subprocess(FaultToleranceConfig(enable_gpu_monitor=False),"
        f" {str(runtime_dir / 'monitor-0.sock')!r})\n"
        "p.wait_ready(30)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        monitor_pid = int(parent.stdout.readline())
        parent.kill()
        parent.wait()

        def gone() -> bool:
            try:
                os.kill(monitor_pid, 0)
            except ProcessLookupError:
                return True
            return False

        _wait_until(gone)
        assert not (runtime_dir / "monitor-0.sock").exists()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_monitor_serves_successive_ranks(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=2.0))
    first = start_rank([["init"], ["hb"], ["exit", 3]])
    assert first.wait_exit() == 3
    assert events.wait("rank_disconnected").pid == first.pid
    second = start_rank([["init"], ["hb"], ["hang"]], rank=5)
    ev = events.wait("rank_terminated")
    assert (ev.pid, ev.rank, ev.cause) == (second.pid, 5, "heartbeat_timeout")
    second.wait_exit()


def test_client_survives_a_killed_monitor(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory
) -> None:
    proc, _ = start_monitor(make_config(rank_heartbeat_timeout=30.0))
    rank = start_rank(
        [
            ["init"],
            ["say", "connected"],
            ["sleep", 1.0],
            ["beat_for", 2.5, 0.01],
            ["say", "still-training"],
            ["exit", 0],
        ]
    )
    rank.wait_output("connected")
    proc.kill()
    assert rank.wait_exit() == 0
    out = rank.output()
    assert "still-training" in out
    assert out.count("rank monitor at") == 1  # logged once


def test_workload_control_request_reaches_the_launcher(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config())
    rank = start_rank([["init"], ["control", "ExcludeThisNode"], ["exit", 0]], rank=2)
    assert rank.wait_exit() == 0
    ev = events.wait("workload_control")
    assert (ev.action, ev.rank, ev.description) == ("ExcludeThisNode", 2, "from the test")


def _raw(path: pathlib.Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    sock.connect(str(path))
    return sock


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def _read_reply(sock: socket.socket) -> bytes:
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        if not chunk:
            return b""
        header += chunk
    (n,) = struct.unpack(">I", header)
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    return body


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1, 2]",
        b'{"type": "init"}',
        b'{"type": "init", "v": 1, "rank": "0", "local_rank": 0, "host": "h", "stack_dump": true}',
        b'{"type": "exec", "code": "rm -rf"}',
        b'{"type": "set_timeouts", "heartbeat": {"initial": -1, "subsequent": 1}}',
        b"\x80\x04\x95pickle",
    ],
)
def test_malformed_messages_are_rejected_and_monitor_keeps_working(
    payload: bytes,
    make_config: MakeConfig,
    start_monitor: MonitorFactory,
    start_rank: RankFactory,
    events: Events,
) -> None:
    proc, log = start_monitor(make_config(rank_heartbeat_timeout=0.5))
    with _raw(proc.socket_path) as sock:
        sock.sendall(_frame(payload))
        reply = _read_reply(sock)
        assert b'"ok":false' in reply
    assert "rejected" in log.read_text()
    rank = start_rank([["init"], ["hb"], ["hang"]])
    assert events.wait("rank_terminated").pid == rank.pid
    rank.wait_exit()


def test_oversized_and_truncated_frames(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    proc, log = start_monitor(make_config(rank_heartbeat_timeout=0.5))
    with _raw(proc.socket_path) as sock:
        sock.sendall(struct.pack(">I", 10 * 1024 * 1024) + b"x" * 100)
        assert b"exceeds" in _read_reply(sock)
        assert sock.recv(1) == b""  # the monitor closed the connection
    with _raw(proc.socket_path) as sock:
        sock.sendall(struct.pack(">I", 100) + b'{"type": ')
    _wait_until(lambda: "in the middle of a message" in log.read_text())
    rank = start_rank([["init"], ["hb"], ["hang"]])
    assert events.wait("rank_terminated").pid == rank.pid
    rank.wait_exit()
    assert proc.is_alive()


def test_client_without_socket_env_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from nvrx.ft import MONITOR_SOCKET_ENV, RankMonitorClient, RankMonitorClientError

    monkeypatch.delenv(MONITOR_SOCKET_ENV, raising=False)
    monkeypatch.delenv("FT_RANK_MONITOR_IPC_SOCKET", raising=False)
    with pytest.raises(RankMonitorClientError, match=MONITOR_SOCKET_ENV):
        RankMonitorClient().init_workload_monitoring()


def test_stop_is_prompt(make_config: MakeConfig, start_monitor: MonitorFactory) -> None:
    proc, _ = start_monitor(make_config())
    proc._popen.send_signal(signal.SIGTERM)
    assert proc._popen.wait(timeout=30) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_connection_from_another_uid_is_rejected(
    make_config: MakeConfig, start_monitor: MonitorFactory
) -> None:
    proc, log = start_monitor(make_config())
    code = (
        "import ctypes, os, socket, struct\n"
        "os.seteuid(65534)\n"
        "ctypes.CDLL(None).setfsuid(0)  # keep file access, present uid 65534 to the peer\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.connect({str(proc.socket_path)!r})\n"
        "s.settimeout(20)\n"
        "try:\n"
        "    s.sendall(struct.pack('>I', 2) + b'{}')\n"
        "    print('reply', s.recv(100))\n"
        "except OSError as exc:\n"
        "    print('closed', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "reply b'{" not in out
    _wait_until(lambda: "uid 65534 is not ours" in log.read_text())


def test_termination_reaches_the_rank_process_group(
    make_config: MakeConfig,
    start_monitor: MonitorFactory,
    start_rank: RankFactory,
    events: Events,
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=0.5))
    rank = start_rank([["init"], ["spawn_child"], ["hb"], ["hang"]])
    rank.wait_output("child ")
    child = int(rank.output().split("child ", 1)[1].split()[0])
    events.wait("rank_terminated")
    rank.wait_exit()

    def child_gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        return False

    _wait_until(child_gone)


def test_rank_exit_is_noticed_while_a_forked_child_holds_its_socket(
    make_config: MakeConfig,
    start_monitor: MonitorFactory,
    start_rank: RankFactory,
    events: Events,
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=2.0))
    rank = start_rank([["init"], ["hb"], ["fork_sleeper"], ["exit", 0]])
    try:
        assert rank.wait_exit() == 0
        assert events.wait("rank_disconnected").pid == rank.pid
        time.sleep(2.5)  # longer than the heartbeat timeout: the exited rank is not "hung"
        assert not [e for e in events.drain() if e.event == "rank_terminated"]
    finally:
        child = int(rank.output().split("forked ", 1)[1].split()[0])
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
