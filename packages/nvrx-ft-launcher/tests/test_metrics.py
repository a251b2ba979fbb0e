"""The Prometheus endpoint: the real library, scraped over real HTTP on 127.0.0.1."""

from __future__ import annotations

import importlib.metadata
import logging
import math
import platform
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import (  # type: ignore[import-not-found, unused-ignore]
    text_string_to_metric_families,
)

import nvrx.launcher
from nvrx.launcher.goodput import Cause, Phase, account
from nvrx.launcher.metrics import (
    DETECTION_BUCKETS,
    NULL_RECORDER,
    MetricsServer,
    start_metrics_server,
)

pytestmark = pytest.mark.timeout(60)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    srv = start_metrics_server(0)
    try:
        yield srv
    finally:
        srv.close()


def scrape(srv: MetricsServer) -> tuple[str, Samples]:
    with urllib.request.urlopen(srv.url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def test_bound_to_loopback_on_a_free_port(server: MetricsServer) -> None:
    assert server.addr == "127.0.0.1"
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}/metrics"
    text, samples = scrape(server)
    # only our own registry: none of the process's default collectors
    assert "process_cpu_seconds_total" not in text
    assert "python_info" not in text
    assert samples[("nvrx_ettr_ratio", ())] == 0.0


def test_build_info_names_the_nvrx_torch_and_python_versions(server: MetricsServer) -> None:
    _, samples = scrape(server)
    (labels,) = [dict(k[1]) for k in samples if k[0] == "nvrx_build_info"]
    assert labels == {
        "nvrx_version": nvrx.launcher.__version__,
        "torch_version": importlib.metadata.version("torch"),
        "python_version": platform.python_version(),
    }
    assert samples[("nvrx_build_info", tuple(sorted(labels.items())))] == 1.0


def test_restarts_latencies_goodput_health_and_scores(server: MetricsServer) -> None:
    rec = server.recorder
    rec.restart(Cause.HANG, 12.5, 3.0)
    rec.restart(Cause.HANG, 0.04, None)
    rec.restart(Cause.CRASH, None, 0.2)
    rec.monitor_health(0, True)
    rec.monitor_health(1, False)
    rec.straggler_scores({0: 1.0, 1: 0.5, 2: math.nan})
    rec.straggler_scores({0: 0.9, 1: 0.95})  # rank 2 is gone from this report
    rec.straggler_scores({3: 0.7}, kind="individual")
    journal = [
        {"event": "run_start", "t": 0.0, "node": "a"},
        {"event": "workers_started", "t": 1.0, "node": "a", "cycle": 0},
        {"event": "first_step", "t": 5.0, "node": "a", "cycle": 0},
        {"event": "all_nodes_finished", "t": 25.0, "node": "a", "cycle": 0},
        {"event": "finished", "t": 25.0, "node": "a"},
    ]
    rec.goodput(account(journal))
    text, s = scrape(server)
    assert s[("nvrx_restarts_total", (("cause", "hang"),))] == 2
    assert s[("nvrx_restarts_total", (("cause", "crash"),))] == 1
    hang = (("cause", "hang"),)
    assert s[("nvrx_fault_detection_seconds_count", hang)] == 2
    assert s[("nvrx_fault_detection_seconds_sum", hang)] == pytest.approx(12.54)
    assert s[("nvrx_fault_detection_seconds_bucket", (*hang, ("le", "0.05")))] == 1
    assert s[("nvrx_fault_detection_seconds_bucket", (*hang, ("le", "+Inf")))] == 2
    assert ("nvrx_fault_detection_seconds_count", (("cause", "crash"),)) not in s
    buckets = [k for k in s if k[0] == "nvrx_fault_detection_seconds_bucket"]
    assert len(buckets) == len(DETECTION_BUCKETS) + 1  # one trigger observed
    assert s[("nvrx_restart_recovery_seconds_count", hang)] == 1
    assert s[("nvrx_restart_recovery_seconds_count", (("cause", "crash"),))] == 1
    assert s[("nvrx_restart_recovery_seconds_sum", (("cause", "crash"),))] == pytest.approx(0.2)
    # goodput: productive time only; every other phase is badput
    assert s[("nvrx_goodput_seconds", ())] == 20.0
    assert s[("nvrx_badput_seconds", (("phase", "startup"),))] == 5.0
    badput = {k[1][0][1] for k in s if k[0] == "nvrx_badput_seconds"}
    assert badput == {p.value for p in Phase} - {"productive"}
    assert sum(v for k, v in s.items() if k[0] == "nvrx_badput_seconds") == 5.0
    assert s[("nvrx_ettr_ratio", ())] == pytest.approx(0.8)
    assert s[("nvrx_monitor_up", (("local_rank", "0"),))] == 1
    assert s[("nvrx_monitor_up", (("local_rank", "1"),))] == 0
    assert s[("nvrx_straggler_score", (("kind", "relative"), ("rank", "0")))] == 0.9
    assert s[("nvrx_straggler_score", (("kind", "relative"), ("rank", "1")))] == 0.95
    assert ("nvrx_straggler_score", (("kind", "relative"), ("rank", "2"))) not in s
    assert s[("nvrx_straggler_score", (("kind", "individual"), ("rank", "3")))] == 0.7
    assert s[("nvrx_straggler_ranks", (("kind", "relative"),))] == 2
    assert s[("nvrx_straggler_score_median", (("kind", "relative"),))] == pytest.approx(0.925)
    assert "# TYPE nvrx_restarts_total counter" in text
    assert "# TYPE nvrx_fault_detection_seconds histogram" in text


def test_bad_values_are_logged_once_never_raised(
    server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    rec = server.recorder
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        rec.restart("meteor", 1.0, 1.0)  # type: ignore[arg-type]
        rec.straggler_scores({0: 1.0}, kind="absolute")
        rec.restart(Cause.CRASH, -1.0, math.inf)  # not observed
    assert sum("metrics:" in r.getMessage() for r in caplog.records) == 1
    _, s = scrape(server)
    assert s[("nvrx_restarts_total", (("cause", "crash"),))] == 1
    assert not any(k[0] == "nvrx_fault_detection_seconds_count" for k in s)
    assert not any(k[0] == "nvrx_straggler_score" for k in s)


def test_close_stops_serving_and_a_taken_port_is_an_error() -> None:
    srv = start_metrics_server(0)
    port = srv.port
    with pytest.raises(OSError):  # noqa: PT011 - EADDRINUSE
        start_metrics_server(port)
    srv.close()
    srv.close()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):  # noqa: PT011
        pass
    with pytest.raises(ValueError, match="port"):
        start_metrics_server(70000)


def test_off_costs_nothing_prometheus_client_not_imported() -> None:
    code = (
        "import sys\n"
        "from nvrx.launcher.metrics import NULL_RECORDER\n"
        "from nvrx.launcher.goodput import Cause\n"
        "NULL_RECORDER.restart(Cause.HANG, 1.0, 2.0)\n"
        "NULL_RECORDER.monitor_health(0, False)\n"
        "NULL_RECORDER.straggler_scores({0: 1.0})\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    NULL_RECORDER.goodput(account([]))  # in this process too: nothing to set, no error
