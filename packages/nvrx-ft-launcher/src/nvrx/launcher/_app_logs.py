"""Per-cycle application logs (``--ft-per-cycle-applog-prefix``): one set of files per cycle.

NVRx funnels every rank's output through pipes into one file per cycle
(``<prefix stem>_cycle<N><ext>``, lines prefixed with the rank). We reuse torch's own
redirection instead: each rank's stdout and stderr are files the rank itself writes
(torch's ``--redirects``), so nothing sits in a launcher's pipe when the launcher gets
SIGTERM or SIGKILL, C++ output included, and no reader thread costs the launcher CPU.
The files of cycle N of global rank R are::

    <stem>_cycle<N>_rank<R>_stdout<ext>
    <stem>_cycle<N>_rank<R>_stderr<ext>

``--tee`` still copies them to the console, and torch's error files (``@record``) stay
where ``--log-dir`` puts them. The cycle is torch's ``TORCHELASTIC_RESTART_COUNT``,
which ft_launcher makes the job-wide cycle number.
"""

from __future__ import annotations

import logging
import os
import stat

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, LogsDest, Std

__all__: list[str] = []


def check_prefix(prefix: str) -> str | None:
    """Why ``prefix`` cannot be used (NVRx wants an absolute path), or None."""
    if not os.path.isabs(prefix):
        return "expected an absolute path, e.g. /lustre/logs/job_1234.log"
    parent = os.path.dirname(prefix)
    if not os.path.isdir(parent):
        return f"the directory {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the directory {parent} is not writable"
    if not os.path.basename(prefix):
        return "expected a file name after the directory"
    return None


logger = logging.getLogger("nvrx.launcher")
_CLAIM_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _claimed(path: str) -> str:
    """``path``, made our regular file before torch opens it; os.devnull if it cannot be.

    torch opens the rank's log with ``open(path, "w")``, which follows a symlink: one
    another user planted in a shared directory would have the rank's output truncate
    and overwrite that user's victim. Creating the file here without following a final
    symlink makes it ours (in a sticky directory nobody else can then replace it; a
    world-writable one without the sticky bit is refused at start-up). A path that is a
    symlink or not a regular file is not written: that rank's output is dropped, with
    an ERROR naming the path.
    """
    try:
        fd = os.open(path, _CLAIM_FLAGS, 0o644)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise OSError(f"not a regular file of ours (mode {st.st_mode:o}, uid {st.st_uid})")
        finally:
            os.close(fd)
    except OSError as exc:
        logger.error("per-cycle log %s is not written: %s (a symlink is never followed)", path, exc)
        return os.devnull
    return path


def cycle_log_paths(prefix: str, cycle: int, rank: int) -> tuple[str, str]:
    """The (stdout, stderr) files of global rank ``rank`` in cycle ``cycle``."""
    stem, ext = os.path.splitext(prefix)
    base = f"{stem}_cycle{cycle}_rank{rank}"
    return f"{base}_stdout{ext}", f"{base}_stderr{ext}"


class PerCycleLogsSpecs(DefaultLogsSpecs):
    """torch's log layout, with every rank's stdout/stderr in the per-cycle files."""

    def __init__(
        self,
        prefix: str,
        log_dir: str | None = None,
        tee: Std | dict[int, Std] = Std.NONE,
        local_ranks_filter: set[int] | None = None,
    ) -> None:
        super().__init__(
            log_dir=log_dir, redirects=Std.ALL, tee=tee, local_ranks_filter=local_ranks_filter
        )
        self.prefix = prefix

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        for local_rank, env in envs.items():
            cycle = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
            rank = int(env.get("RANK", str(local_rank)))
            out, err = (_claimed(p) for p in cycle_log_paths(self.prefix, cycle, rank))
            dest.stdouts[local_rank], dest.stderrs[local_rank] = out, err
            if local_rank in dest.tee_stdouts:
                dest.tee_stdouts[local_rank] = out
            if local_rank in dest.tee_stderrs:
                dest.tee_stderrs[local_rank] = err
        return dest

    def __repr__(self) -> str:
        return f"PerCycleLogsSpecs(prefix={self.prefix!r}, {super().__repr__()})"
