"""The metrics endpoint's own server: bounded connections, per-connection timeouts, one
thread, 4xx for what is not a scrape."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from nvrx.launcher._metrics_http import BoundedMetricsHTTPServer

pytestmark = pytest.mark.timeout(60)

BODY = b"nvrx_up 1.0\n"


@pytest.fixture
def server() -> Iterator[BoundedMetricsHTTPServer]:
    srv = BoundedMetricsHTTPServer(
        "127.0.0.1", 0, lambda: BODY, "text/plain", max_connections=2, timeout_s=1.0
    )
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
        assert not thread.is_alive()


def _ask(srv: BoundedMetricsHTTPServer, request: bytes, timeout: float = 20.0) -> bytes:
    with socket.create_connection(srv.server_address, timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"200"),
        (b"GET / HTTP/1.0\r\n\r\n", b"200"),
        (b"GET /metrics?x=1 HTTP/1.1\r\n\r\n", b"200"),
        (b"GET /other HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"garbage\r\n\r\n", b"400"),
        (b"\x00\xff\xfe junk \r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000, b"431"),
    ],
)
def test_answers(server: BoundedMetricsHTTPServer, request_bytes: bytes, status: bytes) -> None:
    reply = _ask(server, request_bytes)
    assert reply.split(b" ", 2)[1] == status, reply[:200]
    if status == b"200":
        assert reply.endswith(b"\r\n\r\n" + BODY)


def test_head_has_no_body(server: BoundedMetricsHTTPServer) -> None:
    reply = _ask(server, b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert reply.endswith(b"\r\n\r\n")
    assert f"Content-Length: {len(BODY)}".encode() in reply


def test_a_silent_client_is_closed_after_its_timeout(server: BoundedMetricsHTTPServer) -> None:
    with socket.create_connection(server.server_address, timeout=20) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the end of the headers
        assert sock.recv(100) == b""  # the server gave up on it


def test_connections_beyond_the_cap_wait_and_take_no_thread(
    server: BoundedMetricsHTTPServer,
) -> None:
    threads = threading.active_count()
    silent = [socket.create_connection(server.server_address, timeout=20) for _ in range(30)]
    try:
        assert threading.active_count() == threads  # one thread serves them all
        # A scrape behind 30 silent clients is answered once their slots time out.
        reply = _ask(server, b"GET /metrics HTTP/1.1\r\n\r\n", timeout=40)
        assert reply.startswith(b"HTTP/1.1 200 OK")
    finally:
        for sock in silent:
            sock.close()
    assert _ask(server, b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200 OK")


def test_a_render_error_is_a_500_and_the_server_goes_on() -> None:
    def broken() -> bytes:
        raise RuntimeError("boom")

    srv = BoundedMetricsHTTPServer("127.0.0.1", 0, broken, "text/plain")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        assert _ask(srv, b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 500")
        assert _ask(srv, b"GET /x HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404")
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
