"""The metrics that outlive the launcher (a textfile, a Pushgateway), the bounded straggler
series and the options' start-up checks: the real prometheus_client, a real HTTP server
on 127.0.0.1 standing in for the Pushgateway."""

from __future__ import annotations

import http.server
import logging
import os
import pathlib
import shutil
import statistics
import subprocess
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest  # type: ignore[import-not-found, unused-ignore]
from prometheus_client.parser import (  # type: ignore[import-not-found, unused-ignore]
    text_string_to_metric_families,
)

from nvrx.ft import RankStragglerScores, StragglerScores
from nvrx.launcher import ExitCode
from nvrx.launcher._straggler_feed import StragglerFeed
from nvrx.launcher.cli import main
from nvrx.launcher.goodput import Cause, account
from nvrx.launcher.metrics import MAX_SCORE_SERIES, PrometheusRecorder

pytestmark = pytest.mark.timeout(60)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
JOURNAL = [
    {"event": "run_start", "t": 0.0, "node": "a"},
    {"event": "workers_started", "t": 1.0, "node": "a", "cycle": 0},
    {"event": "first_step", "t": 5.0, "node": "a", "cycle": 0},
    {"event": "all_nodes_finished", "t": 25.0, "node": "a", "cycle": 0},
    {"event": "finished", "t": 25.0, "node": "a"},
]


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def _recorder() -> PrometheusRecorder:
    rec = PrometheusRecorder()
    rec.restart(Cause.CRASH, 0.5, 2.0)
    rec.goodput(account(JOURNAL))
    return rec


def test_the_textfile_holds_the_final_values_written_atomically(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nvrx.prom"
    path.write_text("old\n")
    rec = _recorder()
    assert rec.write_textfile(str(path))
    s = parse(path.read_text())
    assert s[("nvrx_ettr_ratio", ())] == pytest.approx(0.8)
    assert s[("nvrx_goodput_seconds", ())] == 20.0
    assert s[("nvrx_badput_seconds", (("phase", "startup"),))] == 5.0
    assert s[("nvrx_restarts_total", (("cause", "crash"),))] == 1
    assert s[("nvrx_restart_recovery_seconds_count", (("cause", "crash"),))] == 1
    assert os.listdir(tmp_path) == ["nvrx.prom"]  # the temporary file was renamed


def test_a_textfile_that_cannot_be_written_is_logged_never_raised(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    rec = _recorder()
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        assert not rec.write_textfile(str(tmp_path / "gone" / "nvrx.prom"))
    assert "cannot write the textfile" in caplog.text


class _Gateway(http.server.BaseHTTPRequestHandler):
    pushes: list[tuple[str, str, bytes]]

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.pushes.append(("PUT", self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    pushes: list[tuple[str, str, bytes]] = []
    handler = type("Handler", (_Gateway,), {"pushes": pushes})
    httpd = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", pushes
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def test_push_sends_the_final_values_to_the_gateway(
    gateway: tuple[str, list[tuple[str, str, bytes]]],
) -> None:
    url, pushes = gateway
    assert _recorder().push(url, "nvrx_launcher", {"run_id": "job-7", "instance": "node-a"})
    ((method, path, body),) = pushes
    assert method == "PUT"  # replaces the group's earlier values
    assert path == "/metrics/job/nvrx_launcher/instance/node-a/run_id/job-7"
    s = parse(body.decode())
    assert s[("nvrx_ettr_ratio", ())] == pytest.approx(0.8)
    assert s[("nvrx_restarts_total", (("cause", "crash"),))] == 1


def test_a_gateway_that_is_not_there_is_logged_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        assert not _recorder().push(f"http://127.0.0.1:{port}", "nvrx_launcher", {})
    assert "cannot push" in caplog.text


RANKS = 16_384


def _report() -> StragglerScores:
    return StragglerScores(
        written_at=1000.0,
        ranks=tuple(
            RankStragglerScores(
                rank=r,
                node=f"node-{r // 8:05d}",
                section_relative=1.0 - (r % 1000) / 2000,
                section_individual=0.9 if r % 2 else None,
                forward_s=0.1,
                step_s=0.4,
            )
            for r in range(RANKS)
        ),
        forward_section="fwd",
        step_section="train_step",
        window_start=990.0,
        window_end=1000.0,
    )


def _series(rec: PrometheusRecorder) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    text = generate_latest(rec.registry).decode()
    return [
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def test_a_16384_rank_report_exports_a_bounded_number_of_series(tmp_path: pathlib.Path) -> None:
    report = _report()
    rec = PrometheusRecorder()
    feed = StragglerFeed(tmp_path / "scores.json", metrics=rec)
    feed.start_cycle(0, 900.0)
    feed.show(report)
    series = _series(rec)
    scores = [k for k in series if k[0] == "nvrx_straggler_score"]
    assert len(scores) == 2 * MAX_SCORE_SERIES  # not 2 * 16,384
    assert len(series) < 700, len(series)  # the whole scrape
    s = parse(generate_latest(rec.registry).decode())
    relative = {int(dict(k[1])["rank"]): s[k] for k in scores if ("kind", "relative") in k[1]}
    every = report.scores("relative")
    assert max(relative.values()) <= min(v for r, v in every.items() if r not in relative)
    assert s[("nvrx_straggler_ranks", (("kind", "relative"),))] == RANKS
    assert s[("nvrx_straggler_ranks", (("kind", "individual"),))] == RANKS // 2
    median = s[("nvrx_straggler_score_median", (("kind", "relative"),))]
    assert median == pytest.approx(statistics.median(every.values()))
    assert s[("nvrx_straggler_score_median", (("kind", "individual"),))] == pytest.approx(0.9)
    feed.start_cycle(1, 1100.0)  # a new cycle: no rank's gauge stays
    s = parse(generate_latest(rec.registry).decode())
    assert not [k for k in s if k[0] == "nvrx_straggler_score"]
    assert s[("nvrx_straggler_ranks", (("kind", "relative"),))] == 0


def test_the_recorder_bounds_scores_handed_to_it_directly() -> None:
    rec = PrometheusRecorder()
    rec.straggler_scores({r: 1.0 - r / 1e5 for r in range(RANKS)})
    scores = [k for k in _series(rec) if k[0] == "nvrx_straggler_score"]
    assert len(scores) == MAX_SCORE_SERIES
    assert {int(dict(k[1])["rank"]) for k in scores} == set(range(RANKS - MAX_SCORE_SERIES, RANKS))


# -- the options, checked at start-up (exit 2 naming the option and the value) ----------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--ft-metrics-textfile", "/no/such/dir/nvrx.prom"], "does not exist"),
        (["--ft-metrics-pushgateway", "ftp://gw:9091"], "expected a Pushgateway URL"),
        (["--ft-metrics-pushgateway", "http://:9091"], "expected a Pushgateway URL"),
        (["--ft-metrics-pushgateway", "gw:99999"], "expected a Pushgateway URL"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_option_and_value(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert f"argument {argv[0]}" in err, err
    assert repr(argv[1]) in err, err
    assert says in err, err


def test_a_textfile_directory_anybody_may_write_is_refused(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    path = str(open_dir / "nvrx.prom")
    with pytest.raises(SystemExit) as info:
        main(["--ft-metrics-textfile", path, "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert f"argument --ft-metrics-textfile: {path!r}" in err, err
    assert "writable by every user and not sticky" in err


def test_the_pet_variable_is_checked_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PET_FT_METRICS_TEXTFILE", "/no/such/dir/nvrx.prom")
    with pytest.raises(SystemExit) as info:
        main(["train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert "/no/such/dir/nvrx.prom" in err, err


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_every_metric(tmp_path: pathlib.Path) -> None:
    rec = _recorder()
    rec.monitor_health(0, True)
    rec.straggler_scores({0: 1.0, 1: 0.5})
    path = tmp_path / "nvrx.prom"
    assert rec.write_textfile(str(path))
    with path.open("rb") as text:
        done = subprocess.run(
            ["promtool", "check", "metrics"], stdin=text, capture_output=True, timeout=30
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not done.stdout.strip(), done.stdout  # no lint findings either


def test_names_follow_prometheus_conventions() -> None:
    """What promtool's linter checks, where promtool is not installed: base units,
    ``_total`` only on counters, ``_info`` gauges of 1, help on every family."""
    rec = _recorder()
    rec.monitor_health(0, True)
    rec.straggler_scores({0: 1.0, 1: 0.5})
    text = generate_latest(rec.registry).decode()
    families = list(text_string_to_metric_families(text))
    assert families
    for family in families:
        assert family.name.startswith("nvrx_"), family.name
        assert family.documentation, family.name
        assert family.name == family.name.lower()
        if family.type == "counter":
            assert f"# TYPE {family.name}_total counter" in text or family.name.endswith("_total")
        else:
            assert not family.name.endswith("_total"), family.name
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
        if family.type == "info":
            assert all(s.value == 1.0 for s in family.samples)
        for unit in ("_milliseconds", "_minutes", "_hours", "_percent"):
            assert unit not in family.name, family.name
