"""The per-local-rank monitors of one node: started early, supervised, listened to.

The launcher owns one :class:`nvrx.ft.RankMonitorServer` process per local rank for
the whole job (they serve every restart), a private runtime directory holding their
sockets, and the datagram socket on which they report events. A monitor that dies,
or stops making progress (stopped by SIGSTOP, wedged: its liveness beat goes stale),
is noticed at the next tick and replaced; the agent decides whether the rank it
served must be restarted too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import signal
import socket
import time

from nvrx.ft import (
    MAX_EVENT_BYTES,
    RANK_MONITOR_INIT_TIMEOUT,
    FaultToleranceConfig,
    MonitorProcess,
    RankMonitorServer,
    create_runtime_dir,
)
from nvrx.ft._events import RankEvent, parse_event
from nvrx.ft._runtime import release_runtime_dir

__all__ = ["MonitorSupervisor"]

logger = logging.getLogger("nvrx.launcher")


#: A monitor whose loop has not turned for this long is stuck and is replaced. The loop
#: beats every ``nvrx.ft._liveness.BEAT_PERIOD_S`` (0.25 s); the margin absorbs scheduling
#: delays on a loaded machine, and costs at most this much extra hang-detection latency.
STALL_TIMEOUT_S = 5.0


class MonitorSupervisor:
    """Starts, watches, replaces and stops the monitors of ``local_world_size`` slots."""

    def __init__(
        self,
        cfg: FaultToleranceConfig,
        local_world_size: int,
        *,
        ready_timeout: float = RANK_MONITOR_INIT_TIMEOUT,
        stall_timeout: float = STALL_TIMEOUT_S,
    ) -> None:
        self._cfg = cfg
        self._stall_timeout = stall_timeout
        self._local_world_size = local_world_size
        self._ready_timeout = ready_timeout
        self._dir = create_runtime_dir(prefix="nvrx-launcher-")
        self._events_path = self._dir / "events.sock"
        self._events = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._events.bind(os.fspath(self._events_path))
        self._events.setblocking(False)
        self._procs: dict[int, MonitorProcess] = {}
        self._ready: set[int] = set()

    def matches(
        self, cfg: FaultToleranceConfig, local_world_size: int, ready_timeout: float
    ) -> bool:
        """True when these monitors were started with exactly these settings."""
        return (
            cfg == self._cfg
            and local_world_size == self._local_world_size
            and ready_timeout == self._ready_timeout
        )

    @property
    def runtime_dir(self) -> pathlib.Path:
        """The private 0700 directory holding every socket of this launcher."""
        return self._dir

    def socket_path(self, local_rank: int | str) -> pathlib.Path:
        """Where the monitor of ``local_rank`` listens for its rank (the one naming rule).

        ``local_rank`` may be torch's ``${local_rank}`` macro, for a rank's argv template.
        """
        return self._dir / f"monitor-{local_rank}.sock"

    def fileno(self) -> int:
        """The events socket, for ``select``: readable when a monitor reported."""
        return self._events.fileno()

    def _spawn(self, local_rank: int) -> None:
        path = self.socket_path(local_rank)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._procs[local_rank] = RankMonitorServer.start_in_subprocess(
            self._cfg, path, local_rank=local_rank, events_socket=self._events_path
        )
        self._ready.discard(local_rank)

    def start(self) -> None:
        """Start every monitor without waiting for them (they come up in parallel)."""
        for local_rank in range(self._local_world_size):
            self._spawn(local_rank)

    def wait_ready(self) -> None:
        """Block until every monitor listens; raises if one died or timed out."""
        for local_rank, proc in sorted(self._procs.items()):
            if local_rank not in self._ready:
                proc.wait_ready(timeout=self._ready_timeout)
                self._ready.add(local_rank)

    def dead(self) -> dict[int, int | None]:
        """Local ranks whose monitor is gone or stuck, with its exit code when known.

        A monitor that lives but has not beaten for ``stall_timeout`` seconds (stopped,
        wedged) is killed here, so it is reported and replaced like one that died. Only
        monitors that came up are judged: one still starting is ``wait_ready``'s business.
        """
        gone: dict[int, int | None] = {}
        for local_rank, proc in self._procs.items():
            if proc.is_alive() and not self._stalled(local_rank, proc):
                continue
            gone[local_rank] = proc.returncode
        return gone

    def _stalled(self, local_rank: int, proc: MonitorProcess) -> bool:
        if local_rank not in self._ready:
            return False
        age = proc.beat_age()
        if age is None or age <= self._stall_timeout:
            return False
        logger.error(
            "the monitor of local rank %d (pid %d) made no progress for %.1f s (stopped or "
            "stuck); killing it",
            local_rank,
            proc.pid,
            age,
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=5.0)
        return True

    def renew_dead(self) -> None:
        """Start a fresh monitor for every one that died or stalled (logged), before a start."""
        for local_rank, code in sorted(self.dead().items()):
            logger.error(
                "the monitor of local rank %d died (exit code %s); starting a new one",
                local_rank,
                code,
            )
            self.replace(local_rank)

    def replace(self, local_rank: int) -> None:
        """Start a fresh monitor for ``local_rank`` (the old one is gone)."""
        old = self._procs.get(local_rank)
        if old is not None:
            old.stop(timeout=1.0)
        self._spawn(local_rank)

    def pids(self) -> dict[int, int]:
        """Monitor pids by local rank."""
        return {local_rank: proc.pid for local_rank, proc in self._procs.items()}

    def drain_events(self) -> list[RankEvent]:
        """Every event queued on the socket now; malformed ones are logged and dropped."""
        events: list[RankEvent] = []
        while True:
            try:
                data = self._events.recv(MAX_EVENT_BYTES)
            except (BlockingIOError, InterruptedError):
                return events
            try:
                events.append(parse_event(data))
            except ValueError as exc:
                logger.warning("ignoring a malformed monitor event: %s", exc)

    def close(self, timeout: float = 5.0) -> None:
        """Stop every monitor (SIGTERM, then SIGKILL after ``timeout``) and remove the dir."""
        deadline = time.monotonic() + timeout
        for proc in self._procs.values():
            if proc.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in self._procs.values():
            proc.stop(timeout=max(0.0, deadline - time.monotonic()))
        self._procs.clear()
        self._events.close()
        release_runtime_dir(self._dir)
