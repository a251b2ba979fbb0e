"""Local checkpoints, the launcher's side: options, the node directory, the restore records.

The ranks save and restore (``nvrx.ft.checkpointing.local``); the launcher

- takes the options (``--local-ckpt-*``, each also ``PET_LOCAL_CKPT_*``) and refuses a
  bad value at start (exit 2, naming the option and the value);
- makes this node's private directory for the job when it starts
  (:func:`~nvrx.ft.checkpointing.local._contract.create_node_dir`, which first removes
  the directories of this user's dead launchers), holds its lock for its life, gives
  every rank (warm spares too) the settings through the environment
  (``LocalCkptSettings.to_env``), and removes the directory when the job ends
  successfully (left otherwise: the next launcher of the user removes it);
- after each cycle starts, reads what the ranks restored (their restore records) and
  journals one ``checkpoint_restored`` record per cycle and node.

Everything about the layout, the environment and the records is in the contract module
of nvrx-ft-core; nothing here repeats it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pathlib
import time
from collections.abc import Sequence

from nvrx.ft.checkpointing.local import _contract as contract

from ._arg_types import number

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

#: The value of ``--local-ckpt-dir`` that turns local checkpoints off.
OFF = "none"
#: What a warm spare imports too when local checkpoints are on, so that a rank it
#: becomes restores without importing anything.
SPARE_PRELOAD = "nvrx.ft.checkpointing.local"
#: How often the restore records are looked at until every local rank wrote its own.
_RECORD_POLL_S = 0.5
#: Which source a node reports when its local ranks differ (the first that one has).
_SOURCE_ORDER = (
    contract.RestoreSource.GLOBAL,
    contract.RestoreSource.NONE,
    contract.RestoreSource.PEER,
    contract.RestoreSource.OWN,
)


@dataclasses.dataclass(frozen=True)
class LocalCkptOptions:
    """The launcher's local checkpoint options, validated (``base`` None: off)."""

    base: str | None = contract.DEFAULT_BASE
    every_n_steps: int | None = None
    every_s: float | None = None
    replicas: int = contract.DEFAULT_REPLICAS
    max_share: float = contract.DEFAULT_MAX_SHARE
    #: Whether the base directory was given (a default that cannot be used turns the
    #: feature off with a warning; a given one that cannot be used is a usage error).
    explicit: bool = False

    def settings(self, node_dir: pathlib.Path, job_id: str) -> contract.LocalCkptSettings:
        """The settings the ranks get for ``node_dir`` and ``job_id``."""
        return contract.LocalCkptSettings(
            node_dir=node_dir,
            job_id=job_id,
            every_n_steps=self.every_n_steps,
            every_s=self.every_s,
            replicas=self.replicas,
            max_share=self.max_share,
        )


# --- options ---------------------------------------------------------------------------


def _base_dir(text: str) -> str:
    """An argparse type: ``none``, or a directory (checked at start, see :func:`options`)."""
    if text.strip().lower() == OFF:
        return OFF
    if not text or "\0" in text:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected a directory or none")
    return text


_MAX_S = 86400.0 * 365


def add_options(parser: argparse.ArgumentParser) -> None:
    """The ``--local-ckpt-*`` options (needs no torch import)."""
    group = parser.add_argument_group(
        "local checkpoints",
        "In-memory snapshots of each rank's training state on its node (tmpfs), copied to "
        "peer nodes, restored in-job after a fault by nvrx.ft.checkpointing.local. The "
        "launcher makes a private directory per node and job and tells every rank the "
        "settings through NVRX_LOCAL_CKPT_* variables, so a training script needs no "
        "path logic.",
    )
    group.add_argument(
        "--local-ckpt-dir",
        "--local_ckpt_dir",
        dest="local_ckpt_dir",
        type=_base_dir,
        default=None,
        help=f"the base directory of this node's local snapshots, best a tmpfs; a private "
        f"0700 directory <DIR>/nvrx-ckpt-<uid>/<job>.<tag> is made in it for the job and "
        f"removed when the job ends successfully; 'none' turns local checkpoints off "
        f"(default: {contract.DEFAULT_BASE}, off with a warning where it cannot be used)",
    )
    group.add_argument(
        "--local-ckpt-every-n-steps",
        "--local_ckpt_every_n_steps",
        dest="local_ckpt_every_n_steps",
        type=number(int, minimum=1, maximum=2**31 - 1, what="an integer >= 1"),
        default=None,
        help="ranks save a local snapshot every N steps (default: the script's choice)",
    )
    group.add_argument(
        "--local-ckpt-every-s",
        "--local_ckpt_every_s",
        dest="local_ckpt_every_s",
        type=number(
            float,
            minimum=0.0,
            maximum=_MAX_S,
            what="a number of seconds above 0",
            above_minimum=True,
        ),
        default=None,
        help="ranks save a local snapshot once this many seconds have passed since the "
        "last (default: the script's choice)",
    )
    group.add_argument(
        "--local-ckpt-replicas",
        "--local_ckpt_replicas",
        dest="local_ckpt_replicas",
        type=number(
            int,
            minimum=0,
            maximum=contract.MAX_REPLICAS,
            what=f"an integer from 0 to {contract.MAX_REPLICAS}",
        ),
        default=contract.DEFAULT_REPLICAS,
        help="how many other nodes hold a copy of each rank's snapshot, so that losing a "
        "node loses none (capped at the number of nodes - 1; default: %(default)s)",
    )
    group.add_argument(
        "--local-ckpt-max-share",
        "--local_ckpt_max_share",
        dest="local_ckpt_max_share",
        type=number(
            float,
            minimum=0.0,
            maximum=1.0,
            what="a fraction above 0, at most 1",
            above_minimum=True,
        ),
        default=contract.DEFAULT_MAX_SHARE,
        help="the largest share of the file system's size the snapshots may fill; a save "
        "that would pass it is skipped with a warning (default: %(default)s)",
    )


def _unusable(base: str) -> str | None:
    """Why ``base`` cannot hold node directories, or None."""
    if not os.path.isdir(base):
        return "is not a directory"
    if not os.access(base, os.W_OK | os.X_OK):
        return "is not writable by this user"
    try:
        contract.user_dir(base)
    except OSError as exc:
        return str(exc)
    return None


def options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> LocalCkptOptions:
    """The validated options; a bad value is a usage error (exit 2) naming it."""
    given = args.local_ckpt_dir
    base: str | None = contract.DEFAULT_BASE if given is None else given
    if base == OFF:
        base = None
    if base is not None:
        why = _unusable(base)
        if why is not None and given is not None:
            parser.error(f"argument --local-ckpt-dir: {base!r} {why}")
        if why is not None:
            logger.warning(
                "local checkpoints are off: the default --local-ckpt-dir %s %s", base, why
            )
            base = None
    result = LocalCkptOptions(
        base=None if base is None else os.path.abspath(base),
        every_n_steps=args.local_ckpt_every_n_steps,
        every_s=args.local_ckpt_every_s,
        replicas=args.local_ckpt_replicas,
        max_share=args.local_ckpt_max_share,
        explicit=given is not None,
    )
    if result.base is None and (result.every_n_steps or result.every_s):
        logger.warning(
            "--local-ckpt-every-n-steps/--local-ckpt-every-s have no effect with local "
            "checkpoints off"
        )
    return result


# --- the node directory ------------------------------------------------------------------


class NodeDirectory:
    """This launcher's node directory for the job, held from start to end."""

    def __init__(self, node_dir: contract.NodeDir, settings: contract.LocalCkptSettings) -> None:
        self._dir = node_dir
        self.settings = settings

    @property
    def path(self) -> pathlib.Path:
        """The directory the ranks' snapshots and restore records are in."""
        return self._dir.path

    @classmethod
    def create(cls, opts: LocalCkptOptions, job_id: str) -> NodeDirectory | None:
        """Make it (first removing dead launchers' directories) and put the ranks'
        settings into this process's environment, which every rank inherits.

        None when local checkpoints are off. A directory that cannot be made is an
        OSError (a usage error at start) when the base was given, else a warning and off.
        """
        if opts.base is None:
            return None
        settings = opts.settings(pathlib.Path(opts.base), job_id)
        settings.validate()  # ValueError names the setting (the options were checked)
        try:
            made = contract.create_node_dir(opts.base, job_id)
        except OSError as exc:
            if opts.explicit:
                raise
            logger.warning(
                "local checkpoints are off: cannot make a directory in %s: %s", opts.base, exc
            )
            return None
        settings = dataclasses.replace(settings, node_dir=made.path)
        os.environ.update(settings.to_env())
        logger.info("local checkpoints of this node in %s", made.path)
        return cls(made, settings)

    def close(self, *, succeeded: bool) -> None:
        """At the launcher's end: remove the directory if the job succeeded, else keep it
        (the lock is released, so the next launcher of this user removes it)."""
        for name in contract.ENV_VARS:
            os.environ.pop(name, None)
        if succeeded:
            self._dir.remove()
            logger.debug("removed the local checkpoints in %s", self._dir.path)
        else:
            self._dir.release()


# --- restore records ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NodeRestore:
    """What this node's ranks restored in one cycle (the ``checkpoint_restored`` record)."""

    source: str
    iteration: int | None
    snapshot_wall: float | None
    restore_s: float
    ranks: dict[int, str]


def node_restore(records: Sequence[contract.RestoreRecord]) -> NodeRestore | None:
    """One node's view of its ranks' records (None without any)."""
    if not records:
        return None
    sources = {r.source for r in records}
    source = next(s for s in _SOURCE_ORDER if s in sources)
    iterations = [r.iteration for r in records if r.iteration is not None]
    walls = [r.snapshot_wall for r in records if r.snapshot_wall is not None]
    return NodeRestore(
        source=source.value,
        iteration=min(iterations) if iterations else None,
        snapshot_wall=min(walls) if walls else None,
        restore_s=max(r.restore_s for r in records),
        ranks={r.local_rank: r.source.value for r in sorted(records, key=lambda r: r.local_rank)},
    )


class RestoreWatch:
    """Reads the ranks' restore records of the current cycle until every local rank wrote
    one (at most every 0.5 s, a directory listing each time); says so once."""

    def __init__(self, node_dir: str | os.PathLike[str]) -> None:
        self._dir = pathlib.Path(node_dir)
        self._cycle = -1
        self._local_world = 0
        self._done = True
        self._next = 0.0
        self._seen: dict[int, contract.RestoreRecord] = {}

    def start_cycle(self, cycle: int, local_world_size: int) -> None:
        """The ranks of ``cycle`` (their ``TORCHELASTIC_RESTART_COUNT``) are starting."""
        self._cycle, self._local_world = cycle, local_world_size
        self._done, self._next, self._seen = False, 0.0, {}

    def poll(self, *, final: bool = False) -> NodeRestore | None:
        """The cycle's restore, once: when every local rank recorded, or with ``final``
        (the first step, or the cycle's end) whatever was recorded by then."""
        if self._done:
            return None
        now = time.monotonic()
        if not final and now < self._next:
            return None
        self._next = now + _RECORD_POLL_S
        for record in contract.read_restore_records(self._dir):
            if record.restart_count == self._cycle and 0 <= record.local_rank < self._local_world:
                self._seen[record.local_rank] = record
        if len(self._seen) < self._local_world and not (final and self._seen):
            if final:
                self._done = True  # no records: a script without local checkpoints
            return None
        self._done = True
        return node_restore(list(self._seen.values()))
