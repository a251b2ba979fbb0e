"""Private runtime directories for the sockets of one launcher."""

from __future__ import annotations

import os
import pathlib
import stat
import tempfile

__all__ = ["SOCKET_PATH_MAX", "check_private_dir", "create_runtime_dir"]

#: Longest Unix socket path Linux accepts (sun_path is 108 bytes with the NUL).
SOCKET_PATH_MAX = 107
# Room left for the longest socket name we put in the directory ("monitor-NNNN.sock").
_NAME_ROOM = 24


def _usable_base(path: str | None) -> bool:
    if not path:
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.getuid()
        and os.access(path, os.W_OK | os.X_OK)
        and len(path) + 1 + 24 + _NAME_ROOM <= SOCKET_PATH_MAX
    )


def create_runtime_dir(prefix: str = "nvrx-") -> pathlib.Path:
    """Create a new directory only this user can enter (0700), unique per call.

    It goes under ``$XDG_RUNTIME_DIR`` when that is usable (ours, writable, short
    enough for socket paths), else under the system temp dir. The caller removes it.
    """
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = xdg if _usable_base(xdg) else tempfile.gettempdir()
    path = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    os.chmod(path, 0o700)
    return path


def check_private_dir(path: str | os.PathLike[str]) -> None:
    """Raise PermissionError unless ``path`` is our directory with no group/other access."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{os.fspath(path)!r} is not a directory")
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"runtime directory {os.fspath(path)!r} is owned by uid {st.st_uid}, not {os.getuid()}"
        )
    if st.st_mode & 0o077:
        raise PermissionError(
            f"runtime directory {os.fspath(path)!r} has mode {stat.S_IMODE(st.st_mode):o}; "
            "it must not be accessible to group or others (use 0700)"
        )
