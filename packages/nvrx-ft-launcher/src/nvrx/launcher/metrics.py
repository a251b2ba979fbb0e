"""An optional Prometheus endpoint per launcher: restarts, latencies, goodput, health, scores.

A cluster's monitoring scrapes what a job's faults cost without reading its logs. The
endpoint is off by default; :func:`start_metrics_server` starts it (the ``metrics``
extra: ``pip install "nvrx-ft-launcher[metrics]"``) on 127.0.0.1 unless told otherwise,
with its own registry (nothing of the process's global registry leaks out), served by
one thread with at most a few connections at once, each timed out after a few seconds
(a flood of connections takes no file descriptor, thread or CPU the launcher needs;
see ``_metrics_http``). Until then
the agent holds :data:`NULL_RECORDER`, whose methods do nothing: ``prometheus_client``
is not even imported. A recorder never raises into the launcher: an error is logged once
and the metric is skipped.

Metrics (names and labels as Prometheus asks: ``nvrx_`` prefix, base units, ``_total``
for counters):

- ``nvrx_restarts_total{cause}``: restarts by :class:`~nvrx.launcher.goodput.Cause`;
- ``nvrx_fault_detection_seconds``: histogram, a fault's earliest sign to the decision;
- ``nvrx_restart_recovery_seconds``: histogram, the decision to the new cycle's first
  step (to its ranks' start when the first step is not known);
- ``nvrx_goodput_seconds{phase}``: wall time by :class:`~nvrx.launcher.goodput.Phase`
  (``phase="productive"`` is the goodput); ``nvrx_ettr_ratio``: productive / wall time;
- ``nvrx_monitor_up{local_rank}``: 1 while the rank monitor of that local rank is healthy;
- ``nvrx_straggler_score{rank,kind}``: the last straggler score of each rank
  (``kind`` ``relative`` or ``individual``; NaN where the rank had nothing comparable).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .goodput import Cause, Goodput, Phase

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "DETECTION_BUCKETS",
    "NULL_RECORDER",
    "RECOVERY_BUCKETS",
    "MetricsServer",
    "NullRecorder",
    "PrometheusRecorder",
    "start_metrics_server",
]

logger = logging.getLogger("nvrx.launcher")

#: Histogram buckets of ``nvrx_fault_detection_seconds`` (crashes: ms; hangs: timeouts).
DETECTION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
#: Histogram buckets of ``nvrx_restart_recovery_seconds``.
RECOVERY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
_SCORE_KINDS = frozenset({"relative", "individual"})


class NullRecorder:
    """The recorder API; this one does nothing (the endpoint is off)."""

    def restart(self, cause: Cause, detection_s: float | None, recovery_s: float | None) -> None:
        """Count a restart of ``cause`` and observe its latencies (None: not known)."""

    def goodput(self, summary: Goodput) -> None:
        """Publish the job's goodput split and ETTR so far."""

    def monitor_health(self, local_rank: int, healthy: bool) -> None:
        """Say whether the rank monitor of ``local_rank`` is healthy."""

    def straggler_scores(self, scores: Mapping[int, float], kind: str = "relative") -> None:
        """Publish each rank's last straggler score of ``kind`` (replacing older ones)."""


#: The recorder the agent holds while the endpoint is off.
NULL_RECORDER = NullRecorder()


class PrometheusRecorder(NullRecorder):
    """Keeps the metrics in its own ``prometheus_client`` registry (:attr:`registry`)."""

    def __init__(self) -> None:
        pc = _prometheus_client()
        self.registry: Any = pc.CollectorRegistry(auto_describe=True)
        reg = self.registry
        self._restarts = pc.Counter(
            "nvrx_restarts", "Restarts of the job's ranks, by cause.", ["cause"], registry=reg
        )
        self._detection = pc.Histogram(
            "nvrx_fault_detection_seconds",
            "From a fault's earliest sign (a hung rank's last heartbeat, a crash) to the decision.",
            buckets=DETECTION_BUCKETS,
            registry=reg,
        )
        self._recovery = pc.Histogram(
            "nvrx_restart_recovery_seconds",
            "From the restart decision to the new cycle's first step (or its ranks' start).",
            buckets=RECOVERY_BUCKETS,
            registry=reg,
        )
        self._phase = pc.Gauge(
            "nvrx_goodput_seconds",
            "Wall time of the job by phase; phase=productive is the goodput.",
            ["phase"],
            registry=reg,
        )
        self._ettr = pc.Gauge(
            "nvrx_ettr_ratio",
            "Effective training time ratio: productive / wall time.",
            registry=reg,
        )
        self._monitor = pc.Gauge(
            "nvrx_monitor_up", "1 while the rank monitor is healthy.", ["local_rank"], registry=reg
        )
        self._scores = pc.Gauge(
            "nvrx_straggler_score",
            "Last straggler score of each rank (1.0: as fast as the reference).",
            ["rank", "kind"],
            registry=reg,
        )
        self._lock = threading.Lock()
        self._score_ranks: dict[str, set[int]] = {}
        self._warned = False

    def _failed(self, what: str, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("metrics: %s failed: %r (further errors not logged)", what, exc)

    def restart(self, cause: Cause, detection_s: float | None, recovery_s: float | None) -> None:
        """Count a restart of ``cause`` and observe its latencies (None: not known)."""
        try:
            self._restarts.labels(cause=Cause(cause).value).inc()
            for hist, value in ((self._detection, detection_s), (self._recovery, recovery_s)):
                if value is not None and math.isfinite(value) and value >= 0:
                    hist.observe(value)
        except Exception as exc:  # monitoring never breaks the launcher
            self._failed("restart", exc)

    def goodput(self, summary: Goodput) -> None:
        """Publish the job's goodput split and ETTR so far."""
        try:
            for phase in Phase:
                self._phase.labels(phase=phase.value).set(summary.seconds.get(phase, 0.0))
            ettr = summary.ettr
            self._ettr.set(math.nan if ettr is None else ettr)
        except Exception as exc:
            self._failed("goodput", exc)

    def monitor_health(self, local_rank: int, healthy: bool) -> None:
        """Say whether the rank monitor of ``local_rank`` is healthy."""
        try:
            self._monitor.labels(local_rank=str(int(local_rank))).set(1 if healthy else 0)
        except Exception as exc:
            self._failed("monitor_health", exc)

    def straggler_scores(self, scores: Mapping[int, float], kind: str = "relative") -> None:
        """Publish each rank's last straggler score of ``kind`` (replacing older ones)."""
        try:
            if kind not in _SCORE_KINDS:
                raise ValueError(f"kind {kind!r} is not one of {sorted(_SCORE_KINDS)}")
            ranks = {int(r) for r in scores}
            with self._lock:  # a rank gone from the report is gone from the endpoint
                for gone in self._score_ranks.get(kind, set()) - ranks:
                    self._scores.remove(str(gone), kind)
                self._score_ranks[kind] = ranks
                for rank, score in scores.items():
                    self._scores.labels(rank=str(int(rank)), kind=kind).set(float(score))
        except Exception as exc:
            self._failed("straggler_scores", exc)


class MetricsServer:
    """A running endpoint: :attr:`recorder` to record with, :meth:`close` to stop it."""

    def __init__(self, recorder: PrometheusRecorder, httpd: Any, thread: threading.Thread) -> None:
        self.recorder = recorder
        self._httpd = httpd
        self._thread = thread
        address = httpd.server_address
        #: The address and port it listens on (the port the kernel chose for port 0).
        self.addr: str = str(address[0])
        self.port: int = int(address[1])

    @property
    def url(self) -> str:
        """Where to scrape it."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and join the server thread (idempotent)."""
        if self._httpd is None:
            return
        httpd, self._httpd = self._httpd, None
        httpd.shutdown()
        httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _prometheus_client() -> Any:
    try:
        import prometheus_client  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise RuntimeError(
            "the metrics endpoint needs prometheus_client: pip install 'nvrx-ft-launcher[metrics]'"
        ) from None
    return prometheus_client


def start_metrics_server(port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve a new recorder's metrics on ``http://addr:port/metrics`` (port 0: any free one).

    Raises RuntimeError when ``prometheus_client`` is not installed and OSError when the
    address cannot be bound: both at start-up, where the launcher exits with a usage error.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port {port!r} is not 0..65535")
    from ._metrics_http import BoundedMetricsHTTPServer

    recorder = PrometheusRecorder()
    pc = _prometheus_client()
    registry = recorder.registry
    httpd = BoundedMetricsHTTPServer(
        addr, port, lambda: bytes(pc.generate_latest(registry)), str(pc.CONTENT_TYPE_LATEST)
    )
    thread = threading.Thread(target=httpd.serve_forever, name="nvrx-metrics", daemon=True)
    thread.start()
    logger.info("metrics on http://%s:%d/metrics", addr, httpd.server_address[1])
    return MetricsServer(recorder, httpd, thread)
