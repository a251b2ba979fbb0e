"""A file whose open blocks in uninterruptible sleep (state ``D``), for tests and benchmarks.

A rank stuck on a dead NFS server sits in the kernel in state ``D``: signal handlers do
not run (no stack dump), only a fatal signal ends it. :func:`unserved_file` makes the
same on this machine without libfuse or any other dependency: a holder process opens
``/dev/fuse``, mounts it (``mount(2)`` through ctypes) and never answers the kernel's
``FUSE_INIT`` request. Until INIT is answered every request to the file system waits in
``fuse_get_req`` killably-uninterruptibly (``TASK_KILLABLE``, ``D`` in
``/proc/<pid>/stat``), so ``open(path).read()`` on a file under the mount blocks there;
SIGKILL (or any signal whose default action kills, when no handler is installed) ends it.

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
import functools
import os
import pathlib
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator

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


def _hold(mountpoint: str) -> int:
    """The holder (run as a script): mount an unserved FUSE file system, wait for stdin's end."""
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
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        os.close(fd)  # the last /dev/fuse descriptor: the kernel aborts the connection
        with contextlib.suppress(OSError):
            _libc_call(libc, "umount2", mountpoint.encode(), _MNT_DETACH)
    return 0


@contextlib.contextmanager
def unserved_file() -> Iterator[pathlib.Path]:
    """A path whose ``open`` blocks in state ``D`` until the block ends.

    On exit the connection is aborted (a reader still blocked gets an error) and the
    holder is gone; raises OSError when the mount cannot be made.
    """
    mountpoint = tempfile.mkdtemp(prefix="nvrx-dstate-")
    holder = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), mountpoint],
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
    sys.exit(_hold(sys.argv[1]))
