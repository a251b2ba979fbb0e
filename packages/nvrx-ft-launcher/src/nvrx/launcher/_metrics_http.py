"""A small bounded HTTP server for the metrics endpoint: one thread, a few connections.

``prometheus_client.start_http_server`` starts a thread per connection with no limit and
no timeout: a local user who opens as many connections as the launcher may have file
descriptors starves the launcher of them (and of CPU). This server:

- runs one daemon thread that sleeps in ``select`` (no busy loop);
- serves at most :data:`MAX_CONNECTIONS` connections at once; at the cap it stops
  accepting, so further clients wait in the kernel's small listen backlog
  (:data:`BACKLOG`) and hold no descriptor of ours, and a flood costs no CPU here;
- gives each connection :data:`CONNECTION_TIMEOUT_S` (monotonic) from accept to the last
  byte of the reply, then closes it, so a slow or silent client frees its slot;
- reads at most :data:`MAX_REQUEST_BYTES` of request, answers ``GET``/``HEAD`` of
  ``/metrics`` (or ``/``), 404 for another path, 405 for another method, 400 for junk.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "BACKLOG",
    "CONNECTION_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "MAX_REQUEST_BYTES",
    "BoundedMetricsHTTPServer",
]

#: Connections served at once; more wait in the listen backlog.
MAX_CONNECTIONS = 4
#: The listen backlog (the kernel's queue of connections not yet accepted).
BACKLOG = 8
#: From accept to the reply's last byte; then the connection is closed.
CONNECTION_TIMEOUT_S = 5.0
#: The most request bytes read (the request line and headers).
MAX_REQUEST_BYTES = 8192
_TICK_S = 0.5  # the longest select sleep: timeouts and shutdown are noticed this fast


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    request: bytearray = field(default_factory=bytearray)
    reply: memoryview | None = None


def _response(status: str, body: bytes, content_type: str, head: bool = False) -> bytes:
    header = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    return header if head else header + body


class BoundedMetricsHTTPServer:
    """Serves ``render()`` (bytes, ``content_type``) at ``/metrics`` until :meth:`shutdown`.

    The listening socket is bound in the constructor (OSError if the address is taken);
    :meth:`serve_forever` runs the loop (in the caller's thread).
    """

    def __init__(
        self,
        addr: str,
        port: int,
        render: Callable[[], bytes],
        content_type: str,
        *,
        max_connections: int = MAX_CONNECTIONS,
        timeout_s: float = CONNECTION_TIMEOUT_S,
    ) -> None:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(sockaddr)
            self._listener.listen(BACKLOG)
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self.server_address: tuple[str, int] = self._listener.getsockname()[:2]
        self._render = render
        self._content_type = content_type
        self._max = max_connections
        self._timeout = timeout_s
        self._conns: dict[int, _Conn] = {}
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    # -- the loop ------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown`; never raises for a client's doing."""
        sel = selectors.DefaultSelector()
        try:
            sel.register(self._wake_r, selectors.EVENT_READ, None)
            listening = False
            while not self._stop.is_set():
                want_listen = len(self._conns) < self._max
                if want_listen and not listening:
                    sel.register(self._listener, selectors.EVENT_READ, None)
                    listening = True
                elif not want_listen and listening:
                    sel.unregister(self._listener)  # at the cap: the backlog holds the rest
                    listening = False
                now = time.monotonic()
                wait = _TICK_S
                if self._conns:
                    wait = min(wait, max(0.0, min(c.deadline for c in self._conns.values()) - now))
                for key, _ in sel.select(wait):
                    if key.fileobj is self._listener:
                        self._accept(sel)
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        self._service(sel, key.fd)
                now = time.monotonic()
                for fd, conn in list(self._conns.items()):
                    if now >= conn.deadline:
                        self._close(sel, fd)  # too slow: its slot goes to the next client
        finally:
            for fd in list(self._conns):
                self._close(sel, fd)
            sel.close()
            self._stopped.set()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        while len(self._conns) < self._max:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and the like: try again on the next readiness
                return
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + self._timeout)
            self._conns[sock.fileno()] = conn
            sel.register(sock, selectors.EVENT_READ, None)

    def _close(self, sel: selectors.BaseSelector, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        if conn is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _service(self, sel: selectors.BaseSelector, fd: int) -> None:
        conn = self._conns.get(fd)
        if conn is None:
            return
        try:
            if conn.reply is None:
                data = conn.sock.recv(MAX_REQUEST_BYTES + 1 - len(conn.request))
                if not data:
                    self._close(sel, fd)
                    return
                conn.request += data
                reply = self._reply_to(bytes(conn.request))
                if reply is None:
                    return  # the headers are not complete yet
                conn.reply = memoryview(reply)
                sel.modify(conn.sock, selectors.EVENT_WRITE, None)
            sent = conn.sock.send(conn.reply)
            conn.reply = conn.reply[sent:]
            if not conn.reply:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_WR)
                self._close(sel, fd)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(sel, fd)

    def _reply_to(self, request: bytes) -> bytes | None:
        """The whole reply once the request's headers are in; None while they are not."""
        end = request.find(b"\r\n\r\n")
        if end < 0:
            end = request.find(b"\n\n")
        if end < 0:
            if len(request) > MAX_REQUEST_BYTES:
                return _response("431 Request Header Fields Too Large", b"", "text/plain")
            return None
        line = request.split(b"\n", 1)[0].strip()
        parts = line.split(b" ")
        text = "text/plain; charset=utf-8"
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _response("400 Bad Request", b"bad request\n", text)
        method, target = parts[0], parts[1]
        if method not in (b"GET", b"HEAD"):
            return _response("405 Method Not Allowed", b"only GET and HEAD\n", text)
        path = target.split(b"?", 1)[0]
        if path not in (b"/metrics", b"/"):
            return _response("404 Not Found", b"not found; try /metrics\n", text)
        try:
            body = self._render()
        except Exception:  # monitoring never breaks: the scrape fails, the launcher goes on
            return _response("500 Internal Server Error", b"metrics failed\n", text)
        return _response("200 OK", body, self._content_type, head=method == b"HEAD")

    # -- stopping ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the loop and wait for it (it notices within one select)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._stopped.wait(timeout=5)

    def server_close(self) -> None:
        """Close the listening socket (after :meth:`shutdown`)."""
        for sock in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()
