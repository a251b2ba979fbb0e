"""Optional Prometheus metrics per launcher: restarts, latencies, goodput, health, scores.

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

- ``nvrx_build_info{nvrx_version,torch_version,python_version}``: always 1;
- ``nvrx_restarts_total{cause}``: restarts by :class:`~nvrx.launcher.goodput.Cause`;
- ``nvrx_fault_detection_seconds{cause}``: histogram, a fault's earliest sign to the
  decision, by what triggered the restart;
- ``nvrx_restart_recovery_seconds{cause}``: histogram, the decision to the new cycle's
  first step (to its ranks' start when the first step is not known), by trigger;
- ``nvrx_goodput_seconds``: the productive wall time only;
  ``nvrx_badput_seconds{phase}``: the rest, by :class:`~nvrx.launcher.goodput.Phase`
  (every phase but ``productive``); ``nvrx_ettr_ratio``: productive / wall time;
- ``nvrx_monitor_up{local_rank}``: 1 while the rank monitor of that local rank is healthy;
- ``nvrx_straggler_score{rank,kind}``: the last straggler score of at most
  :data:`MAX_SCORE_SERIES` ranks per kind, the lowest (the stragglers; ``kind``
  ``relative`` or ``individual``; NaN where the rank had nothing comparable), with
  ``nvrx_straggler_ranks{kind}`` (how many ranks the report scored) and
  ``nvrx_straggler_score_median{kind}`` (over all of them) as the summary, so a scrape
  of a 16,384-rank job holds a few hundred series, not 32,768.

Besides the endpoint, a job's final values can outlive the launcher:
:meth:`PrometheusRecorder.write_textfile` writes them for node_exporter's textfile
collector (``--ft-metrics-textfile``) and :meth:`PrometheusRecorder.push` sends them to a
Pushgateway (``--ft-metrics-pushgateway``), both with ``prometheus_client``'s own functions.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import platform
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._events import Event, MonitorDied
from ._straggler_summary import MAX_SCORE_GAUGES, lowest, median_score
from .goodput import Cause, Goodput, Phase

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "DETECTION_BUCKETS",
    "MAX_SCORE_SERIES",
    "NULL_RECORDER",
    "PUSH_TIMEOUT_S",
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
#: How long a push to the Pushgateway may take (it happens once, as the launcher exits).
PUSH_TIMEOUT_S = 10.0
#: ``nvrx_straggler_score`` series per kind at most: the lowest scores of a report.
MAX_SCORE_SERIES = MAX_SCORE_GAUGES


class NullRecorder:
    """The recorder API; this one does nothing (the endpoint is off)."""

    def restart(self, cause: Cause, detection_s: float | None, recovery_s: float | None) -> None:
        """Count a restart of ``cause`` and observe its latencies (None: not known)."""

    def goodput(self, summary: Goodput) -> None:
        """Publish the job's goodput split and ETTR so far."""

    def monitor_health(self, local_rank: int, healthy: bool) -> None:
        """Say whether the rank monitor of ``local_rank`` is healthy."""

    def on_event(self, event: Event, record: Mapping[str, Any]) -> None:
        """A subscriber of the launcher's event bus: a monitor that died is unhealthy."""
        if isinstance(event, MonitorDied):
            self.monitor_health(event.local_rank, False)

    def straggler_scores(
        self,
        scores: Mapping[int, float],
        kind: str = "relative",
        *,
        ranks: int | None = None,
        median: float | None = None,
    ) -> None:
        """Publish the last report's straggler scores of ``kind`` (replacing older ones).

        Only the :data:`MAX_SCORE_SERIES` lowest of ``scores`` become series. ``ranks``
        and ``median`` describe the whole report when ``scores`` holds only its lowest
        (None: computed from ``scores``).
        """


#: The recorder the agent holds while the endpoint is off.
NULL_RECORDER = NullRecorder()


class PrometheusRecorder(NullRecorder):
    """Keeps the metrics in its own ``prometheus_client`` registry (:attr:`registry`)."""

    def __init__(self) -> None:
        pc = _prometheus_client()
        self._pc = pc
        self.registry: Any = pc.CollectorRegistry(auto_describe=True)
        reg = self.registry
        self._build = pc.Info(
            "nvrx_build", "The versions of nvrx, torch and Python this launcher runs.", registry=reg
        )
        self._build.info(_build_info())
        self._restarts = pc.Counter(
            "nvrx_restarts", "Restarts of the job's ranks, by cause.", ["cause"], registry=reg
        )
        self._detection = pc.Histogram(
            "nvrx_fault_detection_seconds",
            "From a fault's earliest sign (a hung rank's last heartbeat, a crash) to the "
            "decision, by what triggered the restart.",
            ["cause"],
            buckets=DETECTION_BUCKETS,
            registry=reg,
        )
        self._recovery = pc.Histogram(
            "nvrx_restart_recovery_seconds",
            "From the restart decision to the new cycle's first step (or its ranks' start), "
            "by what triggered the restart.",
            ["cause"],
            buckets=RECOVERY_BUCKETS,
            registry=reg,
        )
        self._goodput = pc.Gauge(
            "nvrx_goodput_seconds",
            "Productive wall time of the job: steps that were not recomputed.",
            registry=reg,
        )
        self._badput = pc.Gauge(
            "nvrx_badput_seconds",
            "Wall time of the job that was not productive, by phase.",
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
            f"Last straggler score of the {MAX_SCORE_SERIES} lowest-scored ranks per kind "
            "(1.0: as fast as the reference).",
            ["rank", "kind"],
            registry=reg,
        )
        self._score_ranks_total = pc.Gauge(
            "nvrx_straggler_ranks",
            "Ranks the last straggler report scored, by kind (nvrx_straggler_score holds "
            "the lowest of them).",
            ["kind"],
            registry=reg,
        )
        self._score_median = pc.Gauge(
            "nvrx_straggler_score_median",
            "Median straggler score of the last report over all its ranks, by kind.",
            ["kind"],
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
            label = Cause(cause).value
            self._restarts.labels(cause=label).inc()
            for hist, value in ((self._detection, detection_s), (self._recovery, recovery_s)):
                if value is not None and math.isfinite(value) and value >= 0:
                    hist.labels(cause=label).observe(value)
        except Exception as exc:  # monitoring never breaks the launcher
            self._failed("restart", exc)

    def goodput(self, summary: Goodput) -> None:
        """Publish the job's goodput split and ETTR so far."""
        try:
            self._goodput.set(summary.seconds.get(Phase.PRODUCTIVE, 0.0))
            for phase in Phase:
                if phase is not Phase.PRODUCTIVE:
                    self._badput.labels(phase=phase.value).set(summary.seconds.get(phase, 0.0))
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

    def straggler_scores(
        self,
        scores: Mapping[int, float],
        kind: str = "relative",
        *,
        ranks: int | None = None,
        median: float | None = None,
    ) -> None:
        """Publish the last report's straggler scores of ``kind`` (replacing older ones).

        Only the :data:`MAX_SCORE_SERIES` lowest of ``scores`` become series. ``ranks``
        and ``median`` describe the whole report when ``scores`` holds only its lowest
        (None: computed from ``scores``).
        """
        try:
            if kind not in _SCORE_KINDS:
                raise ValueError(f"kind {kind!r} is not one of {sorted(_SCORE_KINDS)}")
            every = {int(r): float(v) for r, v in scores.items()}
            shown = lowest(every, MAX_SCORE_SERIES)
            if ranks is None:
                ranks = len(every)
            if median is None:
                median = median_score(every.values())
            with self._lock:  # a rank gone from the report is gone from the endpoint
                for gone in self._score_ranks.get(kind, set()) - shown.keys():
                    self._scores.remove(str(gone), kind)
                self._score_ranks[kind] = set(shown)
                for rank, score in shown.items():
                    self._scores.labels(rank=str(rank), kind=kind).set(score)
                self._score_ranks_total.labels(kind=kind).set(ranks)
                self._score_median.labels(kind=kind).set(math.nan if median is None else median)
        except Exception as exc:
            self._failed("straggler_scores", exc)

    def write_textfile(self, path: str) -> bool:
        """Write the metrics' current values to ``path`` for node_exporter's textfile
        collector, atomically (``prometheus_client.write_to_textfile``: a temporary file
        in the same directory, then a rename). Never raises: False (logged) on failure."""
        try:
            self._pc.write_to_textfile(path, self.registry)
        except Exception as exc:
            logger.warning("metrics: cannot write the textfile %s: %r", path, exc)
            return False
        logger.info("final metrics written to %s", path)
        return True

    def push(self, gateway: str, job: str, grouping_key: Mapping[str, str]) -> bool:
        """Push the metrics' current values to a Pushgateway (``push_to_gateway``: they
        replace the group's earlier ones). Never raises: False (logged) on failure."""
        try:
            self._pc.push_to_gateway(
                gateway, job=job, registry=self.registry, grouping_key=dict(grouping_key),
                timeout=PUSH_TIMEOUT_S,
            )  # fmt: skip
        except Exception as exc:
            logger.warning("metrics: cannot push to the Pushgateway %s: %r", gateway, exc)
            return False
        logger.info("final metrics pushed to %s", gateway)
        return True


def _build_info() -> dict[str, str]:
    """The labels of ``nvrx_build_info``: installed versions, read without importing torch."""

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except Exception:  # not installed, or metadata unreadable
            return "unknown"

    return {
        "nvrx_version": version("nvrx-ft-launcher"),
        "torch_version": version("torch"),
        "python_version": platform.python_version(),
    }


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
