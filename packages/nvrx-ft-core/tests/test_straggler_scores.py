"""The straggler-scores file: one contract, written atomically, read back without trusting it."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import pathlib
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

import nvrx.ft
from nvrx.ft import (
    STRAGGLER_SCORES_ENV,
    STRAGGLER_SCORES_SCHEMA_VERSION,
    RankStragglerScores,
    StragglerScores,
    flush_straggler_reports,
    publish_straggler_report,
    read_straggler_scores,
    straggler_scores_schema_path,
    write_file_atomically,
    write_straggler_scores,
)
from nvrx.ft._formats import straggler_scores as module
from nvrx.ft._formats.straggler_scores import MAX_STRAGGLER_SCORES_BYTES, MAX_STRAGGLER_SCORES_RANKS
from nvrx.ft._json_files import check_file

NAN = math.nan


@dataclasses.dataclass(frozen=True)
class FakeReport:
    """A report with nvrx.straggler.Report's attribute names (the contract is structural)."""

    gpu_relative_perf_scores: Mapping[int, float]
    gpu_individual_perf_scores: Mapping[int, float]
    section_relative_perf_scores: Mapping[str, Mapping[int, float]]
    section_individual_perf_scores: Mapping[str, Mapping[int, float]]
    rank_to_node: Mapping[int, str]
    section_median_times: Mapping[str, Mapping[int, float]]


def _report(**overrides: Any) -> FakeReport:
    fields: dict[str, Any] = {
        "gpu_relative_perf_scores": {0: 1.0, 1: 0.5, 2: NAN},
        "gpu_individual_perf_scores": {0: 0.9, 1: 0.8, 2: NAN},
        "section_relative_perf_scores": {"fwd": {0: 1.0, 1: 0.6, 2: 0.7}, "opt": {2: 0.4}},
        "section_individual_perf_scores": {"fwd": {0: 1.0, 1: 1.0, 2: NAN}},
        "rank_to_node": {0: "node-a", 1: "node-a", 2: "node-b"},
        "section_median_times": {"train_step": {0: 100.0, 1: 200.0, 2: 150.0}},
    }
    fields.update(overrides)
    return FakeReport(**fields)


def _scores() -> StragglerScores:
    return StragglerScores.from_report(
        _report(),
        written_at=1_764_590_100.0,
        window_start=1_764_590_000.0,
        window_end=1_764_590_100.0,
        step_section="train_step",
    )


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    schema = json.loads(straggler_scores_schema_path().read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_names_are_nvrx_ft_public_api() -> None:
    assert STRAGGLER_SCORES_ENV == "NVRX_STRAGGLER_SCORES_FILE"
    assert STRAGGLER_SCORES_SCHEMA_VERSION == 1
    for name in (
        "StragglerScores",
        "RankStragglerScores",
        "publish_straggler_report",
        "read_straggler_scores",
        "write_straggler_scores",
    ):
        assert name in nvrx.ft.__all__


def test_a_report_becomes_per_rank_scores_with_nan_as_none_and_the_worst_section() -> None:
    scores = _scores()
    assert [r.rank for r in scores.ranks] == [0, 1, 2]
    two = scores.ranks[2]
    assert two == RankStragglerScores(
        rank=2, node="node-b", section_relative=0.4, step_s=0.15
    )  # NaN GPU scores: None; worst section: opt's 0.4; 150 ms
    assert scores.scores("relative") == {0: 1.0, 1: 0.5, 2: 0.4}  # GPU where known
    assert scores.scores("individual") == {0: 0.9, 1: 0.8}  # rank 2 has none
    assert scores.worst("relative") == (2, 0.4)
    assert scores.step_s == {0: 0.1, 1: 0.2, 2: 0.15}
    with pytest.raises(ValueError, match="kind"):
        scores.scores("gpu")


def test_without_the_step_section_there_are_no_step_times() -> None:
    scores = StragglerScores.from_report(_report(), written_at=1.0, step_section="missing")
    assert scores.step_section is None
    assert scores.step_s == {}


def test_written_file_reads_back_equal_mode_0600_and_validates_against_the_schema(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "scores.json"
    scores = _scores()
    write_straggler_scores(path, scores)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_straggler_scores(path) == scores
    _validator().validate(json.loads(path.read_text()))
    assert [p.name for p in tmp_path.iterdir()] == ["scores.json"]  # no temp file left


def test_the_write_is_atomic_a_reader_never_sees_half_a_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "scores.json"
    big = StragglerScores(
        written_at=1.0,
        ranks=tuple(RankStragglerScores(rank=r, gpu_relative=0.5, step_s=0.1) for r in range(4000)),
    )
    small = _scores()
    write_straggler_scores(path, small)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[Exception] = []

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append(len(read_straggler_scores(path).ranks))
            except Exception as exc:  # a half-written file would land here
                errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(30):
            write_straggler_scores(path, big if i % 2 == 0 else small)
    finally:
        stop.set()
        reader.join(timeout=30)
    assert not errors, errors[:3]
    assert set(seen) <= {3, 4000}


def _document(**changes: Any) -> dict[str, Any]:
    document = _scores().to_dict()
    document.update(changes)
    return document


def _rank(**changes: Any) -> dict[str, Any]:
    document = _scores().to_dict()
    document["ranks"][1].update(changes)
    return document


#: Documents both the reader and the schema refuse.
REFUSED: dict[str, tuple[Any, str]] = {
    "not an object": ([], "not an object"),
    "other schema version": (_document(schema_version=2), "version 1 only"),
    "schema version true": (_document(schema_version=True), "version 1 only"),
    "missing key": (
        {k: v for k, v in _document().items() if k != "window_end"},
        r"missing \['window_end'\]",
    ),
    "extra key": (_document(extra=1), r"unexpected \['extra'\]"),
    "written_at a string": (_document(written_at="now"), "written_at='now': not a number"),
    "written_at negative": (_document(written_at=-1.0), "written_at=-1.0"),
    "window_start too large": (_document(window_start=1e300), "window_start"),
    "ranks not a list": (_document(ranks={"0": {}}), "ranks=.*not a list"),
    "rank not an object": (_document(ranks=[1]), r"ranks\[0\]=1: not an object"),
    "rank a bool": (_rank(rank=True), "rank=True: not an integer"),
    "rank negative": (_rank(rank=-1), "rank=-1"),
    "score a string": (_rank(gpu_relative="0.5"), "gpu_relative='0.5': not a number"),
    "score negative": (_rank(section_relative=-0.1), "section_relative=-0.1"),
    "score too large": (_rank(gpu_individual=1e9), "gpu_individual=1000000000.0"),
    "step_s negative": (_rank(step_s=-1.0), "step_s=-1.0"),
    "node too long": (_rank(node="n" * 65), "node="),
    "forward_s negative": (_rank(forward_s=-1.0), "forward_s=-1.0"),
    "forward_section empty": (_document(forward_section=""), "forward_section"),
    "rank missing a key": (
        {**_document(), "ranks": [{"rank": 0}]},
        r"ranks\[0\]=.*missing",
    ),
    "step_section empty": (_document(step_section=""), "step_section"),
}

#: Documents only the reader can refuse (the schema cannot say it).
REFUSED_BY_READER: dict[str, tuple[Any, str]] = {
    "window ends before it starts": (
        _document(window_start=10.0, window_end=5.0),
        r"window_end=5.0: before window_start \(10.0\)",
    ),
    "a rank twice": (
        {**_document(), "ranks": [_scores().to_dict()["ranks"][0]] * 2},
        "a rank appears twice",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_bad_field_is_refused_by_reader_and_schema(name: str, tmp_path: pathlib.Path) -> None:
    document, why = REFUSED[name]
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=why):
        read_straggler_scores(path)
    assert not _validator().is_valid(document)


@pytest.mark.parametrize("name", sorted(REFUSED_BY_READER))
def test_what_the_schema_cannot_say_the_reader_refuses(name: str, tmp_path: pathlib.Path) -> None:
    document, why = REFUSED_BY_READER[name]
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=why):
        read_straggler_scores(path)


def test_files_that_are_not_json_or_too_big_or_not_regular_are_refused(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "scores.json"
    for text, why in [
        ("{", "not valid JSON"),
        ('{"written_at": NaN}', "NaN, which JSON does not allow"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
        ("\udcff", "not valid JSON"),
    ]:
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        with pytest.raises(ValueError, match=why):
            read_straggler_scores(path)
    with path.open("wb") as stream:
        stream.truncate(MAX_STRAGGLER_SCORES_BYTES + 1)
    with pytest.raises(ValueError, match="larger than"):
        read_straggler_scores(path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        read_straggler_scores(fifo)  # never blocks on a FIFO
    with pytest.raises(ValueError, match="not a regular file"):
        read_straggler_scores(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_straggler_scores(tmp_path / "missing")


def test_the_rank_count_is_capped() -> None:
    entry = RankStragglerScores(rank=0)
    with pytest.raises(ValueError, match=f"more than {MAX_STRAGGLER_SCORES_RANKS} items"):
        StragglerScores(written_at=1.0, ranks=(entry,) * (MAX_STRAGGLER_SCORES_RANKS + 1))


def test_a_writer_cannot_write_what_a_reader_would_refuse(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="gpu_relative=inf"):
        RankStragglerScores(rank=0, gpu_relative=math.inf)
    with pytest.raises(ValueError, match="before window_start"):
        StragglerScores(written_at=1.0, window_start=2.0, window_end=1.0)
    with pytest.raises(TypeError, match="not a StragglerScores"):
        write_straggler_scores(tmp_path / "x", {"ranks": []})  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()


@pytest.fixture
def fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module._publisher, "_warned", False)


def test_publish_writes_to_the_env_path_and_is_false_when_unset(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "scores.json"
    monkeypatch.delenv(STRAGGLER_SCORES_ENV, raising=False)
    assert publish_straggler_report(_report()) is False
    monkeypatch.setenv(STRAGGLER_SCORES_ENV, "")
    assert publish_straggler_report(_report()) is False
    assert not path.exists()
    monkeypatch.setenv(STRAGGLER_SCORES_ENV, str(path))
    assert publish_straggler_report(
        _report(), window_start=5.0, window_end=7.0, step_section="train_step"
    )
    assert flush_straggler_reports(30.0)
    got = read_straggler_scores(path)
    assert (got.window_start, got.window_end, got.step_s[1]) == (5.0, 7.0, 0.2)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.usefixtures("fresh_warning")
def test_publish_never_raises_and_warns_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(STRAGGLER_SCORES_ENV, str(tmp_path / "no-such-dir" / "scores.json"))
    caplog.set_level(logging.DEBUG, logger="nvrx.ft.straggler_scores")
    assert publish_straggler_report(_report()) is True  # handed over; the write fails later
    assert flush_straggler_reports(30.0)
    monkeypatch.setenv(STRAGGLER_SCORES_ENV, str(tmp_path / "scores.json"))
    assert publish_straggler_report(object()) is True  # type: ignore[arg-type]
    assert flush_straggler_reports(30.0)
    assert publish_straggler_report(_report(), window_start=2.0, window_end=1.0)
    assert flush_straggler_reports(30.0)
    levels = [r.levelno for r in caplog.records if r.name == "nvrx.ft.straggler_scores"]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert "no-such-dir" in caplog.records[0].getMessage()
    assert "before window_start" in caplog.records[2].getMessage()
    assert not (tmp_path / "scores.json").exists()
    # A value the reader would refuse is left out, not a reason to lose the report.
    assert publish_straggler_report(_report(gpu_relative_perf_scores={0: -5.0, 1: math.inf}))
    assert flush_straggler_reports(30.0)
    got = read_straggler_scores(tmp_path / "scores.json")
    assert got.scores("relative") == {0: 1.0, 1: 0.6, 2: 0.4}  # the sections' instead


def test_publish_returns_while_the_disk_is_stuck_and_only_the_latest_report_waits(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding 1: the write ran on the training loop (and fsynced file and directory)."""
    path = tmp_path / "scores.json"
    monkeypatch.setenv(STRAGGLER_SCORES_ENV, str(path))
    assert flush_straggler_reports(30.0)
    release = threading.Event()
    entered = threading.Event()
    written: list[float] = []
    real = write_file_atomically

    def stuck(where: Any, text: str, **kw: Any) -> None:
        entered.set()
        assert release.wait(60)
        written.append(json.loads(text)["window_start"])
        real(where, text, **kw)

    monkeypatch.setattr(module, "write_file_atomically", stuck)
    done = threading.Event()

    def loop() -> None:  # the training loop: three reports while the disk hangs
        for start in (1.0, 2.0, 3.0):
            assert publish_straggler_report(_report(), window_start=start, window_end=9.0)
            assert entered.wait(30)  # the first one is in the writer, stuck
        done.set()

    trainer = threading.Thread(target=loop, daemon=True)
    trainer.start()
    trainer.join(timeout=30)
    try:
        assert done.is_set(), "publish_straggler_report waited for the disk"
        assert not flush_straggler_reports(0.2)  # still stuck
    finally:
        release.set()
    assert flush_straggler_reports(30.0)
    assert written == [1.0, 3.0]  # report 2 was replaced by report 3 while it waited
    assert read_straggler_scores(path).window_start == 3.0


_EXIT_RIGHT_AFTER_PUBLISH = """
import sys, time, types
from nvrx.ft import publish_straggler_report
from nvrx.ft._formats import straggler_scores as module
real = module.write_file_atomically
def slow(*args, **kwargs):
    time.sleep(0.5)  # a write the daemon thread has not finished when the script ends
    real(*args, **kwargs)
module.write_file_atomically = slow
scores = {0: 1.0, 1: 0.5}
report = types.SimpleNamespace(
    gpu_relative_perf_scores=scores, gpu_individual_perf_scores=scores,
    section_relative_perf_scores={}, section_individual_perf_scores={},
    rank_to_node={0: "a", 1: "a"}, section_median_times={},
)
assert publish_straggler_report(report, window_start=1.0, window_end=2.0)
if sys.argv[1] == "hung":
    module.write_file_atomically = lambda *a, **k: time.sleep(3600)
    module._publisher._pending = None
    publish_straggler_report(report, window_start=1.0, window_end=3.0)
"""


@pytest.mark.timeout(60)
def test_the_last_report_is_written_when_the_process_ends_right_after_publishing(
    tmp_path: pathlib.Path,
) -> None:
    """The writer is a daemon thread: without the exit flush a report published in the
    last second before the interpreter ended was lost (the launcher never saw it)."""
    path = tmp_path / "scores.json"
    env = {**os.environ, STRAGGLER_SCORES_ENV: str(path)}
    run = [sys.executable, "-c", _EXIT_RIGHT_AFTER_PUBLISH]
    subprocess.run([*run, "slow"], env=env, check=True, timeout=30)
    assert read_straggler_scores(path).window_end == 2.0


@pytest.mark.timeout(60)
def test_a_hung_disk_holds_the_exit_no_longer_than_the_exit_flush(
    tmp_path: pathlib.Path,
) -> None:
    env = {**os.environ, STRAGGLER_SCORES_ENV: str(tmp_path / "scores.json")}
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", _EXIT_RIGHT_AFTER_PUBLISH, "hung"], env=env, check=True, timeout=30
    )
    assert time.monotonic() - started < 25  # 2 s of flush, not the write's hour


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12: fork of a threaded process
def test_a_child_forked_while_the_writer_lock_is_held_still_publishes(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child got a copy of a lock another thread held: its first publish blocked forever."""
    path = tmp_path / "child.json"
    monkeypatch.setenv(STRAGGLER_SCORES_ENV, str(path))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # the parent's writer thread, inside the lock at the fork
        with module._publisher._cond:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            if publish_straggler_report(_report(), window_start=4.0, window_end=5.0):
                code = 0 if flush_straggler_reports(20.0) else 3
        finally:
            os._exit(code)
    release.set()
    holder.join(30)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the forked child hung in publish_straggler_report")
    finally:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            if not os.waitpid(pid, os.WNOHANG)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert read_straggler_scores(path).window_start == 4.0


def test_published_files_are_not_fsynced_but_still_atomic(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: syncs.append(fd))
    write_file_atomically(tmp_path / "durable", "x")
    assert len(syncs) == 2  # the file and its directory
    syncs.clear()
    write_file_atomically(tmp_path / "quick", "x", durable=False)
    monkeypatch.setenv(STRAGGLER_SCORES_ENV, str(tmp_path / "scores.json"))
    assert publish_straggler_report(_report())
    assert flush_straggler_reports(30.0)
    assert syncs == []
    assert (tmp_path / "quick").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["durable", "quick", "scores.json"]


def test_the_wait_is_the_forward_gap_over_the_whole_step() -> None:
    """Review finding 3: 1 - median / max of the forward medians was applied to whole steps."""
    medians = {"fwd": {0: 20.0, 1: 20.0, 2: 50.0}, "train_step": {0: 130.0, 1: 130.0, 2: 130.0}}
    report = _report(section_median_times=medians)
    scores = StragglerScores.from_report(
        report, written_at=1.0, forward_section="fwd", step_section="train_step"
    )
    assert (scores.forward_section, scores.step_section) == ("fwd", "train_step")
    assert scores.forward_s == {0: 0.02, 1: 0.02, 2: 0.05}
    # rank 0 and 1 idle 30 of each 130 ms step waiting for rank 2's forward
    assert scores.wait_fraction() == pytest.approx(30 / 130)
    no_steps = StragglerScores.from_report(report, written_at=1.0, forward_section="fwd")
    assert no_steps.wait_fraction() == pytest.approx(1 - 20 / 50)  # the documented fallback
    one = _report(section_median_times={"fwd": {0: 20.0}})
    assert (
        StragglerScores.from_report(one, written_at=1, forward_section="fwd").wait_fraction()
        is None
    )
    assert _scores().wait_fraction() is None  # no forward section named
    odd = {"fwd": {0: 20.0, 1: 500.0}, "train_step": {0: 100.0, 1: 100.0}}
    clamped = StragglerScores.from_report(
        _report(section_median_times=odd),
        written_at=1,
        forward_section="fwd",
        step_section="train_step",
    )
    assert clamped.wait_fraction() == 1.0


def test_a_symbolic_link_or_another_users_file_is_refused(tmp_path: pathlib.Path) -> None:
    """Review finding 6: the launcher reads a file a rank wrote; it follows no link to it."""
    real = tmp_path / "real.json"
    write_straggler_scores(real, _scores())
    link = tmp_path / "scores.json"
    link.symlink_to(real)
    with pytest.raises(ValueError, match="a symbolic link"):
        read_straggler_scores(link)
    mine = os.stat(real)
    check_file(mine, os.geteuid())  # the reader's own file passes
    theirs = os.stat_result((mine.st_mode, 0, 0, 1, os.geteuid() + 1, 0, 10, 0, 0, 0))
    with pytest.raises(ValueError, match=f"owned by uid {os.geteuid() + 1}"):
        check_file(theirs, os.geteuid())
    if os.geteuid() == 0:  # root can hand the file to someone else: the real refusal
        os.chown(real, 12345, 12345)
        with pytest.raises(ValueError, match="owned by uid 12345"):
            read_straggler_scores(real)


def test_the_size_cap_is_what_the_rank_cap_needs(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    longest = RankStragglerScores(
        rank=(1 << 31) - 1,
        node="n" * 64,
        **dict.fromkeys(
            ("gpu_relative", "gpu_individual", "section_relative"), 0.12345678901234568
        ),
        section_individual=999.1234567890123,
        forward_s=123456789.12345679,
        step_s=123456789.12345679,
    )
    entry = json.dumps(StragglerScores(written_at=1.0, ranks=(longest,)).to_dict()["ranks"][0])
    assert len(entry.replace(" ", "")) + 1 <= module._MAX_RANK_BYTES
    assert MAX_STRAGGLER_SCORES_BYTES < 48 * 1024 * 1024  # was 64 MiB
    monkeypatch.setattr(module, "MAX_STRAGGLER_SCORES_BYTES", 200)
    with pytest.raises(ValueError, match="more than a reader takes"):
        write_straggler_scores(tmp_path / "big.json", _scores())
    assert not (tmp_path / "big.json").exists()
