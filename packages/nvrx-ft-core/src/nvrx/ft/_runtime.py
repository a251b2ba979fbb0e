"""Private runtime directories for the sockets of one launcher."""

from __future__ import annotations

import contextlib
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
    "remove_stale_runtime_dirs",
]

#: Longest Unix socket path Linux accepts (sun_path is 108 bytes with the NUL).
SOCKET_PATH_MAX = 107
# Room left for the longest socket name we put in the directory ("monitor-NNNN.sock.beat").
_NAME_ROOM = 24
_logger = logging.getLogger("nvrx.ft.runtime")
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not a dead launcher of ours
    return True


def remove_stale_runtime_dirs(base: str | os.PathLike[str], prefix: str = "nvrx-") -> list[str]:
    """Remove runtime directories under ``base`` left by our launchers that are dead.

    Only directories named ``<prefix><pid>-*`` (what :func:`create_runtime_dir` makes),
    owned by us, private (0700), not symlinks, whose pid is no longer running are
    removed (a SIGKILLed launcher cannot remove its own). Returns the removed paths.
    """
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[A-Za-z0-9_]+\Z")
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (
            not stat.S_ISDIR(st.st_mode)
            or st.st_uid != os.getuid()
            or st.st_mode & 0o077
            or _pid_alive(int(match.group(1)))
        ):
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(entry.path)  # fd-based on Linux: never follows a symlink inside
            removed.append(entry.path)
    if removed:
        _logger.info("removed runtime directories of launchers that are gone: %s", removed)
    return removed


def create_runtime_dir(prefix: str = "nvrx-") -> pathlib.Path:
    """Create a new directory only this user can enter (0700), unique per call.

    It goes under ``$XDG_RUNTIME_DIR`` when that is usable (ours, writable, short
    enough for socket paths, and no component another user could redirect), else
    under the system temp dir (checked the same way, PermissionError if it fails).
    Its name carries our pid, so directories of launchers that died without removing
    theirs are removed here. The caller removes the new one.
    """
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if _usable_base(xdg):
        assert xdg is not None
        base = check_trusted_path(xdg)
    else:
        base = check_trusted_path(tempfile.gettempdir())
    remove_stale_runtime_dirs(base, prefix)
    path = pathlib.Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))
    os.chmod(path, 0o700)
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
