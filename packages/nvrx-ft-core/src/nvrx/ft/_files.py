"""Writing a state or config file so that no reader ever sees half of it.

A rank killed mid-write (the very thing nvrx exists for) must leave either the old file
or the new one. The text goes to a temporary file in the same directory, is flushed to
disk, and replaces the target with one ``rename``; the directory entry is then synced
where the file system allows it.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile

__all__ = ["write_file_atomically"]


def write_file_atomically(
    path: str | os.PathLike[str], text: str, *, mode: int = 0o644, durable: bool = True
) -> None:
    """Replace ``path`` with ``text`` (UTF-8) in one step; the directory must exist.

    ``durable=False`` skips both fsyncs (file and directory): readers still never see
    half a file (temp file + rename), but a crash of the machine may lose the new
    content. For files rewritten often whose writer must not wait on a busy disk.
    """
    target = pathlib.Path(path)
    directory = target.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            if durable:
                os.fsync(stream.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    except BaseException:
        pathlib.Path(tmp_name).unlink(missing_ok=True)
        raise
    if not durable:
        return
    # Make the rename durable; some network file systems cannot fsync a directory.
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
