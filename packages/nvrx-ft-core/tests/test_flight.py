"""The flight-recorder server and reader on a real one-rank gloo process group."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket

import pytest

from nvrx.ft._flight import (
    CollectiveState,
    TraceFetch,
    fetch_trace,
    start_trace_server,
    stop_trace_server,
    summarize_trace,
    trace_socket_path,
)

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_rank_serves_its_flight_recorder_and_the_reader_summarises_it() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        path = start_trace_server()
        assert path == trace_socket_path(os.getpid())
        assert start_trace_server() is None  # once per process
        for _ in range(3):
            dist.all_reduce(torch.ones(2))
        dist.broadcast(torch.ones(2), src=0)
        data = fetch_trace(os.getpid(), timeout_s=10.0)
        assert data is not None
        assert summarize_trace(data) == CollectiveState("broadcast", "default_pg", 4, False)
        assert TraceFetch(os.getpid(), timeout_s=10.0).result(10.0) == CollectiveState(
            "broadcast", "default_pg", 4, False
        )
    finally:
        stop_trace_server()
        dist.destroy_process_group()
    assert not os.path.exists(trace_socket_path(os.getpid()))
    assert fetch_trace(os.getpid(), timeout_s=1.0) is None  # no server: no answer, no error


def test_a_process_without_a_server_gives_none() -> None:
    assert fetch_trace(os.getpid(), timeout_s=0.5) is None
    assert TraceFetch(2**22 + 12345, timeout_s=0.5).result(2.0) is None


def test_a_directory_others_can_write_is_refused(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = os.path.dirname(trace_socket_path(os.getpid()))
    os.makedirs(shared)
    os.chmod(shared, 0o777)
    assert fetch_trace(os.getpid(), timeout_s=0.5) is None
    import torch  # noqa: F401  (the server starts only in a process that imported torch)

    assert start_trace_server() == f"!{shared} is not a private directory of this user"


def test_a_slow_answer_is_waited_for_until_the_fetch_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a loaded host a rank's server may answer after the monitor's stack-dump pause;
    # the monitor then waits out the fetch's own timeout rather than drop the evidence.
    import json
    import tempfile
    import threading
    import time

    short = tempfile.mkdtemp(prefix="fr-", dir="/tmp")  # AF_UNIX paths are short
    monkeypatch.setattr(tempfile, "tempdir", short)
    pid = 2**22 + 4321  # no such process: only the socket path matters
    path = trace_socket_path(pid)
    os.makedirs(os.path.dirname(path), mode=0o700)
    entry = {
        "record_id": 7,
        "profiling_name": "gloo:all_reduce",
        "process_group": ["0", "default_pg"],
        "collective_seq_id": 4,
        "retired": False,
    }
    body = json.dumps({"entries": [entry]}).encode()
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(2)

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                time.sleep(0.8)
                conn.sendall(reply)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        want = CollectiveState("all_reduce", "default_pg", 4, True)
        early = TraceFetch(pid, timeout_s=5.0)
        assert early.result(0.2) is None  # not yet: a fixed short wait drops it
        assert early.result() == want  # the answer came within the fetch's timeout
        started = time.monotonic()
        assert TraceFetch(pid, timeout_s=5.0).result() == want
        assert time.monotonic() - started < 4.0  # returned with the answer, not at the timeout
    finally:
        listener.close()
        server.join(5.0)
        shutil.rmtree(short, ignore_errors=True)
