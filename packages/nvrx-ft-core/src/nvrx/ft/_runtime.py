"""Private runtime directories for the sockets of one launcher."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pathlib
import re
import shutil
import stat
import tempfile

__all__ = [
    "SOCKET_PATH_MAX",
    "check_private_dir",
    "check_socket_path_length",
    "check_trusted_path",
    "create_runtime_dir",
    "release_runtime_dir",
    "remove_stale_runtime_dirs",
]

#: Longest Unix socket path Linux accepts (sun_path is 108 bytes with the NUL).
SOCKET_PATH_MAX = 107
# Room left for the longest socket name we put in the directory ("monitor-NNNN.sock.beat").
_NAME_ROOM = 24
_logger = logging.getLogger("nvrx.ft.runtime")
#: The file in every runtime directory that its owner keeps flock()ed for its lifetime.
#: flock() is held by the kernel on the open file, not by pid, so whether the owner still
#: lives can be told from any pid namespace that sees the same file system.
OWNER_LOCK_NAME = ".owner.lock"
#: Linux's PID_MAX_LIMIT (2**22): no pid is larger, on any configuration.
_PID_MAX = 1 << 22
# Lock fds of the directories this process owns, by path; closed by release_runtime_dir.
_held_locks: dict[str, int] = {}
_FIX = (
    "put the socket in a directory only you can enter: nvrx.ft.create_runtime_dir() makes "
    "one, or `mkdir -m 700 DIR`"
)


def check_trusted_path(path: str | os.PathLike[str]) -> pathlib.Path:
    """Resolve ``path`` and check that no other user can change where it leads.

    Every component of the resolved path must be owned by root or by us, and a
    component others may write to must be sticky (as /tmp is), so nobody else can
    swap a directory or symlink on the way. Returns the resolved path;
    PermissionError says which component fails and why.
    """
    resolved = pathlib.Path(os.path.realpath(path))
    me = os.getuid()
    for part in [resolved, *resolved.parents]:
        st = os.lstat(part)
        if st.st_uid not in (0, me):
            raise PermissionError(
                f"{os.fspath(path)!r}: {os.fspath(part)!r} belongs to uid {st.st_uid}; "
                "another user could redirect it"
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX and stat.S_ISDIR(st.st_mode):
            raise PermissionError(
                f"{os.fspath(path)!r}: {os.fspath(part)!r} is writable by others and not sticky"
            )
    return resolved


def check_socket_path_length(path: str | os.PathLike[str]) -> None:
    """ValueError naming ``path`` if Linux cannot bind a Unix socket there.

    The kernel's own error ("AF_UNIX path too long") would only surface inside the
    monitor process, after start-up; this says which path and how long it may be.
    """
    length = len(os.fsencode(os.fspath(path)))
    if length > SOCKET_PATH_MAX:
        raise ValueError(
            f"socket path {os.fspath(path)!r} is {length} bytes; a Unix socket path may be "
            f"at most {SOCKET_PATH_MAX}: use a shorter directory"
        )


def _usable_base(path: str | None) -> bool:
    if not path:
        return False
    try:
        resolved = check_trusted_path(path)
        st = os.stat(resolved)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.getuid()
        and os.access(resolved, os.W_OK | os.X_OK)
        and len(os.fspath(resolved)) + 1 + 32 + _NAME_ROOM <= SOCKET_PATH_MAX
    )


def _owner_pid(text: str) -> int | None:
    """The pid a runtime directory's name holds, None unless it is a possible Linux pid."""
    if len(text) > 7 or not text.isdigit():
        return None
    pid = int(text)
    return pid if 0 < pid <= _PID_MAX else None


def _owner_is_gone(path: str) -> bool:
    """True only when we could take the owner lock of directory ``path``: its owner is dead.

    A directory without the lock file (one that is being made, or made by an older
    version) or with anything odd about it is never judged gone. The lock is released
    when this returns; a directory judged gone is not used again by anyone (names are
    unique), so removing it afterwards races with nobody but another cleaner.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(path, flags | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        try:
            fd = os.open(OWNER_LOCK_NAME, flags | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError:
            return False  # no lock protocol (old format): cannot prove the owner dead
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # held: the owner lives, whichever pid namespace it is in
            return True
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def remove_stale_runtime_dirs(base: str | os.PathLike[str], prefix: str = "nvrx-") -> list[str]:
    """Remove runtime directories under ``base`` left by our launchers that are dead.

    Only directories named ``<prefix><pid>-*`` (what :func:`create_runtime_dir` makes,
    with a pid Linux could give), owned by us, private (0700) and not symlinks are
    considered, and one is removed only when its owner lock (``.owner.lock``, flock()ed
    by the owner for its lifetime) can be taken: that proves the owner dead even when
    it runs in another pid namespace (containers sharing /tmp and a uid), where its pid
    means nothing. A directory without the lock file (made by a version before the lock,
    or caught while being made) is always kept. Returns the removed paths.
    """
    pattern = re.compile(re.escape(prefix) + r"([0-9]+)-[A-Za-z0-9_]+\Z")
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or _owner_pid(match.group(1)) is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (
            not stat.S_ISDIR(st.st_mode)
            or st.st_uid != os.getuid()
            or st.st_mode & 0o077
            or entry.path in _held_locks
            or not _owner_is_gone(entry.path)
        ):
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(entry.path)  # fd-based on Linux: never follows a symlink inside
            removed.append(entry.path)
    if removed:
        _logger.info("removed runtime directories of launchers that are gone: %s", removed)
    return removed


def _take_owner_lock(path: pathlib.Path) -> int:
    """Create ``path``/.owner.lock already locked by us; returns the fd to keep open.

    The file is made and locked under a temporary name, then renamed into place, so a
    cleaner never sees the lock file unlocked while we live. The fd is close-on-exec:
    processes we exec do not hold it (a forked child that does not exec does, and then
    the directory counts as in use while that child lives, which is true).
    """
    fd, tmp = tempfile.mkstemp(prefix=".lock-", dir=path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(tmp, path / OWNER_LOCK_NAME)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd


def _close_released_locks() -> None:
    """Close the lock fds of our directories someone already removed (rmtree by hand)."""
    for path, fd in list(_held_locks.items()):
        try:
            gone = os.fstat(fd).st_nlink == 0
        except OSError:
            gone = True
        if gone:
            _held_locks.pop(path, None)
            with contextlib.suppress(OSError):
                os.close(fd)


def release_runtime_dir(path: str | os.PathLike[str]) -> None:
    """Remove a directory :func:`create_runtime_dir` made and drop its owner lock.

    Never raises: a directory already gone is fine.
    """
    where = os.fspath(path)
    shutil.rmtree(where, ignore_errors=True)
    fd = _held_locks.pop(where, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def create_runtime_dir(prefix: str = "nvrx-") -> pathlib.Path:
    """Create a new directory only this user can enter (0700), unique per call.

    It goes under ``$XDG_RUNTIME_DIR`` when that is usable (ours, writable, short
    enough for socket paths, and no component another user could redirect), else
    under the system temp dir (checked the same way, PermissionError if it fails).
    This process holds an flock() on ``.owner.lock`` in it for as long as it lives (or
    until :func:`release_runtime_dir`), so directories of launchers that died without
    removing theirs are found and removed here, and live ones are kept whatever pid
    namespace their owner is in. The caller removes the new one
    (:func:`release_runtime_dir`, or by hand).
    """
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if _usable_base(xdg):
        assert xdg is not None
        base = check_trusted_path(xdg)
    else:
        base = check_trusted_path(tempfile.gettempdir())
    _close_released_locks()
    remove_stale_runtime_dirs(base, prefix)
    path = pathlib.Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))
    try:
        os.chmod(path, 0o700)
        _held_locks[os.fspath(path)] = _take_owner_lock(path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def check_private_dir(path: str | os.PathLike[str]) -> None:
    """Raise PermissionError unless ``path`` is our directory with no group/other access."""
    where = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"socket directory {where!r} does not exist; {_FIX}") from None
    if stat.S_ISLNK(st.st_mode):
        raise PermissionError(f"socket directory {where!r} is a symlink; {_FIX}")
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{where!r} is not a directory; {_FIX}")
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"socket directory {where!r} is owned by uid {st.st_uid}, not {os.getuid()}; {_FIX}"
        )
    if st.st_mode & 0o077:
        raise PermissionError(
            f"socket directory {where!r} has mode {stat.S_IMODE(st.st_mode):o}, so other users "
            f"can reach it (NVRx's /tmp default is such a directory); {_FIX}"
        )
