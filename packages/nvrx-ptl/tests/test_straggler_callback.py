"""StragglerDetectionCallback with a real Trainer: scores to a CSV logger, a slow rank flagged."""

from __future__ import annotations

import csv
import itertools
import logging
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from nvrx.ft import (
    STRAGGLER_SCORES_ENV,
    StragglerScores,
    flush_straggler_reports,
    publish_straggler_report,
    read_straggler_scores,
)
from nvrx.ft._formats import straggler_scores as straggler_scores_module
from nvrx.ptl import StragglerDetectionCallback
from nvrx.ptl import straggler_detection_callback as callback_module
from nvrx.ptl.straggler_scores import format_rank_scores, score_summary
from nvrx.straggler import Detector

from .conftest import Procs, probes, results, run_ddp, tiny_fit

SLOW_FORWARD = "section_relative_perf/DDPStrategy.training_step/min"


def _metrics(log_dir: Path) -> list[dict[str, str]]:
    with open(log_dir / "csv" / "version_0" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _cfg(tmp_path: Path, **extra: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "callbacks": ["straggler"],
        "ckpt_dir": str(tmp_path / "ckpt"),
        "log_dir": str(tmp_path / "logs"),
        "max_steps": 120,
        "ckpt_every": 1000,
        "val_every": 30,
        "step_sleep": 0.01,
        "straggler": {"report_time_interval": 1.0, "num_gpu_perf_scores_to_print": 3},
    }
    cfg.update(extra)
    return cfg


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"report_time_interval": 0}, "report_time_interval"),
        ({"gpu_relative_perf_threshold": 1.5}, "gpu_relative_perf_threshold"),
        ({"gpu_individual_perf_threshold": -0.1}, "gpu_individual_perf_threshold"),
        ({"section_relative_perf_threshold": "x"}, "section_relative_perf_threshold"),
        ({"profiling_interval": 0}, "profiling_interval"),
        ({"num_gpu_perf_scores_to_print": -1}, "num_gpu_perf_scores_to_print"),
        ({"calc_relative_gpu_perf": False, "calc_individual_gpu_perf": False}, "calc_"),
        ({"gather_on_rank0": "yes"}, "gather_on_rank0"),
        ({"stop_on_section_scores": 1}, "stop_on_section_scores"),
        ({"stop_if_detected": "no"}, "stop_if_detected"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        StragglerDetectionCallback(**kwargs)  # type: ignore[arg-type]


def test_reference_style_positional_arguments() -> None:
    cb = StragglerDetectionCallback(300, True, False, 5, 0.7, 0.7, False, True)
    assert cb.scores_to_compute == ["relative_perf_scores"]
    assert cb.profiling_interval == 1


def test_score_table_and_summary() -> None:
    scores = {0: 0.9, 1: 0.5, 2: 1.0, 3: 0.8, 4: 0.95, 5: float("nan")}
    nodes = {r: f"n{r}" for r in scores}
    table = format_rank_scores(scores, nodes, 2)
    lines = table.splitlines()
    assert lines[0] == " Worst performing 2/5 ranks:"
    assert lines[1] == "  Rank=1 Node=n1 Score=0.50"
    assert lines[2] == "  Rank=3 Node=n3 Score=0.80"
    assert lines[3] == " Best performing 2/5 ranks:"
    assert lines[4] == "  Rank=2 Node=n2 Score=1.00"
    assert lines[6] == " Ranks without a comparable score: [5]"
    few = format_rank_scores({0: 1.0, 1: 0.4}, {0: "a", 1: "b"}, 5).splitlines()
    assert few == ["  Rank=1 Node=b Score=0.40", "  Rank=0 Node=a Score=1.00"]
    assert format_rank_scores({}, {}, 5) == "  (no scores in this report)\n"
    assert score_summary(scores) == {"min": 0.5, "median": 0.9, "max": 1.0}
    assert score_summary({0: math.nan}) == {}


@pytest.mark.timeout(120)
def test_single_process_logs_section_scores_to_csv(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    callback = StragglerDetectionCallback(
        report_time_interval=0.2,
        section_individual_perf_threshold=0.0,  # 2 ms steps are too noisy to judge
        logger_name="test.straggler",
    )
    with caplog.at_level(logging.INFO, logger="test.straggler"):
        trainer = tiny_fit(
            tmp_path,
            [callback],
            max_steps=400,
            logger=CSVLogger(tmp_path / "logs", name="csv", version=0),
            step_s=0.002,  # 0.8 s or more: several reports
        )
    assert "No GPU performance scores" in caplog.text
    assert "GPU relative performance:\n" in caplog.text, "printed without scores, as NVRx"
    assert "STRAGGLER DETECTION WARNING" not in caplog.text
    rows = [r for r in _metrics(tmp_path / "logs") if r.get("section_relative_perf/train_step/min")]
    assert rows, caplog.text
    assert float(rows[-1]["section_relative_perf/train_step/min"]) == pytest.approx(1.0)
    assert callback.last_report is not None, "the latest report stays readable after fit"
    assert callback.last_report.section_relative_perf_scores["train_step"] == {0: 1.0}
    assert not callback.initialized
    assert not Detector.initialized
    assert "training_step" not in vars(trainer.strategy), "the strategy is left as it was"  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_rank_zero_publishes_each_report_for_ft_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "straggler_scores.json"
    monkeypatch.setenv(STRAGGLER_SCORES_ENV, str(path))
    written: list[StragglerScores] = []
    real_write = straggler_scores_module._write_document

    def spy(where: Any, document: Any, *, durable: bool) -> None:
        written.append(StragglerScores.from_dict(document))
        real_write(where, document, durable=durable)

    monkeypatch.setattr(straggler_scores_module, "_write_document", spy)
    callback = StragglerDetectionCallback(
        report_time_interval=0.2, section_individual_perf_threshold=0.0
    )
    before = time.time()
    tiny_fit(tmp_path, [callback], max_steps=1500, step_s=0.001)  # >= 1.5 s
    assert flush_straggler_reports(30.0)
    assert len(written) >= 2, "one file per report"
    got = read_straggler_scores(path)
    assert got == written[-1]
    assert got.forward_section == "SingleDeviceStrategy.training_step"  # the forward pass
    assert got.step_section == "train_step"  # the whole step
    [rank0] = got.ranks
    assert rank0.rank == 0
    assert rank0.section_relative == 1.0
    assert rank0.step_s is not None
    assert rank0.forward_s is not None
    assert 0 < rank0.forward_s <= rank0.step_s < 1
    assert got.window_start is not None
    assert got.window_end is not None
    assert before <= written[0].window_start < got.window_end <= time.time()  # type: ignore[operator]
    for earlier, later in itertools.pairwise(written):  # windows follow each other
        assert later.window_start == earlier.window_end


@pytest.mark.timeout(120)
def test_a_failed_publish_warns_once_and_training_carries_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(straggler_scores_module._publisher, "_warned", False)
    monkeypatch.setenv(STRAGGLER_SCORES_ENV, str(tmp_path / "no-such-dir" / "scores.json"))
    calls: list[bool] = []
    real_publish = publish_straggler_report

    def counted(*args: Any, **kwargs: Any) -> bool:
        calls.append(real_publish(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(callback_module, "publish_straggler_report", counted)
    callback = StragglerDetectionCallback(
        report_time_interval=0.2, section_individual_perf_threshold=0.0
    )
    with caplog.at_level(logging.DEBUG, logger="nvrx.ft.straggler_scores"):
        trainer = tiny_fit(tmp_path, [callback], max_steps=1500, step_s=0.001)  # >= 1.5 s
    assert trainer.global_step == 1500  # type: ignore[attr-defined]
    assert len(calls) >= 2, "a report each interval"
    assert all(calls), "each handed to the writer (which then fails)"
    with caplog.at_level(logging.DEBUG, logger="nvrx.ft.straggler_scores"):
        assert flush_straggler_reports(30.0)
    levels = [r.levelno for r in caplog.records if r.name == "nvrx.ft.straggler_scores"]
    assert len(levels) >= 2, levels  # a report handed in while one waits replaces it
    assert levels == [logging.WARNING] + [logging.DEBUG] * (len(levels) - 1)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_slow_rank_is_flagged_logged_and_training_stopped_on_ddp(
    tmp_path: Path, procs: Procs
) -> None:
    """Section stragglers stop the job only when opted in; the job then ends as NVRx's:
    the last checkpoint is saved, then every rank exits with SystemExit(1)."""
    cfg = _cfg(
        tmp_path,
        slow_rank=1,
        slow_sleep=0.06,
        max_steps=1000,
        straggler={
            "report_time_interval": 1.0,
            "num_gpu_perf_scores_to_print": 3,
            "stop_if_detected": True,
            "stop_on_section_scores": True,
        },
    )
    rc, out = run_ddp(procs, cfg)
    assert rc != 0, out
    warnings = [line for line in out.splitlines() if "STRAGGLER DETECTION WARNING" in line]
    flagged = [w for w in warnings if "DDPStrategy.training_step" in w]
    assert flagged, out
    assert all("rank 1 (" in w and "rank 0 (" not in w for w in flagged), flagged
    assert "Worst performing" not in out  # 2 ranks: the whole table, worst first
    assert re.search(r"Rank=1 Node=\S+ Score=0\.[0-5]\d\n\s+Rank=0 Node=\S+ Score=1\.00", out), out
    assert "@rank1]" not in out, "rank 1 must not print job-wide messages"
    rows = [r for r in _metrics(tmp_path / "logs") if r.get(SLOW_FORWARD)]
    assert rows, out
    assert all(float(r[SLOW_FORWARD]) < 0.7 for r in rows)

    assert "Detected stragglers. Terminating training..." in out
    assert not results(out), "fit does not return: the ranks exit with SystemExit(1)"
    exits = probes(out, "exception")
    assert sorted(str(e["rank"]) for e in exits) == ["0", "1"], out
    assert all(e["error"] == "SystemExit(1)" for e in exits), exits
    seen = [e["scores"] for e in exits]
    assert seen[0], out
    assert seen[0] == seen[1], f"every rank holds rank 0's scores: {seen}"
    assert float(seen[0][SLOW_FORWARD]) < 0.7  # type: ignore[index]
    saved = re.findall(r"Saved checkpoint (\S+) before stopping", out)
    assert saved == [str(tmp_path / "ckpt" / "last.ckpt")], out  # ModelCheckpoint's own "last"
    step = torch.load(saved[0], weights_only=False)["global_step"]
    assert 0 < step < 1000


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_without_gather_each_rank_judges_itself(tmp_path: Path, procs: Procs) -> None:
    cfg = _cfg(
        tmp_path,
        slow_rank=1,
        slow_sleep=0.06,
        max_steps=1000,
        straggler={
            "report_time_interval": 1.0,
            "gather_on_rank0": False,
            "stop_if_detected": True,
            "stop_on_section_scores": True,
        },
    )
    rc, out = run_ddp(procs, cfg)
    assert rc != 0, out
    warnings = [line for line in out.splitlines() if "STRAGGLER DETECTION WARNING" in line]
    assert warnings, out
    assert all("@rank1]" in w and "rank 1 (" in w for w in warnings), warnings
    assert "Rank=1 Node=" in out  # rank 1's own table
    assert "Detected stragglers. Terminating training" in out, "rank 0 learns it from rank 1"
    exits = probes(out, "exception")
    assert sorted(str(e["rank"]) for e in exits) == ["0", "1"], out
    assert all(e["error"] == "SystemExit(1)" for e in exits), exits


def _report_with(slowdowns: tuple[object, ...]) -> object:
    """A real Report of 3 ranks whose sustained-slowdown rule flagged ``slowdowns``."""
    from nvrx.straggler import Report

    scores = {0: 1.0, 1: 0.97, 2: 0.9}
    return Report(
        gpu_relative_perf_scores=scores,
        section_relative_perf_scores={"train_step": scores},
        gpu_individual_perf_scores=scores,
        section_individual_perf_scores={"train_step": scores},
        rank_to_node={0: "a", 1: "b", 2: "c"},
        local_section_summaries={},
        local_kernel_summaries={},
        generate_report_elapsed_time=1.0,
        gather_on_rank0=True,
        rank=0,
        sustained_slowdowns=slowdowns,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("section", "options", "stops"),
    [
        (None, {}, False),  # found and logged, but the option is off by default
        (None, {"stop_if_sustained_straggler": True}, True),
        ("train_step", {"stop_if_sustained_straggler": True}, False),
        ("train_step", {"stop_if_sustained_straggler": True, "stop_on_section_scores": True}, True),
        (None, {"stop_if_detected": True}, False),  # scores above every threshold
    ],
)
def test_sustained_slowdown_rule_stops_only_when_opted_in(
    caplog: pytest.LogCaptureFixture, section: str | None, options: dict[str, bool], stops: bool
) -> None:
    from nvrx.straggler import SustainedSlowdown

    slowdown = SustainedSlowdown(2, section, 0.1, 3, "rank 2 is 10% slower for 3 reports")
    callback = StragglerDetectionCallback(logger_name="test.sustained", **options)
    with caplog.at_level(logging.WARNING, logger="test.sustained"):
        stop, _ = callback._handle_report(_report_with((slowdown,)))  # type: ignore[arg-type]
    assert stop is stops
    assert "STRAGGLER DETECTION WARNING: rank 2 is 10% slower for 3 reports" in caplog.text
    assert not callback._handle_report(_report_with(()))[0]  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_sustained_slowdown_ends_the_job_on_three_ddp_ranks(tmp_path: Path, procs: Procs) -> None:
    """Rank 2's forward pass is 40% slower, above any fixed threshold (thresholds off):
    the sustained-slowdown rule flags it after 3 reports and the job ends as NVRx's stop."""
    cfg = _cfg(
        tmp_path,
        slow_rank=2,
        slow_sleep=0.004,
        max_steps=3000,
        val_every=20,  # 22 batches per epoch on each of 3 ranks
        straggler={
            "report_time_interval": 1.0,
            "gpu_relative_perf_threshold": 0.0,
            "gpu_individual_perf_threshold": 0.0,
            "section_relative_perf_threshold": 0.0,
            "section_individual_perf_threshold": 0.0,
            "stop_if_sustained_straggler": True,
            "stop_on_section_scores": True,
            "sustained_min_slowdown": 0.15,
        },
    )
    rc, out = run_ddp(procs, cfg, nproc=3)
    assert rc != 0, out
    warnings = [line for line in out.splitlines() if "STRAGGLER DETECTION WARNING" in line]
    assert warnings, out
    assert all("rank 2" in w for w in warnings), warnings
    assert "Detected stragglers. Terminating training..." in out
    exits = probes(out, "exception")
    assert sorted(str(e["rank"]) for e in exits) == ["0", "1", "2"], out
    assert all(e["error"] == "SystemExit(1)" for e in exits), exits
