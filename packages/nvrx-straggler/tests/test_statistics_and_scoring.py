"""Statistics definition and score formulas against hand-computed values."""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Sequence

import pytest

from nvrx.straggler import ReportGenerator, Statistic
from nvrx.straggler._scoring import (
    Comparability,
    decode_slots,
    gpu_score,
    reference_slots,
    section_score,
)
from nvrx.straggler.statistics import summarize, summarize_python

NAN = float("nan")


@pytest.mark.parametrize("impl", [summarize, summarize_python])
def test_summary_uses_mean_of_middle_values_and_population_std(
    impl: Callable[..., dict[Statistic, float]],
) -> None:
    fn = impl
    s = fn([4.0, 1.0, 3.0, 2.0])
    assert s[Statistic.MIN] == 1.0
    assert s[Statistic.MAX] == 4.0
    assert s[Statistic.MED] == 2.5
    assert s[Statistic.AVG] == 2.5
    assert s[Statistic.STD] == pytest.approx(math.sqrt(1.25))
    assert s[Statistic.NUM] == 4
    assert fn([7.0])[Statistic.STD] == 0.0
    assert fn([1.0, 2.0], count=10)[Statistic.NUM] == 10
    with pytest.raises(ValueError, match="empty"):
        fn([])
    with pytest.raises(ValueError, match="below the number of samples"):
        fn([1.0, 2.0], count=1)
    assert str(Statistic.MED) == "MED"
    assert repr(Statistic.MED) == "Statistic.MED"


def test_summary_is_the_standard_library_definition() -> None:
    samples = [0.25 + ((i * 7919) % 101) / 37.0 for i in range(1001)]
    for n in (1, 2, 3, 10, 11, 1000, 1001):
        got = summarize(samples[:n])
        assert got[Statistic.MED] == statistics.median(samples[:n])
        assert got[Statistic.AVG] == pytest.approx(statistics.fmean(samples[:n]), rel=1e-14)
        assert got[Statistic.STD] == pytest.approx(statistics.pstdev(samples[:n]), rel=1e-12)
        assert (got[Statistic.MIN], got[Statistic.MAX]) == (min(samples[:n]), max(samples[:n]))


def _reduce(kernel_rows: list[list[float]], section_rows: list[list[float]]) -> list[float]:
    """What the MIN all-reduce across these ranks would return."""
    encoded = [reference_slots(k, s) for k, s in zip(kernel_rows, section_rows, strict=True)]
    return [min(column) for column in zip(*encoded, strict=True)]


def _gpu(
    meds: list[list[float]], weights: list[list[float]], ref: Sequence[float], usable: list[bool]
) -> tuple[list[float], list[int]]:
    out = [gpu_score(m, w, ref, usable) for m, w in zip(meds, weights, strict=True)]
    return [s for s, _ in out], [int(c) for _, c in out]


def test_relative_gpu_score_compares_on_kernels_common_to_all_recording_ranks() -> None:
    # kernels A, B; rank 2 never ran B, so only A is comparable
    meds = [[10.0, 20.0], [20.0, 20.0], [10.0, NAN]]
    weights = [[20.0, 20.0], [40.0, 20.0], [20.0, 0.0]]
    k_ref, common, _ = decode_slots(_reduce(meds, [[], [], []]), 2, 0)
    assert common == [True, False]
    scores, codes = _gpu(meds, weights, k_ref, common)
    assert scores == pytest.approx([1.0, 0.5, 1.0])
    assert codes == [0, 0, 0]


def test_rank_without_kernels_is_not_comparable_and_others_keep_scores() -> None:
    meds = [[10.0, 20.0], [20.0, 20.0], [NAN, NAN]]
    weights = [[20.0, 20.0], [40.0, 20.0], [0.0, 0.0]]
    k_ref, common, _ = decode_slots(_reduce(meds, [[], [], []]), 2, 0)
    assert common == [True, True]
    scores, codes = _gpu(meds, weights, k_ref, common)
    # rank 0: (20*1 + 20*1)/40; rank 1: (40*10/20 + 20*20/20)/60
    assert scores[:2] == pytest.approx([1.0, 40.0 / 60.0])
    assert math.isnan(scores[2])
    assert codes == [0, 0, int(Comparability.NO_DATA)]


def test_rank_with_nothing_in_common_gets_that_reason() -> None:
    meds = [[10.0, NAN], [NAN, 5.0]]
    k_ref, common, _ = decode_slots(_reduce(meds, [[], []]), 2, 0)
    _, codes = _gpu(meds, [[1.0, 1.0], [1.0, 1.0]], k_ref, common)
    assert codes == [int(Comparability.NOTHING_IN_COMMON)] * 2
    assert "none of this rank's kernels" in Comparability.NOTHING_IN_COMMON.describe("kernels")
    zero_score, zero_code = gpu_score([1.0], [0.0], [1.0])
    assert math.isnan(zero_score)
    assert zero_code is Comparability.ZERO_TIME


def test_section_scores_use_ranks_that_entered_the_section() -> None:
    sections = [[4.0, 1.0], [8.0, NAN], [2.0, 3.0]]
    _, _, s_ref = decode_slots(_reduce([[], [], []], sections), 0, 2)
    assert s_ref == [2.0, 1.0]
    scores = [[section_score(m, r)[0] for m, r in zip(row, s_ref, strict=True)] for row in sections]
    assert [row[0] for row in scores] == pytest.approx([0.5, 0.25, 1.0])
    assert scores[0][1] == pytest.approx(1.0)
    assert scores[2][1] == pytest.approx(1.0 / 3.0)
    assert section_score(NAN, 1.0)[1] == Comparability.NO_DATA


def _summary(med: float, num: float = 1.0) -> dict[Statistic, float]:
    return {
        Statistic.MIN: med,
        Statistic.MAX: med,
        Statistic.MED: med,
        Statistic.AVG: med,
        Statistic.STD: 0.0,
        Statistic.NUM: num,
    }


def test_individual_baseline_forgets_a_lucky_window() -> None:
    gen = ReportGenerator("individual_perf_scores", node_name="n", individual_baseline_windows=2)
    scores = []
    for med in (10.0, 5.0, 10.0, 10.0, 10.0):
        report = gen.generate_report({"s": _summary(med)}, {"k": _summary(med, 3.0)})
        assert report is not None
        scores.append(
            (report.section_individual_perf_scores["s"][0], report.gpu_individual_perf_scores[0])
        )
        assert report.gpu_relative_perf_scores == {}  # not computed: no mapping
    # report 3 still remembers the lucky 5.0; report 4 no longer does
    assert scores == [(1.0, 1.0), (1.0, 1.0), (0.5, 0.5), (1.0, 1.0), (1.0, 1.0)]


def test_comm_kernels_are_excluded_by_a_configurable_pattern() -> None:
    gen = ReportGenerator(comm_kernel_pattern=r"^my_allreduce")
    report = gen.generate_report(
        {}, {"my_allreduce_blk": _summary(100.0), "ncclDevKernel": _summary(1.0)}
    )
    assert report is not None
    assert set(report.local_kernel_summaries) == {"ncclDevKernel"}
    default = ReportGenerator()
    report = default.generate_report(
        {},
        {
            "ncclDevKernel_AllReduce": _summary(1.0),
            "cross_device_reduce_1stage": _summary(1.0),
            "userbuffers_fp16_sum": _summary(1.0),
            "gemm": _summary(2.0),
        },
    )
    assert report is not None
    assert set(report.local_kernel_summaries) == {"gemm"}


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="scores_to_compute"):
        ReportGenerator("relative")
    with pytest.raises(ValueError, match="comm_kernel_pattern"):
        ReportGenerator(comm_kernel_pattern="(")
    with pytest.raises(ValueError, match="individual_baseline_windows"):
        ReportGenerator(individual_baseline_windows=0)


def test_no_kernels_on_one_rank_is_nan_with_a_reason() -> None:
    # Every score mapping has a key for every rank covered (issue 12.10): NaN + reason.
    gen = ReportGenerator(node_name="n")
    report = gen.generate_report({"s": _summary(3.0)}, {})
    assert report is not None
    assert list(report.gpu_relative_perf_scores) == [0]
    assert math.isnan(report.gpu_relative_perf_scores[0])
    assert math.isnan(report.gpu_individual_perf_scores[0])
    assert report.scored(report.gpu_relative_perf_scores) == {}
    kinds = {(n.score, n.rank) for n in report.non_comparable}
    assert kinds == {("gpu_relative", 0), ("gpu_individual", 0)}
    assert all("no kernels recorded" in n.reason for n in report.non_comparable)
    assert "NaN" not in report.to_json()
    assert '"gpu_relative_perf_scores": {"0": null}' in report.to_json()
    assert "Not comparable" in report.format_table()
    assert report.identify_stragglers()["straggler_gpus_relative"] == set()


def test_unscored_ranks_are_logged_once_per_process(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lasting condition (here: no kernels on any rank, as on CPU) is said once, while
    # every report keeps listing it in non_comparable (issue 15.12).
    from nvrx.straggler import _report_generator as report_generator
    from nvrx.straggler.rank_row import GatheredRows, RankRow

    monkeypatch.setattr(report_generator, "_told", set())  # a fresh process

    gen = ReportGenerator(node_name="n")
    gen.name_mapper.assign([(["s"], [])])
    rows = [
        RankRow(
            section_individual=[1.0],
            section_individual_code=[0.0],
            section_relative=[1.0],
            section_relative_code=[0.0],
            section_median_ms=[2.0],
        ).encode()
        for _ in range(3)
    ]
    reports = []
    with caplog.at_level(logging.WARNING, logger="nvrx.straggler"):
        for _ in range(3):
            reports.append(gen.assemble(GatheredRows.from_rows(range(3), rows), {}, {}, None))
    said = [
        r.getMessage() for r in caplog.records if "have no gpu_relative score" in r.getMessage()
    ]
    assert len(said) == 1, said
    assert "3 rank(s)" in said[0]
    for report in reports:
        assert sorted(report.gpu_relative_perf_scores) == [0, 1, 2]
        assert {n.rank for n in report.non_comparable if n.score == "gpu_relative"} == {0, 1, 2}
