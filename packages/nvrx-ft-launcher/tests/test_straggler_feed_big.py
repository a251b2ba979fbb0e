"""A big straggler report is read by a child process, never on the launcher's tick, and
its gauges are bounded to the lowest scores (figures: ``nox -s bench``,
``feed_max_131072_ranks_tick_stall_ms``)."""

from __future__ import annotations

import os
import pathlib
import time

import psutil
import pytest

from nvrx.ft import RankStragglerScores, StragglerScores, write_straggler_scores
from nvrx.launcher._straggler_feed import SYNC_READ_BYTES, StragglerFeed
from nvrx.launcher._straggler_summary import MAX_SCORE_GAUGES
from nvrx.launcher.metrics import PrometheusRecorder

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]
RANKS = 12_000


def _big(written_at: float) -> StragglerScores:
    return StragglerScores(
        written_at=written_at,
        ranks=tuple(
            RankStragglerScores(
                rank=r,
                node=f"node-{r // 8:05d}",
                section_relative=1.0 - (r % 1000) / 2000,
                section_individual=0.9,
                forward_s=0.1 + (r % 1000) / 1e4,
                step_s=0.4,
            )
            for r in range(RANKS)
        ),
        forward_section="fwd",
        step_section="train_step",
        window_start=written_at - 10,
        window_end=written_at,
    )


def _poll_until_read(feed: StragglerFeed) -> StragglerScores:
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        got = feed.poll()
        if got is not None:
            return got
        time.sleep(0.05)
    raise AssertionError("the child never delivered the report")


def test_a_big_report_is_summarised_by_a_child_and_its_gauges_are_bounded(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "straggler_scores.json"
    report = _big(time.time() - 5)
    write_straggler_scores(path, report)
    assert os.path.getsize(path) > SYNC_READ_BYTES
    recorder = PrometheusRecorder()
    feed = StragglerFeed(path, period_s=0.0, metrics=recorder)
    feed.start_cycle(0, report.written_at - 100)
    assert feed.poll() is None  # a child reads it; the tick goes on
    children = [c for c in _children() if "_straggler_summary" in c]
    assert children, "no summary child"
    got = _poll_until_read(feed)
    assert got.written_at == report.written_at
    assert got.ranks == ()  # the ranks stayed in the child
    assert feed.rank_count(got) == RANKS
    assert feed.worst(got) == report.worst("relative")
    wait = feed.wait(got)
    assert wait is not None
    assert wait.fraction == pytest.approx(report.wait_fraction())
    feed.show(got)
    for kind in ("relative", "individual"):
        series = recorder._scores.collect()[0].samples
        shown = {int(s.labels["rank"]): s.value for s in series if s.labels["kind"] == kind}
        assert len(shown) == MAX_SCORE_GAUGES
        every = report.scores(kind)
        assert max(shown.values()) <= min(v for r, v in every.items() if r not in shown)
    assert feed.poll() is None  # unchanged: no new child


def test_a_big_bad_file_is_ignored_once(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "straggler_scores.json"
    path.write_text("[" + "1," * (SYNC_READ_BYTES // 2) + "1")  # big and not JSON
    ignored: list[str] = []
    feed = StragglerFeed(path, period_s=0.0, on_ignored=ignored.append)
    assert feed.poll() is None
    deadline = time.monotonic() + 150
    while not ignored and time.monotonic() < deadline:
        assert feed.poll() is None
        time.sleep(0.05)
    assert len(ignored) == 1
    assert "JSON" in ignored[0] or "json" in ignored[0], ignored
    for _ in range(3):
        assert feed.poll() is None
    assert len(ignored) == 1


def _children() -> list[str]:
    out = []
    for child in psutil.Process().children():
        try:
            out.append(" ".join(child.cmdline()))
        except psutil.Error:
            continue
    return out
