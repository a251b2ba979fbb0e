"""Per-cycle records for tools: the cycle-info file, derived from the journal.

With ``--ft-cycle-info-dir DIR`` the launcher of group rank 0 writes, for each cycle,
``DIR/cycle_info.<job>.<attempt>.<cycle>`` (nvrx.ft's :class:`~nvrx.ft.CycleInfo`,
written by :func:`~nvrx.ft.write_cycle_info`: one format, one writer, one reader) when
the cycle starts (before its ranks are spawned) and again when it ends, and points the
link ``DIR/cycle_info.<job>.current`` at it (for tools outside the job).

Every rank gets its own cycle's file path in ``NVRX_CURRENT_CYCLE_INFO``, set by its
node's launcher just before the spawn: the name is known on every node, while the
link is moved by group rank 0 alone, just before its own spawn, so a rank on another
node reading the link could read the previous cycle. Through its cycle's path a rank
reads that cycle or, for the moment before group rank 0 has written it, nothing.

:class:`CycleInfoWriter` is fed the journal's records (the agent's journal observer), so
the file says what the journal says: the start from ``cycle_start``, failed ranks'
exit codes from ``rank_failed`` (a signal as its negative number), the cause of the
next cycle from its ``decision``, the end from ``workers_stopped``,
``all_nodes_finished`` or ``finished``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from nvrx.ft import CYCLE_INFO_ENV, CycleGoodput, CycleInfo, CycleNode, write_cycle_info

from ._events import (
    AllNodesFinished,
    CycleStarted,
    DecisionTaken,
    Finished,
    RankFailed,
    WorkersStopped,
)

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")


def signal_exit_code(name: object) -> int | None:
    """``rank_failed``'s ``signal`` (``SIGKILL``, or a number) as an exit code: ``-signum``."""
    if not isinstance(name, str):
        return None
    if name.isdigit():
        return -int(name)
    try:
        return -int(signal.Signals[name])
    except KeyError:
        return None


def cycle_info_job_id(given: str | None, env: Mapping[str, str]) -> str:
    """``--ft-cycle-info-job-id``, else SLURM_ARRAY_JOB_ID, else SLURM_JOB_ID, else "" (NVRx)."""
    for value in (given, env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_JOB_ID")):
        if value:
            return value
    return ""


def cycle_info_attempt(env: Mapping[str, str]) -> int:
    """The scheduler's requeue count (SLURM_RESTART_CNT), 0 when unset or not a count."""
    text = env.get("SLURM_RESTART_CNT", "").strip()
    return int(text) if text.isdigit() and len(text) < 10 else 0


def _file_part(text: str) -> str:
    """``text`` safe inside a file name (the job id comes from the environment)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:128] or "job"


class CycleInfoWriter:
    """Writes the cycle-info file of each cycle from the journal records it is fed."""

    def __init__(
        self,
        directory: str,
        job_id: str,
        attempt: int,
        *,
        file_job: str,
        log_file: Callable[[int, int], str | None] | None = None,
        goodput: Callable[[], CycleGoodput | None] | None = None,
    ) -> None:
        self.directory = directory
        self.job_id = job_id
        self.attempt = attempt
        self._file_job = _file_part(file_job)
        self._log_file = log_file
        self._goodput = goodput
        self._info: CycleInfo | None = None
        self._exit_codes: dict[int, int] = {}
        self._next_cause: str | None = None
        #: This node's global ranks in the cycle (finished ranks exit 0).
        self._node_ranks: list[int] = []
        self._warned = False
        self._environ: MutableMapping[str, str] | None = None

    @property
    def current_link(self) -> str:
        """The path every rank gets in NVRX_CURRENT_CYCLE_INFO."""
        return os.path.join(self.directory, f"cycle_info.{self._file_job}.current")

    def path(self, cycle: int) -> str:
        return os.path.join(self.directory, f"cycle_info.{self._file_job}.{self.attempt}.{cycle}")

    def export(self, environ: MutableMapping[str, str]) -> None:
        """Give the ranks (which inherit ``environ``) their cycle's file path.

        Until the first ``cycle_start`` that is the link; from then on each cycle's own
        file (set before the spawn, on every node).
        """
        self._environ = environ
        environ[CYCLE_INFO_ENV] = self.current_link

    def feed(self, record: dict[str, Any]) -> None:
        """One journal record; writes the file when the record starts or ends a cycle."""
        kind = record.get("event")
        if kind == CycleStarted.EVENT:
            self._start(record)
        elif kind == RankFailed.EVENT:
            code = record.get("exit_code")
            if not isinstance(code, int) or isinstance(code, bool):
                code = signal_exit_code(record.get("signal"))
            if code is not None:
                self._exit_codes[int(record["rank"])] = code
        elif kind == DecisionTaken.EVENT and record.get("action") == "restart":
            self._next_cause = str(record.get("reason") or "restart")[:4096]
        elif kind == WorkersStopped.EVENT:
            self._end(float(record.get("workers_stopped") or record["t"]), {})
        elif kind == AllNodesFinished.EVENT:
            self._end(float(record["t"]), dict.fromkeys(self._node_ranks, 0))
        elif kind == Finished.EVENT:
            self._end(float(record["t"]), {})

    # -- the writes -----------------------------------------------------------------

    def _start(self, record: dict[str, Any]) -> None:
        self._node_ranks = sorted(int(r) for r in record.get("local_ranks", {}).values())
        cycle = int(record["cycle"])
        if self._environ is not None:
            self._environ[CYCLE_INFO_ENV] = self.path(cycle)  # the ranks spawned next
        if record.get("group_rank") != 0:
            self._info = None  # another node writes the job's file
            return
        ranks = tuple(range(int(record["world_size"])))
        nodes = tuple(
            CycleNode(node_id=str(n["node_id"]), group_rank=int(n["group_rank"]))
            for n in record.get("nodes", [])
        )
        log_file = None
        if self._log_file is not None and self._node_ranks:
            log_file = self._log_file(cycle, self._node_ranks[0])
        self._exit_codes = {}
        self._write(
            CycleInfo(
                job_id=self.job_id,
                attempt=self.attempt,
                cycle=cycle,
                restart_count=int(record.get("restart_count", cycle)),
                started_at=float(record["t"]),
                cause=None if cycle == 0 else self._next_cause,
                nodes=nodes,
                ranks=ranks,
                log_file=log_file,
                goodput=self._goodput_now(),
            ),
            link=True,
        )

    def _end(self, when: float, codes: dict[int, int]) -> None:
        info = self._info
        if info is None or info.ended:
            return
        exit_codes = {r: c for r, c in {**codes, **self._exit_codes}.items() if r in info.ranks}
        self._write(
            CycleInfo(
                **{
                    **_fields(info),
                    "ended_at": max(when, info.started_at),
                    "exit_codes": exit_codes,
                    "goodput": self._goodput_now(),
                }
            ),
            link=False,
        )

    def _goodput_now(self) -> CycleGoodput | None:
        if self._goodput is None:
            return None
        try:
            return self._goodput()
        except Exception as exc:  # accounting never stops the launcher
            logger.debug("cycle info: no goodput (%r)", exc)
            return None

    def _write(self, info: CycleInfo, *, link: bool) -> None:
        self._info = info
        path = self.path(info.cycle)
        try:
            write_cycle_info(path, info)
            if link:
                temp = f"{self.current_link}.{os.getpid()}.tmp"
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp)
                os.symlink(os.path.basename(path), temp)
                os.replace(temp, self.current_link)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "cannot write the cycle info %s: %s (further errors not logged)", path, exc
                )


def _fields(info: CycleInfo) -> dict[str, Any]:
    return {name: getattr(info, name) for name in info.__dataclass_fields__}
