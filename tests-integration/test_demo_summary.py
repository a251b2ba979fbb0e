"""The demo's summary reads the launcher's journal: the hung rank and the goodput split."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys
from types import ModuleType

import pytest

DEMO = pathlib.Path(__file__).resolve().parents[1] / "examples" / "demo" / "run_demo.py"


@pytest.fixture(scope="module")
def run_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_demo", DEMO)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_demo"] = module
    spec.loader.exec_module(module)
    return module


SENTENCE = "rank 1: last heartbeat 8.0 s ago, stack in train.py:53; ranks 0: blocked in all_reduce"
JOURNAL = [
    {"event": "decision", "action": "restart", "cycle": 0, "reason": "on node n: rank 1 died"},
    {"event": "restart", "cycle": 1, "total_s": 1.5, "stop_s": 0.5, "rendezvous_s": 0.5,
     "spawn_s": 0.5},
    {"event": "decision", "action": "restart", "cycle": 1,
     "reason": "on node n: hang: " + SENTENCE},
    {"event": "hang_attributed", "cycle": 1, "culprit": 1, "victims": [0], "basis": ["stack"],
     "reason": "r", "sentence": SENTENCE},
    {"event": "restart", "cycle": 2, "total_s": 1.0, "stop_s": 0.5, "rendezvous_s": 0.25,
     "spawn_s": 0.25},
    {"event": "job_goodput", "summary": {
        "start": 0.0, "end": 100.0, "total_s": 100.0, "ettr": 0.8, "nodes": 1,
        "seconds": {"productive": 80.0, "startup": 5.0, "detection": 10.0, "stop": 5.0,
                    "exit": 0.0},
        "by_cause": {"hang": 12.0, "crash": 3.0}, "restarts": [],
        "unknown": ["cycle 1: first step"],
    }},
]  # fmt: skip


def test_summary_names_the_hung_rank_and_splits_the_time(
    run_demo: ModuleType, tmp_path: pathlib.Path
) -> None:
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in JOURNAL))
    text, ok = run_demo.summary(tmp_path, 1, 100.0)
    assert not ok  # no result.json: training did not finish
    lines = text.splitlines()
    hung = lines.index("hung rank (named first, then the ranks waiting on it):")
    assert lines[hung + 1] == f"  - cycle 1: {SENTENCE}"
    assert "goodput: ETTR 80.0% of 100.0 s wall time" in lines
    assert any(line.split() == ["productive", "80.00", "s", "80.0%"] for line in lines), text
    assert any(line.split() == ["detection", "10.00", "s", "10.0%"] for line in lines), text
    assert not any(line.split()[:1] == ["exit"] for line in lines), text  # zero phases omitted
    # Badput by cause, largest first.
    assert text.index("badput from hang: 12.00 s") < text.index("badput from crash: 3.00 s")
    assert "not in the records: cycle 1: first step" in text


def test_summary_without_the_records_says_so(run_demo: ModuleType, tmp_path: pathlib.Path) -> None:
    text, _ = run_demo.summary(tmp_path, 0, 1.0)
    assert "hangs: none" in text
    assert "goodput: no job_goodput record in the journal" in text
