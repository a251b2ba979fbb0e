"""Reading a JSON file that another process wrote, without trusting it.

The cycle-info and straggler-scores files are written by one process and read by
another; the reader must not hang on a FIFO put in the file's place, read an unbounded
amount, or accept what JSON does not allow. One function does that for both.
"""

from __future__ import annotations

import errno
import json
import os
import stat

__all__: list[str] = []


def _refuse_constant(name: str) -> float:
    raise ValueError(f"holds {name}, which JSON does not allow")


def check_file(st: os.stat_result, owner_uid: int | None) -> None:
    """A regular file, of ``owner_uid``'s when given (nobody else's content); else ValueError."""
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if owner_uid is not None and st.st_uid != owner_uid:
        raise ValueError(f"owned by uid {st.st_uid}, not by this process's user ({owner_uid})")


def read_json_file(
    path: str | os.PathLike[str],
    max_bytes: int,
    *,
    follow_links: bool = True,
    owner_uid: int | None = None,
) -> object:
    """The parsed JSON document at ``path``.

    ``ValueError`` says why it cannot be used (a symbolic link when ``follow_links`` is
    False, not a regular file, not owned by ``owner_uid`` when given, more than
    ``max_bytes``, not valid JSON, NaN or Infinity); ``OSError`` when it cannot be read.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO never blocks the open
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(os.fspath(path), flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise ValueError("a symbolic link") from None
        raise
    try:
        check_file(os.fstat(fd), owner_uid)
        with os.fdopen(fd, "rb", closefd=False) as stream:
            raw = stream.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes")
    try:
        document: object = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"not valid JSON: {exc}") from None
    return document
