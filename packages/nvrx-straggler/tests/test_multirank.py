"""Scores and collectives across real gloo ranks (subprocesses)."""

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
