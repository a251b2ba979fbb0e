"""The rank-to-monitor control channel: length-prefixed JSON frames over a Unix socket.

A frame is a 4-byte big-endian payload length, then that many bytes of UTF-8 JSON
holding one object with a ``type``. Nothing is ever unpickled. The limits are stated
here once and used by both sides: a frame over :data:`MAX_MESSAGE_BYTES` is rejected
before it is read; JSON nested deeper than :data:`MAX_JSON_DEPTH`, integers of more
than :data:`MAX_INT_DIGITS` digits and NaN/Infinity are rejected while parsing; a
duration over :data:`nvrx.ft.data.MAX_DURATION_S` or a workload control description of
more than :data:`MAX_DESCRIPTION_BYTES` UTF-8 bytes is refused. Every request gets a
reply (an error reply for a bad one).

The hot path (heartbeats, sections) does not use this channel: it is a shared memory
block whose file descriptor the monitor hands over in its reply to ``init``
(see :mod:`nvrx.ft._shm`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import struct
from typing import Any

from nvrx.ft.data import MAX_DURATION_S

__all__ = [
    "MAX_DESCRIPTION_BYTES",
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "MAX_MESSAGE_BYTES",
    "PROTOCOL_VERSION",
    "FrameReader",
    "ProtocolError",
    "decode_payload",
    "encode_frame",
    "recv_frame",
    "validate_request",
]

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024
#: Deepest nesting of JSON objects/arrays in a frame (real messages use 3 levels).
MAX_JSON_DEPTH = 8
#: Most digits of a JSON integer (an int64 has 19).
MAX_INT_DIGITS = 20
#: Longest workload control description, in UTF-8 bytes. A monitor event carrying it
#: stays within nvrx.ft._events.MAX_EVENT_BYTES, which the launcher's reader accepts.
MAX_DESCRIPTION_BYTES = 4096
_INT64 = 2**63
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """A frame or message that does not follow the protocol."""


def encode_frame(message: dict[str, Any]) -> bytes:
    """One frame holding ``message`` as JSON."""
    payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(payload) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(payload)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return _HEADER.pack(len(payload)) + payload


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ProtocolError(f"integer of {len(text)} digits exceeds {MAX_INT_DIGITS}")
    return int(text)


def _parse_constant(name: str) -> float:
    raise ProtocolError(f"{name} is not allowed")


def _too_deep(value: object) -> bool:
    """True when objects/arrays nest deeper than MAX_JSON_DEPTH."""
    level: list[object] = [value]
    for _ in range(MAX_JSON_DEPTH + 1):
        below: list[object] = []
        for item in level:
            if isinstance(item, dict):
                below.extend(item.values())
            elif isinstance(item, list):
                below.extend(item)
        if not below:
            return False
        level = below
    return True


def decode_payload(payload: bytes) -> dict[str, Any]:
    """The JSON object in one frame's payload; anything over the limits is a ProtocolError."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"payload is not UTF-8: {exc}") from None
    try:
        message = json.loads(text, parse_int=_parse_int, parse_constant=_parse_constant)
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise ProtocolError(f"payload is not JSON: {exc}") from None
    if _too_deep(message):
        raise ProtocolError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(message, dict):
        raise ProtocolError(f"payload is a JSON {type(message).__name__}, not an object")
    return message


class FrameReader:
    """Splits a byte stream into frames. An oversized length is a ProtocolError."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the payloads of every frame now complete."""
        self._buffer += data
        payloads: list[bytes] = []
        while len(self._buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer)
            if length > MAX_MESSAGE_BYTES:
                raise ProtocolError(f"frame of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            payloads.append(bytes(self._buffer[_HEADER.size : end]))
            del self._buffer[:end]
        return payloads


def recv_frame(sock: socket.socket, *, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """Read one frame from a blocking socket; also return file descriptors sent with it."""
    reader = FrameReader()
    fds: list[int] = []
    while True:
        if max_fds and not fds:
            data, new_fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE_BYTES, max_fds)
            fds.extend(new_fds)
        else:
            data = sock.recv(MAX_MESSAGE_BYTES)
        if not data:
            for fd in fds:
                _close_quietly(fd)
            raise ConnectionError("connection closed before a whole frame arrived")
        frames = reader.feed(data)
        if frames:
            if len(frames) > 1 or reader.pending:
                raise ProtocolError("more than one reply arrived")
            return decode_payload(frames[0]), fds


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _number(message: dict[str, Any], key: str, *, optional: bool) -> float | None:
    value = message.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"{key!r} must be a number, got {value!r:.40}")
    seconds = float(value)  # ints are at most MAX_INT_DIGITS digits: no overflow
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_DURATION_S:
        raise ProtocolError(
            f"{key!r} must be a finite number of seconds in (0, {MAX_DURATION_S:.0f}], "
            f"got {value!r:.40}"
        )
    return seconds


def _int(message: dict[str, Any], key: str) -> int:
    value = message.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT64 <= value < _INT64:
        raise ProtocolError(f"{key!r} must be a 64-bit integer, got {value!r:.40}")
    return value


def _str(message: dict[str, Any], key: str, limit: int = 4096) -> str:
    value = message.get(key)
    try:
        ok = isinstance(value, str) and len(value.encode("utf-8")) <= limit
    except UnicodeEncodeError:  # a lone surrogate ("\ud800") is not text
        ok = False
    if not ok:
        raise ProtocolError(f"{key!r} must be valid text of at most {limit} UTF-8 bytes")
    assert isinstance(value, str)
    return value


def _exact_keys(message: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(message) - allowed - {"type"})
    if extra:
        raise ProtocolError(f"unexpected keys for {message.get('type')!r}: {extra}")


def validate_request(message: dict[str, Any]) -> dict[str, Any]:
    """Check a rank's request against the schema; return it or raise ProtocolError.

    Requests: ``init`` (rank, local_rank, host, stack_dump), ``set_timeouts``
    (heartbeat and/or section timeouts), ``workload_control`` (action, description),
    ``shutdown``.
    """
    kind = message.get("type")
    if kind == "init":
        _exact_keys(message, {"v", "rank", "local_rank", "host", "stack_dump"})
        if message.get("v") != PROTOCOL_VERSION:
            raise ProtocolError(f"unsupported protocol version {message.get('v')!r}")
        _int(message, "rank")
        _int(message, "local_rank")
        _str(message, "host", 256)
        if not isinstance(message.get("stack_dump"), bool):
            raise ProtocolError("'stack_dump' must be a bool")
    elif kind == "set_timeouts":
        _exact_keys(message, {"heartbeat", "section"})
        hb = message.get("heartbeat")
        if hb is not None:
            if not isinstance(hb, dict):
                raise ProtocolError("'heartbeat' must be an object or null")
            _exact_keys({"type": None, **hb}, {"initial", "subsequent"})
            _number(hb, "initial", optional=True)
            _number(hb, "subsequent", optional=True)
        sec = message.get("section")
        if sec is not None:
            if not isinstance(sec, dict):
                raise ProtocolError("'section' must be an object or null")
            _exact_keys({"type": None, **sec}, {"section", "out_of_section"})
            _number(sec, "out_of_section", optional=True)
            sections = sec.get("section")
            if not isinstance(sections, dict) or len(sections) > 256:
                raise ProtocolError("'section.section' must be an object of at most 256 sections")
            for name in sections:
                _number(sections, name, optional=True)
        if hb is None and sec is None:
            raise ProtocolError("'set_timeouts' carries neither heartbeat nor section timeouts")
    elif kind == "workload_control":
        _exact_keys(message, {"action", "description"})
        _str(message, "action", 64)
        _str(message, "description", MAX_DESCRIPTION_BYTES)
    elif kind == "shutdown":
        _exact_keys(message, set())
    else:
        raise ProtocolError(f"unknown request type {kind!r}")
    return message
