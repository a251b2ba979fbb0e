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


LOCAL_JOURNAL = [
    {"event": "checkpoint_restored", "cycle": 0, "source": "none", "iteration": None,
     "snapshot_wall": None, "restore_s": 0.01, "ranks": {"0": "none", "1": "none"}},
    {"event": "checkpoint_restored", "cycle": 1, "source": "own", "iteration": 98,
     "snapshot_wall": 50.0, "restore_s": 0.02, "ranks": {"0": "own", "1": "own"}},
    {"event": "job_goodput", "summary": {
        "start": 0.0, "end": 60.0, "total_s": 60.0, "ettr": 0.5, "nodes": 1,
        "seconds": {"productive": 30.0, "startup": 20.0, "recomputed": 0.09, "exit": 0.0},
        "by_cause": {"crash": 10.0},
        "restarts": [{"from_cycle": 0, "cycle": 1, "cause": "crash", "recomputed_s": 0.09,
                      "restored_from": "own", "restored_iteration": 98}],
        "unknown": [],
    }},
]  # fmt: skip


def test_local_summary_says_where_the_state_came_from_and_what_was_lost(
    run_demo: ModuleType, tmp_path: pathlib.Path
) -> None:
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in LOCAL_JOURNAL))
    (tmp_path / "result.json").write_text(
        json.dumps({"attempt": 1, "global_step": 150, "final_loss": 0.03})
    )
    text, ok = run_demo.local_summary(tmp_path, 0, 60.0)
    assert ok, text
    lines = text.splitlines()
    assert "  - cycle 1: restored iteration 98 from this node's memory in 0.02 s" in lines
    assert "restart 0->1 (crash): work lost 0.09 s, state from own (iteration 98)" in lines
    assert lines[-1] == "RESULT: the crash cost 0.09 s of work"
    slow = [*LOCAL_JOURNAL[:2], json.loads(json.dumps(LOCAL_JOURNAL[2]).replace("0.09", "30.0"))]
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in slow))
    assert not run_demo.local_summary(tmp_path, 0, 60.0)[1]  # more than a few seconds lost
