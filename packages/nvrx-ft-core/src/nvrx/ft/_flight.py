"""Where a rank is in its collectives, from torch.distributed's flight recorder.

PyTorch records every collective of a process group (gloo on CPU, NCCL on GPU) in a ring
buffer, the flight recorder (``TORCH_FR_BUFFER_SIZE``, formerly
``TORCH_NCCL_TRACE_BUFFER_SIZE``). A rank blocked in a collective holds the GIL-free
C++ side only, so its buffer can be read while it hangs, but not from Python inside the
rank: its main thread never returns to the interpreter. torch's ``_WorkerServer`` serves
the buffer from C++ threads over a Unix socket; the rank starts one at
``init_workload_monitoring`` (:func:`start_trace_server`) and its monitor asks it for the
buffer when it detects a hang, before signalling the rank (:func:`fetch_trace`), then
keeps only the rank's latest collective (:func:`summarize_trace`). A stopped rank
(SIGSTOP) cannot answer: its monitor times out and the launcher relies on its peers.

Nothing here raises into the training loop or blocks the monitor past its timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import stat
import sys
import tempfile
import threading
import time
from typing import Any

__all__ = [
    "CollectiveState",
    "TraceFetch",
    "fetch_trace",
    "start_trace_server",
    "stop_trace_server",
    "summarize_trace",
    "trace_socket_path",
]

#: Most bytes of a flight-recorder dump read back (2000 entries are about 1 MiB).
MAX_TRACE_BYTES = 8 * 1024 * 1024
_MAX_TEXT = 120
_REQUEST = (
    b"POST /handler/fr_trace_json HTTP/1.1\r\nHost: localhost\r\n"
    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
)


@dataclasses.dataclass(frozen=True)
class CollectiveState:
    """A rank's latest collective in its flight recorder.

    ``op`` is the operation (``all_reduce``), ``group`` the process group's description
    (``default_pg``) or name, ``seq`` its sequence number in that group (1 for the
    group's first collective; point-to-point operations count separately) and
    ``pending`` whether the rank had not finished it (it is waiting in it).
    """

    op: str
    group: str
    seq: int
    pending: bool

    def describe(self) -> str:
        """'all_reduce #5 on default_pg'."""
        return f"{self.op} #{self.seq} on {self.group}"

    def to_json(self) -> dict[str, Any]:
        """The event form (see :func:`from_json`)."""
        return {"op": self.op, "group": self.group, "seq": self.seq, "pending": self.pending}

    @classmethod
    def from_json(cls, value: object) -> CollectiveState:
        """Parse the event form; ValueError says what is wrong."""
        if not isinstance(value, dict) or set(value) != {"op", "group", "seq", "pending"}:
            raise ValueError(f"collective {value!r} is not {{op, group, seq, pending}}")
        op, group, seq, pending = value["op"], value["group"], value["seq"], value["pending"]
        for name, text in (("op", op), ("group", group)):
            if not isinstance(text, str) or not text or len(text) > _MAX_TEXT:
                raise ValueError(f"collective {name} {text!r} is not a short string")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2**63:
            raise ValueError(f"collective seq {seq!r} is not a count")
        if not isinstance(pending, bool):
            raise ValueError(f"collective pending {pending!r} is not a boolean")
        return cls(op, group, seq, pending)


def _entry_state(entry: dict[str, Any]) -> CollectiveState | None:
    name = entry.get("profiling_name")
    group = entry.get("process_group")
    if not isinstance(name, str) or not name:
        return None
    op = name.rsplit(":", 1)[-1][:_MAX_TEXT] or name[:_MAX_TEXT]
    label = "?"
    if isinstance(group, list) and group:
        desc = group[1] if len(group) > 1 and isinstance(group[1], str) else ""
        if not desc or desc == "undefined":  # a new_group() without group_desc
            desc = f"group {group[0]}"
        label = desc[:_MAX_TEXT]
    seq_key = "p2p_seq_id" if entry.get("is_p2p") else "collective_seq_id"
    seq = entry.get(seq_key)
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2**63:
        seq = 0
    return CollectiveState(op, label, seq, pending=not bool(entry.get("retired", True)))


def summarize_trace(data: bytes | str) -> CollectiveState | None:
    """The rank's latest collective in a ``fr_trace_json`` dump; None without one.

    The latest unfinished entry when there is one (the collective the rank waits in),
    else the latest entry (the last collective it finished).
    """
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    entries = body.get("entries") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return None
    records = [e for e in entries if isinstance(e, dict)]

    def order(e: dict[str, Any]) -> int:
        rid = e.get("record_id")
        return rid if isinstance(rid, int) and not isinstance(rid, bool) else -1

    records.sort(key=order)
    pending = [e for e in records if e.get("retired") is False]
    for entry in reversed(pending or records):
        state = _entry_state(entry)
        if state is not None:
            return state
    return None


def trace_socket_path(pid: int) -> str:
    """Where rank ``pid`` serves its flight recorder (same for the rank and its monitor)."""
    return os.path.join(tempfile.gettempdir(), f"nvrx-fr-{os.getuid()}", f"{pid}.sock")


_server: Any = None


def _private_dir(path: str) -> bool:
    """True when ``path`` is a real directory of ours that no one else can write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def start_trace_server() -> str | None:
    """Serve this rank's flight recorder; returns the socket path or why not (``!...``).

    Only when torch is already imported (a rank that uses torch.distributed has), so
    the monitoring client never pays torch's import.
    """
    global _server
    if _server is not None:
        return None
    if "torch" not in sys.modules:
        return "!torch is not imported"
    try:
        from torch._C._distributed_c10d import _WorkerServer
    except (ImportError, AttributeError) as exc:
        return f"!torch has no worker server: {exc}"
    path = trace_socket_path(os.getpid())
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if not _private_dir(os.path.dirname(path)):
            return f"!{os.path.dirname(path)} is not a private directory of this user"
        if os.path.lexists(path):
            os.unlink(path)
        _server = (_WorkerServer(path), path)
    except (OSError, RuntimeError) as exc:
        return f"!{exc}"
    return path


def stop_trace_server() -> None:
    """Stop serving (at shutdown); never raises."""
    global _server
    if _server is None:
        return
    server, path = _server
    _server = None
    # A worker server that failed to stop changes nothing for the rank.
    with contextlib.suppress(Exception):
        server.shutdown()
    with contextlib.suppress(OSError):
        os.unlink(path)


def _http_body(raw: bytes) -> bytes | None:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1.") or head.split(b" ", 2)[1:2] != [b"200"]:
        return None
    if b"transfer-encoding: chunked" not in head.lower():
        return body
    out, rest = bytearray(), body
    while rest:
        size_line, sep, rest = rest.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            return None
        if not sep or size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2 :]
    return bytes(out)


def fetch_trace(pid: int, timeout_s: float = 1.0) -> bytes | None:
    """Rank ``pid``'s flight-recorder dump (JSON bytes), or None within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    path = trace_socket_path(pid)
    if not _private_dir(os.path.dirname(path)):
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(_REQUEST)
            chunks, size = [], 0
            while size <= MAX_TRACE_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            else:
                return None
    except OSError:
        return None
    return _http_body(b"".join(chunks))


class TraceFetch:
    """Read a rank's flight recorder in a daemon thread (the monitor's loop never waits
    for it longer than the fetch's own timeout)."""

    def __init__(self, pid: int, timeout_s: float = 1.0) -> None:
        self._state: CollectiveState | None = None
        self._deadline = time.monotonic() + timeout_s
        self._thread = threading.Thread(
            target=self._run, args=(pid, timeout_s), name="nvrx-fr-fetch", daemon=True
        )
        self._thread.start()

    def _run(self, pid: int, timeout_s: float) -> None:
        try:
            data = fetch_trace(pid, timeout_s)
            self._state = None if data is None else summarize_trace(data)
        except Exception:  # evidence is optional: none is an answer
            self._state = None

    def result(self, wait_s: float | None = None) -> CollectiveState | None:
        """The summary, waiting at most ``wait_s`` more (None: until the fetch's own
        timeout, counted from its start); None when not (yet) read.

        An answer normally comes in milliseconds; on a loaded host a rank's server can
        take longer than the monitor's pause for the stack dump, and waiting out the
        fetch's timeout then keeps the evidence instead of dropping it."""
        left = self._deadline - time.monotonic() if wait_s is None else wait_s
        self._thread.join(max(0.0, left))
        return None if self._thread.is_alive() else self._state
