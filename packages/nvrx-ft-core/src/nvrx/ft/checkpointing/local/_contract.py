"""What ft_launcher and the ranks agree on about local checkpoints, written once.

The launcher (nvrx-ft-launcher) and the ranks (this package) read and write the same
things through this module only:

- the environment that tells a rank where its node's snapshots live and how often to
  save (:class:`LocalCkptSettings`, ``to_env``/``from_env``);
- the directory layout under the base directory (default ``/dev/shm``)::

      <base>/nvrx-ckpt-<uid>/                 0700, ours: one per user
          <job>.<tag>/                        one per launcher (node) and job, 0700
              owner.lock                      flock held by the launcher for its life
              local<i>/                       what local rank i holds (own + replicas)
              restore-<local rank>.json       what local rank i restored this cycle

  A directory whose ``owner.lock`` can be locked has no live launcher: any later
  launcher of the same user removes it (:func:`remove_dead_node_dirs`). An flock is
  released by the kernel when its holder dies, in any pid namespace, so this never
  takes a live job's snapshots for a dead one's.
- the restore record a rank writes after it restored (:class:`RestoreRecord`), which
  the launcher journals and the goodput account uses for ``recomputed``.

Nothing here raises into a training loop: ``from_env`` and ``read_restore_records``
warn once and fall back; only the launcher's start-up checks (``validate``) raise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import fcntl
import json
import logging
import math
import os
import pathlib
import re
import secrets
import shutil
import stat
from collections.abc import Mapping
from typing import TypeVar

from nvrx.ft._files import write_file_atomically
from nvrx.ft._json_files import read_json_file

__all__: list[str] = []

_logger = logging.getLogger("nvrx.ft.local_checkpoint")

ENV_DIR = "NVRX_LOCAL_CKPT_DIR"
"""The node directory (``<base>/nvrx-ckpt-<uid>/<job>.<tag>``) the launcher made."""
ENV_JOB = "NVRX_LOCAL_CKPT_JOB"
"""The job identity a snapshot must carry to be loaded (the rendezvous run id)."""
ENV_EVERY_N_STEPS = "NVRX_LOCAL_CKPT_EVERY_N_STEPS"
ENV_EVERY_S = "NVRX_LOCAL_CKPT_EVERY_S"
ENV_REPLICAS = "NVRX_LOCAL_CKPT_REPLICAS"
ENV_MAX_SHARE = "NVRX_LOCAL_CKPT_MAX_SHARE"
ENV_VARS = (ENV_DIR, ENV_JOB, ENV_EVERY_N_STEPS, ENV_EVERY_S, ENV_REPLICAS, ENV_MAX_SHARE)

DEFAULT_BASE = "/dev/shm"  # noqa: S108 (a private 0700 dir per user is made under it)
DEFAULT_REPLICAS = 1
DEFAULT_MAX_SHARE = 0.5
MAX_REPLICAS = 8
USER_DIR_PREFIX = "nvrx-ckpt-"
LOCK_NAME = "owner.lock"
_RECORD_PREFIX = "restore-"
_MAX_RECORD_BYTES = 4096
_MAX_JOB_CHARS = 128
_JOB_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NODE_DIR = re.compile(r"[A-Za-z0-9_.-]{1,160}\.[0-9a-f]{12}\Z")
_MAX_INT = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class LocalCkptSettings:
    """Where a node's snapshots live and how often and how widely a rank saves them.

    ``every_n_steps`` and ``every_s`` are None when the launcher leaves the interval to
    the training script; ``replicas`` is how many other nodes hold a copy of each
    rank's snapshot; ``max_share`` the largest share of the file system's size the
    snapshots may fill (a save that would pass it is skipped with one warning).
    """

    node_dir: pathlib.Path
    job_id: str
    every_n_steps: int | None = None
    every_s: float | None = None
    replicas: int = DEFAULT_REPLICAS
    max_share: float = DEFAULT_MAX_SHARE

    def validate(self) -> None:
        """Raise ValueError naming the setting and the value that cannot be used."""
        if self.every_n_steps is not None and not 1 <= self.every_n_steps <= _MAX_INT:
            raise ValueError(f"every_n_steps={self.every_n_steps}: must be 1 or more")
        if self.every_s is not None and not (
            math.isfinite(self.every_s) and 0 < self.every_s <= 86400 * 365
        ):
            raise ValueError(f"every_s={self.every_s}: must be a positive number of seconds")
        if not 0 <= self.replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas={self.replicas}: must be 0 to {MAX_REPLICAS}")
        if not (math.isfinite(self.max_share) and 0 < self.max_share <= 1):
            raise ValueError(f"max_share={self.max_share}: must be in (0, 1]")
        if not self.job_id or len(self.job_id) > _MAX_JOB_CHARS:
            raise ValueError(f"job_id={self.job_id!r}: must be 1 to {_MAX_JOB_CHARS} characters")

    def to_env(self) -> dict[str, str]:
        """The variables the launcher gives every rank (unset intervals are left out)."""
        env = {
            ENV_DIR: os.fspath(self.node_dir),
            ENV_JOB: self.job_id,
            ENV_REPLICAS: str(self.replicas),
            ENV_MAX_SHARE: repr(self.max_share),
        }
        if self.every_n_steps is not None:
            env[ENV_EVERY_N_STEPS] = str(self.every_n_steps)
        if self.every_s is not None:
            env[ENV_EVERY_S] = repr(self.every_s)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LocalCkptSettings | None:
        """The settings the launcher gave this rank; None when it gave none.

        A value that cannot be used is one WARNING and its default (a rank never fails
        because of its environment); a missing or unusable directory is None.
        """
        env = os.environ if environ is None else environ
        where = env.get(ENV_DIR)
        if not where:
            return None
        job = env.get(ENV_JOB, "")
        settings = cls(
            node_dir=pathlib.Path(where),
            job_id=job if job and len(job) <= _MAX_JOB_CHARS else "unknown",
            every_n_steps=_env_int(env, ENV_EVERY_N_STEPS),
            every_s=_env_float(env, ENV_EVERY_S),
            replicas=_or(_env_int(env, ENV_REPLICAS), DEFAULT_REPLICAS),
            max_share=_or(_env_float(env, ENV_MAX_SHARE), DEFAULT_MAX_SHARE),
        )
        try:
            settings.validate()
        except ValueError as exc:
            _logger.warning("ignoring the local checkpoint settings from the environment: %s", exc)
            return dataclasses.replace(
                settings,
                every_n_steps=None,
                every_s=None,
                replicas=DEFAULT_REPLICAS,
                max_share=DEFAULT_MAX_SHARE,
            )
        return settings

    def local_rank_dir(self, local_rank: int) -> pathlib.Path:
        """The directory of what local rank ``local_rank`` holds (created by that rank)."""
        return self.node_dir / f"local{int(local_rank)}"


_T = TypeVar("_T", int, float)


def _or(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        _logger.warning("%s=%r is not a whole number; using the default", name, raw)
        return None


def _env_float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        _logger.warning("%s=%r is not a number; using the default", name, raw)
        return None


def job_dir_name(job_id: str) -> str:
    """A file-name-safe form of the job identity (the rendezvous run id)."""
    safe = _JOB_UNSAFE.sub("_", job_id)[:_MAX_JOB_CHARS]
    return safe or "job"


def user_dir(base: str | os.PathLike[str]) -> pathlib.Path:
    """``<base>/nvrx-ckpt-<uid>``, created 0700; PermissionError if it is not ours/private."""
    path = pathlib.Path(base) / f"{USER_DIR_PREFIX}{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{os.fspath(path)!r} is not a directory (a symlink?)")
    if st.st_uid != os.getuid():
        raise PermissionError(f"{os.fspath(path)!r} is owned by uid {st.st_uid}, not by us")
    if st.st_mode & 0o077:
        raise PermissionError(
            f"{os.fspath(path)!r} has mode {stat.S_IMODE(st.st_mode):o}: other users could "
            "read the snapshots; make it 0700 or remove it"
        )
    return path


@dataclasses.dataclass
class NodeDir:
    """A launcher's node directory and the lock that marks it live while it is held."""

    path: pathlib.Path
    lock_fd: int

    def remove(self) -> None:
        """Delete the directory and everything in it, then release the lock."""
        with contextlib.suppress(OSError):
            shutil.rmtree(self.path)
        self.release()

    def release(self) -> None:
        """Let go of the lock (the directory stays; a later launcher removes it)."""
        if self.lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = -1


def create_node_dir(base: str | os.PathLike[str], job_id: str) -> NodeDir:
    """Make this launcher's node directory for ``job_id`` and hold its lock.

    The lock file descriptor is not inherited by children (O_CLOEXEC): the lock lives
    exactly as long as the launcher. Directories of dead launchers of the same user are
    removed first.
    """
    parent = user_dir(base)
    remove_dead_node_dirs(base)
    path = parent / f"{job_dir_name(job_id)}.{secrets.token_hex(6)}"
    os.mkdir(path, 0o700)
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return NodeDir(path, fd)


def remove_dead_node_dirs(base: str | os.PathLike[str]) -> list[pathlib.Path]:
    """Remove the node directories of this user whose launcher is gone; return them.

    Only directories named as :func:`create_node_dir` names them, ours, not symlinks,
    with a lock file nobody holds are removed. A directory without a lock file is left
    alone (another tool's, or one being created).
    """
    parent = pathlib.Path(base) / f"{USER_DIR_PREFIX}{os.getuid()}"
    removed: list[pathlib.Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not _NODE_DIR.match(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        if _lock_is_free(pathlib.Path(entry.path) / LOCK_NAME):
            with contextlib.suppress(OSError):
                shutil.rmtree(entry.path)
                removed.append(pathlib.Path(entry.path))
    if removed:
        _logger.info("removed local checkpoints of jobs whose launcher is gone: %s", removed)
    return removed


def _lock_is_free(lock: pathlib.Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            _logger.debug("cannot test %s: %s", lock, exc)
        return False
    else:
        return True
    finally:
        os.close(fd)


class RestoreSource(enum.Enum):
    """Where a rank's restored state came from."""

    OWN = "own"  # its own node's memory
    PEER = "peer"  # a replica another node sent
    GLOBAL = "global"  # no local snapshot usable everywhere: the disk checkpoint
    NONE = "none"  # nothing to restore: a fresh start


@dataclasses.dataclass(frozen=True)
class RestoreRecord:
    """What one rank restored at the start of a cycle (written by the rank)."""

    restart_count: int  # TORCHELASTIC_RESTART_COUNT of the cycle
    rank: int
    local_rank: int
    source: RestoreSource
    iteration: int | None  # None with GLOBAL/NONE unless the caller said
    snapshot_wall: float | None  # when the restored snapshot's state was taken
    restore_s: float  # seconds the restore took (agreement + fetch + load)
    wall: float  # when the restore finished

    def to_json(self) -> dict[str, object]:
        """The record as the file holds it."""
        out = dataclasses.asdict(self)
        out["source"] = self.source.value
        return out

    @classmethod
    def from_json(cls, data: object) -> RestoreRecord:
        """Parse and check a record; ValueError says what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        fields = {f.name for f in dataclasses.fields(cls)}
        if set(data) != fields:
            raise ValueError(f"fields {sorted(data)} are not {sorted(fields)}")
        try:
            source = RestoreSource(data["source"])
        except ValueError:
            raise ValueError(f"source {data['source']!r} is not one of ours") from None
        for name in ("restart_count", "rank", "local_rank"):
            if type(data[name]) is not int or not 0 <= data[name] <= _MAX_INT:
                raise ValueError(f"{name} {data[name]!r} is not a count")
        it = data["iteration"]
        if it is not None and (type(it) is not int or not 0 <= it <= 2**62):
            raise ValueError(f"iteration {it!r} is not an iteration")
        for name in ("snapshot_wall", "restore_s", "wall"):
            value = data[name]
            if value is None and name == "snapshot_wall":
                continue
            if type(value) not in (int, float) or not (0 <= value < 2**33):
                raise ValueError(f"{name} {value!r} is not a time")
        return cls(
            restart_count=data["restart_count"],
            rank=data["rank"],
            local_rank=data["local_rank"],
            source=source,
            iteration=it,
            snapshot_wall=None if data["snapshot_wall"] is None else float(data["snapshot_wall"]),
            restore_s=float(data["restore_s"]),
            wall=float(data["wall"]),
        )


def write_restore_record(node_dir: str | os.PathLike[str], record: RestoreRecord) -> None:
    """Replace local rank's record in ``node_dir`` atomically (never half a file)."""
    path = pathlib.Path(node_dir) / f"{_RECORD_PREFIX}{record.local_rank}.json"
    write_file_atomically(path, json.dumps(record.to_json()), mode=0o600, durable=False)


def read_restore_records(node_dir: str | os.PathLike[str]) -> list[RestoreRecord]:
    """Every usable record in ``node_dir``, by local rank; an unusable one is skipped.

    The files come from the ranks, so each is read without following links, of ours
    only, bounded in size and checked field by field; a bad one is one DEBUG line.
    """
    records: list[RestoreRecord] = []
    try:
        names = sorted(os.listdir(node_dir))
    except OSError:
        return records
    for name in names:
        if not (name.startswith(_RECORD_PREFIX) and name.endswith(".json")):
            continue
        try:
            data = read_json_file(
                pathlib.Path(node_dir) / name,
                _MAX_RECORD_BYTES,
                follow_links=False,
                owner_uid=os.getuid(),
            )
            records.append(RestoreRecord.from_json(data))
        except (OSError, ValueError) as exc:
            _logger.debug("skipping restore record %s: %s", name, exc)
    return records
