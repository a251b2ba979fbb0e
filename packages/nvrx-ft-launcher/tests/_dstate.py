"""A file whose read blocks in uninterruptible sleep (state ``D``), for tests and benchmarks.

A rank stuck on a dead NFS server sits in the kernel in state ``D``: signal handlers do
not run (no stack dump), only a fatal signal ends it. :func:`unserved_file` makes the
same on this machine without libfuse or any other dependency: a holder process opens
``/dev/fuse`` and mounts it (``mount(2)`` through ctypes), then serves a one-file file
system through the kernel's FUSE protocol but never answers a READ. The file's reads go
through the page cache, sent asynchronously (``FUSE_ASYNC_READ``), so ``read(2)`` waits
for the page's lock in ``folio_wait_bit_common``, killably-uninterruptibly
(``TASK_KILLABLE``, ``D`` in ``/proc/<pid>/stat``), as a read from a dead NFS server
does. With ``blocks_in="open"`` the holder answers nothing, not even ``FUSE_INIT``: the
open's lookup then waits in ``fuse_get_req``, also killable, also ``D``. SIGKILL (or any
signal whose default action kills, when no handler is installed) ends either wait.

The mount lives in the holder's own mount namespace (``unshare(CLONE_NEWNS)``, mounts
made private first), so nothing else on the machine (``df``, file walkers) ever sees it
and stalls; readers reach it through ``/proc/<holder>/root``. Teardown cannot be missed:
closing the holder's ``/dev/fuse`` descriptor aborts the connection (every waiter gets
ENOTCONN), and the holder closes it when its stdin ends, when it is killed, or when the
process that started it dies (``PR_SET_PDEATHSIG``); its namespace, and the mount with
it, goes when it exits.

Needs root (CAP_SYS_ADMIN for the namespace and the mount) and ``/dev/fuse``;
:func:`unavailable_reason` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import pathlib
import select
import signal
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Literal

__all__ = ["available", "proc_state", "unavailable_reason", "unserved_file"]

_CLONE_NEWNS = 0x00020000
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_REC = 1 << 14
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1
_READY_TIMEOUT_S = 20.0
_EXIT_TIMEOUT_S = 10.0


def _libc_call(libc: ctypes.CDLL, name: str, *args: object) -> None:
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


_IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, ...
_OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
_ATTR = struct.Struct("<6Q10I")  # ino, size, blocks, a/m/ctime, their nsec, mode, nlink, ...
_INIT_OUT = struct.Struct("<4I2H2I2H2IH22x")  # protocol 7.31 and later: 64 bytes
_ENTRY_OUT = struct.Struct("<4Q2I")  # nodeid, generation, entry/attr valid (s, ns); + attr
_ATTR_OUT = struct.Struct("<QII")  # attr valid (s, ns), dummy; + attr
_OPEN_OUT = struct.Struct("<QII")  # fh, open flags (0: through the page cache), padding
_LOOKUP, _FORGET, _GETATTR, _OPEN, _READ, _RELEASE, _FLUSH, _INIT = 1, 2, 3, 14, 15, 18, 25, 26
_BATCH_FORGET = 42
_FUSE_ASYNC_READ = 1
_ROOT, _FILE = 1, 2
_FILE_SIZE = 1 << 20
_REQUEST_BUFFER = 1 << 20


def _attr(node: int) -> bytes:
    if node == _ROOT:
        return _ATTR.pack(_ROOT, 0, 0, 0, 0, 0, 0, 0, 0, stat.S_IFDIR | 0o755, 2, 0, 0, 0, 4096, 0)
    return _ATTR.pack(
        _FILE, _FILE_SIZE, _FILE_SIZE // 512, 0, 0, 0, 0, 0, 0, stat.S_IFREG | 0o444, 1, 0, 0, 0,
        4096, 0,
    )  # fmt: skip


def _answer(opcode: int, nodeid: int, body: bytes) -> tuple[int, bytes] | None:
    """The answer (errno, payload) to one FUSE request; None: no answer (FORGET, and READ:
    the hang). One read-only file, ``data``, in the root; everything else is ENOSYS."""
    if opcode in (_FORGET, _BATCH_FORGET, _READ):
        return None
    if opcode == _INIT:
        max_readahead = struct.unpack_from("<I", body, 8)[0]
        # Reads go through the page cache and are sent asynchronously (FUSE_ASYNC_READ):
        # the reader waits on the page's lock, killably, state D.
        init = (7, 31, max_readahead, _FUSE_ASYNC_READ, 16, 12, 1 << 17, 1, 32, 0, 0, 0, 0)
        return 0, _INIT_OUT.pack(*init)
    if opcode == _LOOKUP:
        if nodeid != _ROOT or body.split(b"\0", 1)[0] != b"data":
            return -errno.ENOENT, b""
        return 0, _ENTRY_OUT.pack(_FILE, 1, 3600, 3600, 0, 0) + _attr(_FILE)
    if opcode == _GETATTR and nodeid in (_ROOT, _FILE):
        return 0, _ATTR_OUT.pack(3600, 0, 0) + _attr(nodeid)
    if opcode == _OPEN:
        return 0, _OPEN_OUT.pack(1, 0, 0)
    if opcode in (_FLUSH, _RELEASE):
        return 0, b""
    return -errno.ENOSYS, b""


def _serve(fd: int, stop: int) -> None:
    """Answer the kernel's requests on ``fd`` (never a READ) until ``stop`` reaches its end."""
    while True:
        ready, _, _ = select.select([fd, stop], [], [])
        if stop in ready and not os.read(stop, 4096):
            return
        if fd not in ready:
            continue
        try:
            request = os.read(fd, _REQUEST_BUFFER)
        except OSError as exc:
            if exc.errno == errno.ENODEV:  # unmounted
                return
            continue  # ENOENT: the request was interrupted meanwhile
        length, opcode, unique, nodeid, *_ = _IN_HEADER.unpack_from(request)
        answer = _answer(opcode, nodeid, request[_IN_HEADER.size : length])
        if answer is not None:
            error, payload = answer
            with contextlib.suppress(OSError):  # ENOENT: the request is gone
                os.write(
                    fd, _OUT_HEADER.pack(_OUT_HEADER.size + len(payload), error, unique) + payload
                )


def _hold(mountpoint: str, blocks_in: str) -> int:
    """The holder (run as a script): mount the FUSE file system, serve it (``read``) or not
    (``open``) until stdin ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        _libc_call(libc, "prctl", _PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        _libc_call(libc, "unshare", _CLONE_NEWNS)
        _libc_call(libc, "mount", None, b"/", None, _MS_REC | _MS_PRIVATE, None)
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
        _libc_call(
            libc, "mount", b"nvrx-dstate", mountpoint.encode(), b"fuse", _MS_NOSUID | _MS_NODEV,
            options,
        )  # fmt: skip
    except OSError as exc:
        print(f"error {exc}", flush=True)
        return 1
    print("ready", flush=True)
    try:
        if blocks_in == "read":
            _serve(fd, sys.stdin.fileno())
        else:
            while sys.stdin.buffer.read(4096):
                pass
    finally:
        os.close(fd)  # the last /dev/fuse descriptor: the kernel aborts the connection
        with contextlib.suppress(OSError):
            _libc_call(libc, "umount2", mountpoint.encode(), _MNT_DETACH)
    return 0


@contextlib.contextmanager
def unserved_file(blocks_in: Literal["read", "open"] = "read") -> Iterator[pathlib.Path]:
    """A path whose ``open(path).read()`` blocks in state ``D`` until the block ends.

    ``read``: the open succeeds and ``read(2)`` blocks (the server never answers READ);
    ``open``: the open's lookup blocks (the server never answers INIT). On exit the
    connection is aborted (a reader still blocked gets an error) and the holder is gone;
    raises OSError when the mount cannot be made.
    """
    mountpoint = tempfile.mkdtemp(prefix="nvrx-dstate-")
    holder = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), mountpoint, blocks_in],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert holder.stdout is not None
        ready, _, _ = select.select([holder.stdout], [], [], _READY_TIMEOUT_S)
        line = holder.stdout.readline().decode(errors="replace").strip() if ready else ""
        if line != "ready":
            raise OSError(f"the FUSE holder did not mount: {line or 'no answer'}")
        yield pathlib.Path(f"/proc/{holder.pid}/root{mountpoint}/data")
    finally:
        if holder.stdin is not None:
            with contextlib.suppress(OSError):
                holder.stdin.close()
        try:
            holder.wait(timeout=_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            holder.kill()  # its exit closes the descriptor: the connection aborts
            holder.wait(timeout=_EXIT_TIMEOUT_S)
        if holder.stdout is not None:
            holder.stdout.close()
        with contextlib.suppress(OSError):
            os.rmdir(mountpoint)


def proc_state(pid: int) -> str | None:
    """Process ``pid``'s scheduler state letter from /proc (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            raw = stream.read()
    except OSError:
        return None
    fields = raw.rpartition(b")")[2].split()
    return fields[0].decode() if fields else None


@functools.cache
def unavailable_reason() -> str | None:
    """Why :func:`unserved_file` cannot work here (None: it can; a mount was tried)."""
    if not sys.platform.startswith("linux"):
        return "needs Linux"
    if os.geteuid() != 0:
        return "needs root (a FUSE mount in a private mount namespace)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        with open("/proc/filesystems") as stream:
            if "fuse" not in stream.read().split():
                return "the kernel has no fuse file system"
        with unserved_file():
            pass
    except OSError as exc:
        return f"cannot mount FUSE: {exc}"
    return None


def available() -> bool:
    """True when a D-state read can be made here."""
    return unavailable_reason() is None


if __name__ == "__main__":
    sys.exit(_hold(sys.argv[1], sys.argv[2]))
