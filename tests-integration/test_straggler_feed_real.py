"""Straggler reports reach the launcher: a real ft_launcher, two gloo ranks, a real scrape.

Rank 0 (scripts/straggler_rank.py) first writes a file the launcher must refuse, then
publishes a report with forward times 0.1 s and 0.2 s in steps of 0.4 s over a window
it measured. The launcher journals the refusal once and the report as
``straggler_report``, serves ``nvrx_straggler_score`` for both ranks on its metrics
endpoint, and the job summary charges the window times the wait fraction
((max - median) / step = (0.2 - 0.15) / 0.4 = 0.125) to ``straggler_wait``. The last
report, published as rank 0 ends and not flushed, is journaled and charged too.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import stat
import urllib.request

import pytest
from conftest import Launch
from itest_harness import HERE, journal_events

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]
pytest.importorskip("prometheus_client")

SCRIPT = HERE / "scripts" / "straggler_rank.py"


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return str(response.read().decode())


def _gauge(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if found == labels:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_rank_zeros_report_reaches_journal_metrics_and_goodput(
    launch: Launch, out_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    journal = tmp_path / "ft-journal.jsonl"
    run = launch(
        ["--journal", str(journal)],
        [f"--ft-journal={journal}", "--ft-metrics-port=0"],
        script=SCRIPT,
        nproc=2,
    )
    run.wait_until(lambda: bool(journal_events(journal, "straggler_report")), 120, "the report")
    [ignored] = journal_events(journal, "straggler_report_ignored")
    assert "not valid JSON" in ignored["why"], ignored
    published = json.loads((out_dir / "published.json").read_text())
    assert published["ok"] is True
    scores_file = pathlib.Path(published["path"])
    assert stat.S_IMODE(scores_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(scores_file.parent.stat().st_mode) == 0o700  # the launcher's own dir
    [report] = journal_events(journal, "straggler_report")
    assert (report["window_start"], report["window_end"]) == (published["start"], published["end"])
    assert report["wait_fraction"] == pytest.approx((0.2 - 0.15) / 0.4)
    assert (report["ranks"], report["worst_rank"]) == (2, 1)
    assert (report["forward_section"], report["step_section"]) == ("fwd", "train_step")
    assert report["worst_score"] == pytest.approx(0.5)

    [start] = journal_events(journal, "run_start")
    text = _scrape(str(start["metrics_url"]))
    assert run.proc.poll() is None, "the run ended before the scrape"
    assert _gauge(text, "nvrx_straggler_score", kind="relative", rank="0") == 1.0, text
    assert _gauge(text, "nvrx_straggler_score", kind="relative", rank="1") == 0.5, text
    assert _gauge(text, "nvrx_straggler_score", kind="individual", rank="0") == 0.9, text
    assert _gauge(text, "nvrx_straggler_score", kind="individual", rank="1") == 0.9, text
    wait_gauge = _gauge(text, "nvrx_badput_seconds", phase="straggler_wait")
    assert wait_gauge is not None, text
    assert wait_gauge > 0, text

    (out_dir / "go").touch()
    run.expect_exit(0, 120)
    # The report rank 0 published as it ended, unflushed, is journaled too (written at
    # the rank's exit, read by the launcher at the job's end).
    final = json.loads((out_dir / "final.json").read_text())
    [_, last] = journal_events(journal, "straggler_report")
    assert (last["window_start"], last["window_end"]) == (final["start"], final["end"])
    [summary] = journal_events(journal, "job_goodput")
    window = published["end"] - published["start"]
    assert window > 1.0
    # hand check: both windows lie inside the cycle's training time (no first_step
    # records: from the ranks' start to all_nodes_finished), so all of them counts
    [started] = journal_events(journal, "workers_started")
    [finished] = journal_events(journal, "all_nodes_finished")
    assert started["t"] <= published["start"] < published["end"] <= final["end"] <= finished["t"]
    seconds = summary["summary"]["seconds"]
    waited = 0.125 * (window + final["end"] - final["start"])
    assert seconds["straggler_wait"] == pytest.approx(waited, abs=1e-6)
    assert not os.path.exists(scores_file)  # went with the launcher's runtime dir


def test_a_restart_clears_the_gauges_and_the_last_report_keeps_its_cycle(
    launch: Launch, out_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Review findings 4 and 7: cycle 0's rank 0 reports just before the fault; in cycle 1
    no gauge of cycle 0 is served and the report is journaled as cycle 0's."""
    journal = tmp_path / "ft-journal.jsonl"
    run = launch(
        ["--journal", str(journal), "--restart"],
        [f"--ft-journal={journal}", "--ft-metrics-port=0", "--max-restarts=1"],
        script=SCRIPT,
        nproc=2,
    )
    run.wait_until(lambda: (out_dir / "cycle1").exists(), 120, "cycle 1")
    run.wait_until(lambda: bool(journal_events(journal, "straggler_report")), 30, "the report")
    [report] = journal_events(journal, "straggler_report")
    assert report["cycle"] == 0, report
    assert report["wait_fraction"] == pytest.approx((0.2 - 0.15) / 0.4)
    cycles = [r["cycle"] for r in journal_events(journal, "workers_started")]
    assert cycles == [0, 1], cycles
    [start] = journal_events(journal, "run_start")
    text = _scrape(str(start["metrics_url"]))
    assert run.proc.poll() is None, "the run ended before the scrape"
    assert "nvrx_straggler_score{" not in text, text
    (out_dir / "go").touch()
    run.expect_exit(0, 120)
