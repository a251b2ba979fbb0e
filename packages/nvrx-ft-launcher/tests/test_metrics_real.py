"""A real ft_launcher job serving its metrics: scraped over HTTP while it runs."""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from launcher_testkit import Launcher, read_events, wait_for  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
prometheus_parser = pytest.importorskip("prometheus_client.parser")

Start = Callable[..., Launcher]


def _records(journal: pathlib.Path, event: str) -> list[dict[str, object]]:
    if not journal.exists():
        return []
    lines = journal.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return str(response.read().decode())


@pytest.mark.timeout(150)
def test_metrics_are_scraped_during_the_run_and_count_the_crash(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        [
            "--nproc-per-node", "2", "--max-restarts", "1", "--ft-journal", str(journal),
            "--ft-metrics-port", "0",
        ],
        ["--steps", "60", "--step-time", "0.1", "--fault", "raise:1:3"],
    )  # fmt: skip
    wait_for(lambda: bool(_records(journal, "run_start")), what="run_start")
    url = str(_records(journal, "run_start")[0]["metrics_url"])
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url), url
    assert url.split(":")[2].split("/")[0] != "0"
    assert f"metrics on {url}" in launcher.log()

    wait_for(lambda: bool(_records(journal, "restart")), what="the restart")
    wait_for(
        lambda: any(e["event"] == "step" and e["cycle"] == 1 for e in read_events(launcher.out)),
        what="a step after the restart",
    )
    text = _scrape(url)
    assert launcher.proc.poll() is None, "the run ended before the scrape"
    assert re.search(r'^nvrx_restarts_total\{cause="crash"\} 1\.0$', text, re.M), text
    assert re.search(r'^nvrx_monitor_up\{local_rank="1"\} 1\.0$', text, re.M), text
    detection = r'^nvrx_fault_detection_seconds_count\{cause="crash"\} 1\.0$'
    assert re.search(detection, text, re.M), text
    assert re.search(r"^nvrx_ettr_ratio ", text, re.M), text

    assert launcher.wait() == ExitCode.SUCCESS, launcher.log()
    with pytest.raises(urllib.error.URLError):  # closed with the launcher
        _scrape(url)


class _Gateway(http.server.BaseHTTPRequestHandler):
    pushes: list[tuple[str, bytes]]

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.pushes.append((self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in prometheus_parser.text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.timeout(150)
def test_the_final_values_outlive_the_launcher_in_a_textfile_and_the_gateway(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    pushes: list[tuple[str, bytes]] = []
    httpd = http.server.HTTPServer(
        ("127.0.0.1", 0), type("Handler", (_Gateway,), {"pushes": pushes})
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    textfile = tmp_path / "nvrx.prom"
    journal = tmp_path / "journal.jsonl"
    try:
        launcher = start_launcher(
            [
                "--nproc-per-node", "2", "--max-restarts", "1", "--ft-journal", str(journal),
                "--ft-metrics-textfile", str(textfile),
                "--ft-metrics-pushgateway", f"127.0.0.1:{httpd.server_address[1]}",
            ],
            ["--steps", "10", "--step-time", "0.1", "--fault", "raise:1:3"],
        )  # fmt: skip
        assert launcher.wait() == ExitCode.SUCCESS, launcher.log()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
    assert f"final metrics written to {textfile}" in launcher.log()
    ((path, body),) = pushes
    (run_start,) = _records(journal, "run_start")
    assert path == (
        f"/metrics/job/nvrx_launcher/instance/{socket.gethostname()}/run_id/{run_start['run_id']}"
    )
    for s in (_samples(textfile.read_text()), _samples(body.decode())):
        assert s[("nvrx_restarts_total", (("cause", "crash"),))] == 1
        assert s[("nvrx_restart_recovery_seconds_count", (("cause", "crash"),))] == 1
        assert 0 < s[("nvrx_ettr_ratio", ())] < 1
        assert s[("nvrx_goodput_seconds", ())] > 0
        assert s[("nvrx_badput_seconds", (("phase", "detection"),))] >= 0
        assert s[("nvrx_badput_seconds", (("phase", "spawn"),))] > 0
        assert "nvrx_build_info" in {k[0] for k in s}
    assert sorted(os.listdir(tmp_path)).count("nvrx.prom") == 1
    assert not [n for n in os.listdir(tmp_path) if n.startswith("nvrx.prom.")]  # no temp left


@pytest.mark.timeout(60)
def test_a_port_in_use_is_a_usage_error_naming_it(start_launcher: Start) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        launcher = start_launcher(["--nproc-per-node", "1", "--ft-metrics-port", str(port)])
        assert launcher.wait(50) == ExitCode.USAGE_ERROR, launcher.log()
    assert f"--ft-metrics-port {port}" in launcher.log()
