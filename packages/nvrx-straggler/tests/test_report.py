"""Report: straggler identification, table and JSON forms."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nvrx.straggler import NonComparable, Report, Statistic, StragglerId


def make_report() -> Report:
    return Report(
        gpu_relative_perf_scores={0: 1.0, 1: 0.75, 2: 0.5},
        section_relative_perf_scores={"step": {0: 1.0, 1: 0.9, 2: 0.2}, "io": {0: 1.0}},
        gpu_individual_perf_scores={0: 0.7, 1: 1.0, 2: 1.0},
        section_individual_perf_scores={"step": {0: 1.0, 1: 1.0, 2: 0.74}},
        rank_to_node={0: "a", 1: "a", 2: "b", 3: "b"},
        local_section_summaries={"step": {Statistic.MED: 2.0, Statistic.NUM: 4.0}},
        local_kernel_summaries={},
        generate_report_elapsed_time=1.5,
        gather_on_rank0=True,
        rank=0,
        section_median_times={"step": {0: 10.0, 1: 11.0, 2: 50.0}, "io": {0: 1.0}},
        gpu_kernel_times={0: 3.0, 1: 4.0, 2: 6.0, 3: 0.0},
        non_comparable=(
            NonComparable("gpu_relative", 3, "no kernels recorded"),
            NonComparable("section_relative", 3, "not entered", "io"),
            NonComparable("section_relative", 1, "not entered", "io"),
        ),
    )


def test_identify_stragglers_uses_strict_thresholds_per_kind() -> None:
    found = make_report().identify_stragglers()
    assert found["straggler_gpus_relative"] == {StragglerId(2, "b")}  # 0.75 is not < 0.75
    assert found["straggler_gpus_individual"] == {StragglerId(0, "a")}
    assert found["straggler_sections_relative"] == {"step": {StragglerId(2, "b")}}
    assert found["straggler_sections_individual"] == {"step": {StragglerId(2, "b")}}
    relaxed = make_report().identify_stragglers(gpu_rel_threshold=0.8, section_rel_threshold=0.1)
    assert relaxed["straggler_gpus_relative"] == {StragglerId(1, "a"), StragglerId(2, "b")}
    assert relaxed["straggler_sections_relative"] == {}
    assert repr(StragglerId(3, "host")) == "StragglerId(rank=3, node='host')"


def test_table_lists_worst_ranks_first_and_groups_non_comparable() -> None:
    text = make_report().format_table(max_rows=2)
    lines = text.splitlines()
    gpu = lines.index("GPU relative (worst 2 of 3 ranks):")
    assert lines[gpu + 2].split()[:3] == ["2", "b", "0.500"]
    assert lines[gpu + 3].split()[:3] == ["1", "a", "0.750"]
    assert "6.000" in lines[gpu + 2]  # kernel time of rank 2
    step = lines.index("Section 'step' relative (worst 2 of 3 ranks):")
    assert lines[step + 2].split() == ["2", "b", "0.200", "50.000"]
    assert "  section_relative 'io': ranks 1,3: not entered" in lines
    assert "  gpu_relative: ranks 3: no kernels recorded" in lines


def test_json_form_has_string_keys_units_and_no_nan() -> None:
    data = json.loads(make_report().to_json())
    assert data["units"]["section_times"] == "ms"
    assert data["units"]["kernel_times"] == "us"
    assert data["gpu_relative_perf_scores"] == {"0": 1.0, "1": 0.75, "2": 0.5}
    assert data["section_relative_perf_scores"]["step"]["2"] == 0.2
    assert data["local_section_summaries"]["step"] == {"MED": 2.0, "NUM": 4.0}
    assert data["non_comparable"][0] == {
        "score": "gpu_relative",
        "rank": 3,
        "reason": "no kernels recorded",
        "section": None,
    }
    assert data["rank_to_node"]["3"] == "b"


def test_a_report_with_nvrx_fields_only_is_constructible() -> None:
    # NVRx's ten fields, positionally as NVRx defines them; ours have defaults.
    report = Report({0: 1.0}, {}, {0: 0.5}, {}, {0: "n"}, {}, {}, 0.1, False, 0)
    assert report.non_comparable == ()
    assert report.sustained_slowdowns == ()
    assert report.identify_stragglers()["straggler_gpus_individual"] == {StragglerId(0, "n")}
    assert report.identify_sustained_stragglers()["straggler_gpus_relative"] == set()


def test_json_form_follows_its_schema_with_null_for_nan() -> None:
    import dataclasses
    import importlib

    jsonschema: Any = importlib.import_module("jsonschema")  # test group; untyped

    from nvrx.straggler.report_format import REPORT_SCHEMA_VERSION, json_schema

    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    nan = dataclasses.replace(make_report(), gpu_relative_perf_scores={0: 1.0, 3: float("nan")})
    for report in (make_report(), nan):
        data = json.loads(report.to_json())
        jsonschema.validate(data, schema)
        assert (
            data["schema_version"]
            == REPORT_SCHEMA_VERSION
            == schema["properties"]["schema_version"]["const"]
        )
    assert json.loads(nan.to_json())["gpu_relative_perf_scores"] == {"0": 1.0, "3": None}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**json.loads(nan.to_json()), "extra": 1}, schema)
    assert "worst 1 of 1 ranks" in nan.format_table()  # NaN is not ranked


def test_the_rank_row_is_named_versioned_and_refuses_other_versions() -> None:
    from nvrx.straggler.rank_row import HEAD_FIELDS, ROW_VERSION, GatheredRows, RankRow

    row = RankRow(
        gpu_relative=0.5,
        gpu_relative_code=0.0,
        kernel_time_ms=3.0,
        section_individual=[1.0, 0.9],
        section_individual_code=[0.0, 0.0],
        section_relative=[0.8, float("nan")],
        section_relative_code=[0.0, 1.0],
        section_median_ms=[10.0, float("nan")],
    )
    wire = row.encode()
    assert wire[:2] == [ROW_VERSION, 2.0]
    assert len(wire) == RankRow.length(2) == 2 + len(HEAD_FIELDS) + 5 * 2
    rows = GatheredRows.from_rows([4, 7], [wire, wire])
    assert rows.head("gpu_relative") == [0.5, 0.5]
    assert rows.section("section_relative", 0) == [0.8, 0.8]
    assert rows.section("section_median_ms", 1)[0] != rows.section("section_median_ms", 1)[0]
    with pytest.raises(ValueError, match="version"):
        GatheredRows.from_rows([0, 1], [wire, [ROW_VERSION + 1.0, *wire[1:]]])
    with pytest.raises(ValueError, match="number of sections"):
        GatheredRows.from_rows([0, 1], [wire, RankRow().encode() + [0.0] * 10])
    with pytest.raises(ValueError, match="cells"):
        RankRow(section_median_ms=[1.0]).encode()
