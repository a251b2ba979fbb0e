"""tools/trace_picture.py draws a job trace as well-formed SVG, one bar per slice."""

from __future__ import annotations

import importlib.util
import pathlib
import xml.etree.ElementTree as ET
from types import ModuleType

import pytest

from nvrx.launcher._trace import job_trace

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(30)


def picture_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "trace_picture", ROOT / "tools" / "trace_picture.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records() -> list[dict[str, object]]:
    def rec(event: str, t: float, **fields: object) -> dict[str, object]:
        return {"event": event, "t": t, "node": "a", "schema_version": 1, **fields}

    return [
        rec("run_start", 0.0, run_id="job"),
        rec("workers_started", 2.0, cycle=0, group_rank=0),
        rec("first_step", 10.0, cycle=0),
        rec("rank_failed", 80.0, cycle=0, rank=1, exit_code=-9, signal="SIGKILL"),
        rec("decision", 80.0, cycle=0, action="restart", failure_noticed=80.0),
        rec(
            "restart",
            83.0,
            from_cycle=0,
            cycle=1,
            workers_stopped=81.0,
            rendezvous_done=82.0,
            workers_started=83.0,
        ),
        rec("first_step", 90.0, cycle=1),
        rec("all_nodes_finished", 190.0, cycle=1),
        rec("finished", 191.0, exit_code=0),
    ]


def test_svg_has_a_bar_per_slice_and_a_mark_per_instant(tmp_path: pathlib.Path) -> None:
    trace = job_trace(records(), job="demo")
    svg = picture_tool().draw(trace)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    bars = root.findall(f"{ns}rect")[1:]  # the first is the background
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert len(bars) == len(slices)
    assert len(root.findall(f"{ns}path")) == len(instants)
    titles = [b.find(f"{ns}title").text or "" for b in bars]  # type: ignore[union-attr]
    assert any(t.startswith("detection") for t in titles), titles
    assert "rank 1 failed (SIGKILL)" in svg
    assert svg == picture_tool().draw(trace)  # same picture every time
