"""Scores and collectives across real gloo ranks (subprocesses).

Every rank runs with CUDA entry points made to fail, so these tests also show that
no CUDA call is made on a CPU-only (gloo) backend.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(150)]


def test_slow_rank_is_identified_by_relative_and_individual_scores(run_ranks: Any) -> None:
    results = run_ranks("slow_rank", 4, slow_rank=2)
    rank0 = results[0]
    assert all(r is None for res in results[1:] for r in res["reports"])
    first, second, third = rank0["reports"]
    assert set(first["gpu_relative_perf_scores"]) == {"0", "1", "2", "3"}
    for report in (second, third):
        gpu_rel = report["gpu_relative_perf_scores"]
        assert gpu_rel["2"] == pytest.approx(0.25, rel=1e-6)
        for fast in ("0", "1", "3"):
            assert gpu_rel[fast] == pytest.approx(1.0)
        assert report["section_relative_perf_scores"]["step"]["2"] < 0.5
        assert min(report["section_relative_perf_scores"]["step"][r] for r in "013") > 0.5
    gpu_indiv = second["gpu_individual_perf_scores"]
    assert gpu_indiv["2"] == pytest.approx(0.25, rel=1e-6)
    assert all(gpu_indiv[r] == pytest.approx(1.0) for r in "013")
    assert second["section_individual_perf_scores"]["step"]["2"] < 0.5
    stragglers = rank0["stragglers"][1]
    assert stragglers["straggler_gpus_relative"] == ["StragglerId(rank=2, node='node1')"]
    assert stragglers["straggler_gpus_individual"] == ["StragglerId(rank=2, node='node1')"]
    assert stragglers["straggler_sections_relative"] == {
        "step": ["StragglerId(rank=2, node='node1')"]
    }
    # communication kernels never enter the scores
    assert all("nccl" not in k for k in second["local_kernel_summaries"])
    # steady state (third report, no new names): at most two collectives
    for res in results:
        assert res["collectives"][2]["dist"] <= 2
        assert res["collectives"][2]["comm"] == res["collectives"][2]["dist"]
    assert rank0["reports"][0]["rank_to_node"] == {
        "0": "node0",
        "1": "node0",
        "2": "node1",
        "3": "node1",
    }


def test_missing_kernels_and_sections_are_non_comparable_without_gather(
    two_ranks: list[dict[str, Any]],
) -> None:
    r0 = two_ranks[0]["missing_gather_False"]
    r1 = two_ranks[1]["missing_gather_False"]
    assert r0["rank"] == 0
    assert r1["rank"] == 1
    assert r0["gpu_relative_perf_scores"] == {"0": 1.0}
    # every rank covered has a key; NaN (null in JSON) where not scored (issue 12.10)
    assert r1["gpu_relative_perf_scores"] == {"1": None}
    # as NVRx: without gathering a rank knows its own node only
    assert (r0["rank_to_node"], r1["rank_to_node"]) == ({"0": "n0"}, {"1": "n1"})
    reasons = {(n["score"], n["section"]): n["reason"] for n in r1["non_comparable"]}
    assert "no kernels recorded" in reasons[("gpu_relative", None)]
    assert set(r1["section_relative_perf_scores"]) == {"step"}
    assert set(r0["section_relative_perf_scores"]) == {"step", "extra"}


def test_missing_data_with_gather_keeps_the_other_ranks_scores(
    two_ranks: list[dict[str, Any]],
) -> None:
    assert two_ranks[1]["missing_gather_True"] is None
    r0 = two_ranks[0]["missing_gather_True"]
    assert r0["gpu_relative_perf_scores"] == {"0": 1.0, "1": None}
    assert set(r0["section_relative_perf_scores"]["step"]) == {"0", "1"}
    assert r0["section_relative_perf_scores"]["extra"] == {"0": 1.0, "1": None}
    missing = {(n["score"], n["rank"], n["section"]) for n in r0["non_comparable"]}
    assert ("gpu_relative", 1, None) in missing
    assert ("gpu_individual", 1, None) in missing
    assert ("section_relative", 1, "extra") in missing
    assert r0["rank_to_node"] == {"0": "n0", "1": "n1"}


def test_names_cross_the_wire_only_when_new(two_ranks: list[dict[str, Any]]) -> None:
    for res in two_ranks:
        counts = res["name_counts"]
        # first report: names exchanged (two all_gathers) and the all_reduce repeated
        assert counts[0]["all_gather"] == 2
        assert counts[0]["all_reduce"] == 2
        # nothing new: one all_reduce and one gather
        assert counts[1] == {**counts[1], "all_gather": 0, "all_reduce": 1, "gather": 1}
        # only rank 0 has a new kernel: every rank takes part in one exchange
        assert counts[2]["all_gather"] == 2
        assert counts[3]["all_gather"] == 0
        assert sum(counts[3].values()) == 2
        assert res["pickled_collectives"] == 0
    assert two_ranks[0]["kernel_ids"] == two_ranks[1]["kernel_ids"]
    assert two_ranks[0]["kernel_ids"][-1].startswith("only_rank0_new")


def test_individual_scores_without_gather_need_no_collective(
    two_ranks: list[dict[str, Any]],
) -> None:
    for res in two_ranks:
        assert res["indiv_no_gather"]["collectives"] == 0
        assert res["indiv_no_gather"]["report"]["gpu_individual_perf_scores"]


def test_report_interval_is_agreed_across_ranks(two_ranks: list[dict[str, Any]]) -> None:
    i0, i1 = two_ranks[0]["interval"], two_ranks[1]["interval"]
    assert i0 == i1  # same iterations, same interval on both ranks
    assert len(i0["reported"]) == 3
    first, second, _ = i0["intervals"]
    # steps became >= 10x slower after the first report: the next report re-estimates
    assert second < first
