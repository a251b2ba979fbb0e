"""The launcher's side of the straggler-scores file: read when it changes, a bad file ignored."""

from __future__ import annotations

import json
import logging
import os
import pathlib

import jsonschema  # type: ignore[import-untyped]
import pytest

from nvrx.ft import RankStragglerScores, StragglerScores, write_straggler_scores
from nvrx.launcher._events import Recorder, StragglerReported, StragglerReportIgnored
from nvrx.launcher._straggler_feed import StragglerFeed
from nvrx.launcher.goodput import Phase, StragglerWait, account
from nvrx.launcher.journal import JsonLines, schema_path
from nvrx.launcher.metrics import PrometheusRecorder

pytestmark = pytest.mark.timeout(30)


class Clock:
    """A clock the test moves (the feed's period is in its time)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _scores(
    written_at: float,
    forward: dict[int, float],
    window_start: float | None = None,
    window_end: float | None = None,
    step: float | None = None,
) -> StragglerScores:
    """A report: each rank's forward median, and every rank's whole step ``step`` (if given)."""
    fastest = min(forward.values())
    return StragglerScores(
        written_at=written_at,
        ranks=tuple(
            RankStragglerScores(
                rank=r, node="n", section_relative=fastest / f, forward_s=f, step_s=step
            )
            for r, f in forward.items()
        ),
        forward_section="fwd",
        step_section=None if step is None else "train_step",
        window_start=window_start,
        window_end=window_end,
    )


def test_a_changing_file_is_read_once_per_version_and_at_most_once_a_period(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "straggler_scores.json"
    clock = Clock()
    feed = StragglerFeed(path, clock=clock, period_s=1.0)
    assert feed.poll() is None  # no file yet
    first = _scores(1000.0, {0: 0.1, 1: 0.2}, window_start=990.0, window_end=1000.0)
    write_straggler_scores(path, first)
    assert feed.poll() is None  # within the period: not even a stat
    clock.now += 1.0
    assert feed.poll() == first
    clock.now += 1.0
    assert feed.poll() is None  # unchanged
    second = _scores(1010.0, {0: 0.1, 1: 0.1})
    write_straggler_scores(path, second)
    clock.now += 1.0
    assert feed.poll() == second


def test_the_wait_is_the_window_times_the_reports_wait_fraction() -> None:
    feed = StragglerFeed("/nonexistent")
    first = _scores(1000.0, {0: 0.1, 1: 0.1, 2: 0.2}, 990.0, 1000.0, step=0.4)
    assert feed.wait(first) == StragglerWait(990.0, 1000.0, 0.25)  # (0.2 - 0.1) / 0.4
    # no window of its own: from the previous report's end to this one's writing
    second = _scores(1020.0, {0: 0.3, 1: 0.4})  # no step times: 1 - median / max
    wait = feed.wait(second)
    assert wait is not None
    assert (wait.start, wait.end) == (1000.0, 1020.0)
    assert wait.fraction == pytest.approx(1 - 0.35 / 0.4)
    assert feed.wait(_scores(1030.0, {0: 0.3})) is None  # one rank: nobody waits for anyone
    assert StragglerFeed("/x").wait(_scores(1.0, {0: 0.1, 1: 0.2})) is None  # no window at all


def test_a_window_starts_no_earlier_than_the_previous_one_ended() -> None:
    """Review finding 2: a window reaching back over the last one counted that time twice."""
    feed = StragglerFeed("/nonexistent")
    assert feed.wait(_scores(100.0, {0: 0.1, 1: 0.2}, 0.0, 100.0)) is not None
    wait = feed.wait(_scores(200.0, {0: 0.1, 1: 0.2}, 50.0, 200.0))
    assert wait is not None
    assert (wait.start, wait.end) == (100.0, 200.0)
    assert feed.wait(_scores(210.0, {0: 0.1, 1: 0.2}, 20.0, 150.0)) is None  # all seen before


def test_a_new_cycle_clears_the_score_gauges_and_the_window_fallback() -> None:
    """Review findings 4 and 7: the last cycle's ranks kept their gauges; a report written
    just before a fault was journaled with the next cycle; its end started the next window."""
    pytest.importorskip("prometheus_client")
    import prometheus_client

    metrics = PrometheusRecorder()
    feed = StragglerFeed("/nonexistent", metrics=metrics)

    def gauges() -> dict[str, float]:
        text = prometheus_client.generate_latest(metrics.registry).decode()
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("nvrx_straggler_score{")
        }

    feed.start_cycle(0, 1000.0)
    last = _scores(1090.0, {0: 0.1, 1: 0.2, 2: 0.1, 3: 0.1}, step=0.5)
    feed.show(last)
    assert feed.wait(last) is None  # no window and none before it
    assert len(gauges()) == 4  # relative scores of ranks 0..3 (no individual ones)
    feed.start_cycle(1, 1100.0)  # rank 0 now elsewhere, two ranks: none of these stays
    assert gauges() == {}
    assert feed.cycle_of(last) == 0  # written before cycle 1 started: cycle 0's
    new = _scores(1150.0, {0: 0.1, 1: 0.1}, step=0.5)
    assert feed.cycle_of(new) == 1
    assert feed.wait(new) is None  # no window reaching back from cycle 0's report
    feed.show(new)
    assert sorted(gauges()) == [
        'nvrx_straggler_score{kind="relative",rank="0"}',
        'nvrx_straggler_score{kind="relative",rank="1"}',
    ]


def test_a_link_or_a_file_of_another_user_is_ignored(tmp_path: pathlib.Path) -> None:
    real = tmp_path / "elsewhere.json"
    write_straggler_scores(real, _scores(1.0, {0: 0.1, 1: 0.2}))
    path = tmp_path / "straggler_scores.json"
    path.symlink_to(real)
    ignored: list[str] = []
    assert StragglerFeed(path, on_ignored=ignored.append).poll() is None
    assert ignored == ["a symbolic link"]
    if os.geteuid() == 0:
        path.unlink()
        write_straggler_scores(path, _scores(1.0, {0: 0.1, 1: 0.2}))
        os.chown(path, 4242, 4242)
        assert StragglerFeed(path, on_ignored=ignored.append).poll() is None
        assert "owned by uid 4242" in ignored[-1]


def test_a_bad_file_is_ignored_once_per_version_with_one_warning(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "straggler_scores.json"
    clock = Clock()
    ignored: list[str] = []
    feed = StragglerFeed(path, clock=clock, on_ignored=ignored.append)
    caplog.set_level(logging.DEBUG, logger="nvrx.launcher")
    path.write_text('{"schema_version": 1, "written_at": "soon"}')
    assert feed.poll() is None
    clock.now += 5
    assert feed.poll() is None  # the same bad version: not again
    path.write_text("not json")
    os.utime(path, ns=(1, 1))  # a new version even on a coarse clock
    clock.now += 5
    assert feed.poll() is None
    assert len(ignored) == 2
    assert "missing" in ignored[0]
    assert "not valid JSON" in ignored[1]
    levels = [r.levelno for r in caplog.records if "straggler scores" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG]
    good = _scores(5.0, {0: 0.1, 1: 0.2})
    write_straggler_scores(path, good)
    clock.now += 5
    assert feed.poll() == good  # a good report after bad ones is read


def test_on_ignored_failing_does_not_raise(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "s.json"
    path.write_text("[]")

    def fail(why: str) -> None:
        raise RuntimeError(why)

    assert StragglerFeed(path, on_ignored=fail).poll() is None


def test_the_records_validate_and_the_ledger_takes_the_wait_from_them(
    tmp_path: pathlib.Path,
) -> None:
    journal = tmp_path / "j.jsonl"
    recorder = Recorder(JsonLines(journal, node="n"), JsonLines(None))
    recorder.record(
        StragglerReported(0, 1000.0, 990.0, 1000.0, 0.25, "fwd", "train_step", 2, 1, 0.5)
    )
    recorder.record(StragglerReported(0, 1010.0, None, None, None, None, None, 2, None, None))
    recorder.record(StragglerReportIgnored(0, "/run/x/straggler_scores.json", "not valid JSON"))
    schema = json.loads(schema_path("journal").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    for line in lines:
        validator.validate(line)
    assert not validator.is_valid({**lines[0], "wait_fraction": 1.5})
    assert not validator.is_valid({k: v for k, v in lines[0].items() if k != "worst_rank"})
    run = [
        {"event": "run_start", "t": 900.0, "node": "n"},
        {"event": "workers_started", "t": 950.0, "node": "n", "cycle": 0, "group_rank": 0},
        *lines,
        {"event": "all_nodes_finished", "t": 1100.0, "node": "n", "cycle": 0},
        {"event": "finished", "t": 1101.0, "node": "n"},
    ]
    g = account(run)
    assert g.seconds[Phase.STRAGGLER_WAIT] == pytest.approx(2.5)  # 10 s x 0.25
    assert g.seconds[Phase.PRODUCTIVE] == pytest.approx(150.0 - 2.5)
