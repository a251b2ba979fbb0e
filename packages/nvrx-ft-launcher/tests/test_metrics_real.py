"""A real ft_launcher job serving its metrics: scraped over HTTP while it runs."""

from __future__ import annotations

import json
import pathlib
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from launcher_testkit import Launcher, read_events, wait_for  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
pytest.importorskip("prometheus_client")

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
    assert re.search(r"^nvrx_fault_detection_seconds_count 1\.0$", text, re.M), text
    assert re.search(r"^nvrx_ettr_ratio ", text, re.M), text

    assert launcher.wait() == ExitCode.SUCCESS, launcher.log()
    with pytest.raises(urllib.error.URLError):  # closed with the launcher
        _scrape(url)


@pytest.mark.timeout(60)
def test_a_port_in_use_is_a_usage_error_naming_it(start_launcher: Start) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        launcher = start_launcher(["--nproc-per-node", "1", "--ft-metrics-port", str(port)])
        assert launcher.wait(50) == ExitCode.USAGE_ERROR, launcher.log()
    assert f"--ft-metrics-port {port}" in launcher.log()
