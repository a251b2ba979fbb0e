"""The monitor under abuse: second init, clients that do not read, too many connections,
running out of file descriptors, hostile frames (fuzzed), a stopped monitor, runtime dirs.

Each test ends by checking that a real rank is still detected: the monitor keeps watching.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvrx.ft import (
    FaultToleranceConfig,
    MonitorProcess,
    RankMonitorServer,
    create_runtime_dir,
    monitor_beat_age,
)
from nvrx.ft._protocol import (
    MAX_DESCRIPTION_BYTES,
    MAX_MESSAGE_BYTES,
    ProtocolError,
    decode_payload,
    validate_request,
)
from nvrx.ft._runtime import release_runtime_dir

if TYPE_CHECKING:
    from tests.conftest import Events, MakeConfig, MonitorFactory, RankFactory

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def _wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def _connect(path: pathlib.Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    deadline = time.monotonic() + 20
    while True:
        try:
            sock.connect(str(path))
            return sock
        except BlockingIOError:  # the listen backlog is full for a moment
            if time.monotonic() > deadline:
                sock.close()
                raise
            time.sleep(0.01)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def _read_reply(sock: socket.socket) -> bytes | None:
    """One reply frame's payload; None when the monitor closed the connection."""
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        if not chunk:
            return None
        header += chunk
    (n,) = struct.unpack(">I", header)
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    return body


def _detects_a_hung_rank(start_rank: RankFactory, events: Events) -> None:
    rank = start_rank([["init"], ["hb"], ["hang"]])
    assert events.wait("rank_terminated").pid == rank.pid
    rank.wait_exit()


def _cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ second init


def test_second_init_from_a_forked_child_is_refused_and_the_rank_stays_watched(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_section_timeouts={"step": 1.5}))
    rank = start_rank([["init"], ["open", "step"], ["fork_init"], ["hang"]])
    ev = events.wait("rank_terminated")
    assert (ev.pid, ev.cause) == (rank.pid, "section_timeout")
    out = rank.output()
    assert "child refused" in out
    assert "second init_workload_monitoring" in out
    rank.wait_exit()


# -------------------------------------------------------- clients that misbehave


def test_a_client_that_never_reads_is_dropped_and_detection_holds(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    proc, log = start_monitor(make_config(rank_heartbeat_timeout=0.5))
    hog = _connect(proc.socket_path)
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    batch = _frame(b'{"type": "x"}') * 1000  # each answered by an error reply of ~70 bytes
    hog.settimeout(0.5)
    with contextlib.suppress(OSError):  # the monitor drops us at some point: EPIPE/ECONNRESET
        for _ in range(40):  # 40000 requests whose replies (about 3 MB) we never read
            hog.sendall(batch)
    _wait_until(lambda: "does not read its replies" in log.read_text())
    t0 = time.monotonic()
    _detects_a_hung_rank(start_rank, events)
    assert time.monotonic() - t0 < 15
    hog.close()
    assert proc.is_alive()


def test_idle_connections_cannot_lock_the_rank_out(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    proc, log = start_monitor(make_config(rank_heartbeat_timeout=0.5))
    idle = [_connect(proc.socket_path) for _ in range(40)]
    try:
        _wait_until(lambda: "dropping the oldest" in log.read_text())
        _detects_a_hung_rank(start_rank, events)
    finally:
        for sock in idle:
            sock.close()


def test_out_of_file_descriptors_neither_spins_nor_floods_the_log(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    proc, log = start_monitor(make_config(rank_heartbeat_timeout=0.5))
    open_fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
    old = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (open_fds + 1, old[1]))
    clients = []
    try:
        clients = [_connect(proc.socket_path) for _ in range(5)]
        _wait_until(lambda: "cannot accept connections" in log.read_text())
        cpu0 = _cpu_seconds(proc.pid)
        time.sleep(2.0)
        assert _cpu_seconds(proc.pid) - cpu0 < 0.5  # a busy loop would burn ~2 s
        assert log.read_text().count("cannot accept connections") == 1
        assert log.stat().st_size < 200_000
    finally:
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, old)
        for sock in clients:
            sock.close()
    _detects_a_hung_rank(start_rank, events)


# ------------------------------------------------------------ protocol limits


@pytest.mark.parametrize(
    "payload",
    [
        b"[" * 50_000 + b"]" * 50_000,
        b'{"type": "init", "v": 1, "rank": ' + b"9" * 5000 + b"}",
        b'{"type": "init", "v": 1, "rank": 99999999999999999999, "local_rank": 0,'
        b' "host": "h", "stack_dump": true}',
        b'{"type": "set_timeouts", "heartbeat": {"initial": NaN, "subsequent": 1}}',
        b'{"type": "set_timeouts", "heartbeat": {"initial": 1e300, "subsequent": 1}}',
        b'{"type": "set_timeouts", "heartbeat": {"initial": 1' + b"0" * 19 + b', "subsequent": 1}}',
        b'{"type": "workload_control", "action": "ShutdownWorkload", "description": "\\ud800"}',
        b'{"a": [[[[[[[[[[[[[[1]]]]]]]]]]]]]]}',
    ],
)
def test_hostile_frames_are_protocol_errors(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        validate_request(decode_payload(payload))


def test_description_limit_is_in_utf8_bytes() -> None:
    ok = {"type": "workload_control", "action": "ShutdownWorkload"}
    validate_request({**ok, "description": "é" * (MAX_DESCRIPTION_BYTES // 2)})
    with pytest.raises(ProtocolError, match="UTF-8 bytes"):
        validate_request({**ok, "description": "é" * (MAX_DESCRIPTION_BYTES // 2 + 1)})


def test_a_long_non_ascii_shutdown_request_is_acknowledged_and_arrives_whole(
    make_config: MakeConfig, start_monitor: MonitorFactory, events: Events
) -> None:
    from nvrx.ft._protocol import PROTOCOL_VERSION

    proc, _ = start_monitor(make_config())
    text = "\U0001f525" * (MAX_DESCRIPTION_BYTES // 4)  # 4 UTF-8 bytes each, 12 as \\u escapes
    with _connect(proc.socket_path) as sock:
        init = {"type": "init", "v": PROTOCOL_VERSION, "rank": 0, "local_rank": 0}
        sock.sendall(_frame(json.dumps({**init, "host": "h", "stack_dump": False}).encode()))
        assert b'"ok":true' in (socket.recv_fds(sock, MAX_MESSAGE_BYTES, 1)[0])
        request = {"type": "workload_control", "action": "ShutdownWorkload", "description": text}
        sock.sendall(_frame(json.dumps(request).encode()))
        assert _read_reply(sock) == b'{"ok":true}'
        ev = events.wait("workload_control")
        assert ev.description == text


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)
_types = st.sampled_from(["init", "set_timeouts", "workload_control", "shutdown", "x", None])


@st.composite
def _frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:  # random bytes
        return _frame(draw(st.binary(max_size=200)))
    if kind == 1:  # a request-like object with random fields
        body = draw(st.dictionaries(st.text(max_size=12), _json, max_size=6))
        body["type"] = draw(_types)
        return _frame(json.dumps(body).encode())
    if kind == 2:  # deep nesting or a huge integer
        depth = draw(st.integers(1, 3000))
        return _frame(
            b'{"type": "set_timeouts", "heartbeat": ' + b"[" * depth + b"]" * depth + b"}"
        )
    digits = draw(st.integers(1, 4000))
    return _frame(b'{"type": "init", "v": 1, "rank": ' + b"7" * digits + b"}")


@pytest.fixture(scope="module")
def fuzz_monitor() -> Iterator[tuple[MonitorProcess, pathlib.Path]]:
    runtime = create_runtime_dir()
    cfg = FaultToleranceConfig(enable_gpu_monitor=False, log_level=logging.ERROR)
    proc = RankMonitorServer.run_in_subprocess(cfg, runtime / "monitor-0.sock")
    try:
        yield proc, runtime
    finally:
        proc.stop()
        for path in runtime.iterdir():
            path.unlink()
        runtime.rmdir()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frames=st.lists(_frames(), min_size=1, max_size=4))
def test_fuzzed_frames_each_get_a_reply(
    fuzz_monitor: tuple[MonitorProcess, pathlib.Path], frames: list[bytes]
) -> None:
    proc, _ = fuzz_monitor
    with _connect(proc.socket_path) as sock:
        for frame in frames:
            sock.sendall(frame)
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE_BYTES, 1)
            for fd in fds:
                os.close(fd)
            assert data, f"no reply to {frame[:80]!r}"
            reply = json.loads(data[4:])
            assert isinstance(reply.get("ok"), bool)
            if not reply["ok"]:
                assert reply["error"]
            if frame[4:5] == b"{" and b'"init"' in frame and reply["ok"]:
                break  # an accepted init: the rest of this connection is a real rank's
    assert proc.is_alive()


def test_after_fuzzing_the_monitor_still_detects(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    proc, _ = start_monitor(make_config(rank_heartbeat_timeout=0.5))
    for payload in (b"[" * 3000 + b"]" * 3000, b'{"type": "init", "v": 1, "rank": ' + b"1" * 3000):
        with _connect(proc.socket_path) as sock:
            sock.sendall(_frame(payload))
            assert b'"ok":false' in (_read_reply(sock) or b"")
    _detects_a_hung_rank(start_rank, events)


# --------------------------------------------------------- NVRx's monitor handle


def test_run_in_subprocess_has_nvrx_call_shape_and_process_handle(
    runtime_dir: pathlib.Path,
) -> None:
    cfg = FaultToleranceConfig(enable_gpu_monitor=False)
    sock = runtime_dir / "monitor-7.sock"
    proc = RankMonitorServer.run_in_subprocess(cfg, sock, False, None)
    try:
        assert sock.exists()  # returned once listening
        assert proc.is_alive()
        running_code = proc.exitcode
        assert running_code is None
        assert isinstance(proc.pid, int)
        proc.join(timeout=0.1)
        assert proc.is_alive()
        proc.terminate()
        proc.join(timeout=10)
        assert proc.exitcode == 0
        assert not proc.is_alive()
    finally:
        proc.kill()


def test_nvrx_style_standalone_monitor_with_nvrx_env_var(
    runtime_dir: pathlib.Path, tmp_path: pathlib.Path, events: Events
) -> None:
    from nvrx.ft.data import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, MONITOR_SOCKET_ENV

    assert FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR == MONITOR_SOCKET_ENV
    cfg = FaultToleranceConfig(rank_heartbeat_timeout=0.5, enable_gpu_monitor=False)
    sock = runtime_dir / "monitor-0.sock"
    proc = RankMonitorServer.run_in_subprocess(cfg, sock, events_socket=events.path)
    env = {k: v for k, v in os.environ.items() if k != MONITOR_SOCKET_ENV}
    env["FT_RANK_MONITOR_IPC_SOCKET"] = str(sock)  # what NVRx code sets by hand
    worker = pathlib.Path(__file__).with_name("rank_worker.py")
    steps = json.dumps([["init"], ["hb"], ["hang"]])
    rank = subprocess.Popen([sys.executable, str(worker), steps], env=env, start_new_session=True)
    try:
        assert events.wait("rank_terminated").pid == rank.pid
        rank.wait(timeout=30)
    finally:
        if rank.poll() is None:
            os.killpg(rank.pid, signal.SIGKILL)
            rank.wait()
        proc.stop()


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o755])
def test_socket_in_a_shared_directory_is_refused_with_a_fix(
    tmp_path: pathlib.Path, mode: int
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(PermissionError, match="create_runtime_dir") as info:
        RankMonitorServer.run_in_subprocess(FaultToleranceConfig(), shared / "m.socket")
    assert "mkdir -m 700" in str(info.value)
    assert not (shared / "m.socket").exists()


# ------------------------------------------------------------------ liveness


def test_a_stopped_monitor_stops_beating(
    make_config: MakeConfig, start_monitor: MonitorFactory
) -> None:
    proc, _ = start_monitor(make_config())
    age = proc.beat_age()
    assert age is not None
    assert age < 5.0
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        time.sleep(2.0)
        stopped = monitor_beat_age(proc.socket_path)
        assert stopped is not None
        assert stopped > 1.5
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _wait_until(lambda: (proc.beat_age() or 99.0) < 1.0)
    proc.stop()
    assert proc.beat_age() is None  # a clean stop removes the beat file


# -------------------------------------------------------------- runtime dirs


# Stale-dir cleanup (the owner lock, pid namespaces, odd names): test_runtime_dirs.py.


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make files of another user")
def test_runtime_base_that_is_another_users_symlink_is_not_used(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "xdg"
    link.symlink_to(target)
    os.lchown(link, 65534, 65534)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(link))
    made = create_runtime_dir()
    try:
        assert target not in made.parents
    finally:
        release_runtime_dir(made)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a listener as another user")
def test_client_refuses_a_monitor_of_another_user(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nvrx.ft import MONITOR_SOCKET_ENV, RankMonitorClient, RankMonitorClientError

    shared = pathlib.Path(tempfile.mkdtemp(prefix="nvrx-test-open-"))  # reachable by uid 65534
    shared.chmod(0o777)
    path = shared / "fake.sock"
    code = (
        "import os, socket, sys, time\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"s = socket.socket(socket.AF_UNIX); s.bind({str(path)!r}); s.listen(1)\n"
        "print('ready', flush=True)\n"
        "c, _ = s.accept(); time.sleep(30)\n"
    )
    fake = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert fake.stdout is not None
        assert fake.stdout.readline().strip() == "ready"
        monkeypatch.setenv(MONITOR_SOCKET_ENV, str(path))
        with pytest.raises(RankMonitorClientError, match="uid 65534"):
            RankMonitorClient().init_workload_monitoring()
    finally:
        fake.kill()
        fake.wait()
        path.unlink(missing_ok=True)
        shared.rmdir()
