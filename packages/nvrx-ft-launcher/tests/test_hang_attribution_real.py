"""A real ft_launcher job where one of 4 gloo ranks hangs in user code and the rest wait.

The launcher must name the hung rank first in the restart cause and in the journal's
``hang_attributed`` record, or say "undecided"; it must never name a rank that was only
waiting in the all_reduce.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable

import jsonschema  # type: ignore[import-untyped]
import pytest
from launcher_testkit import Launcher  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode
from nvrx.launcher.journal import schema_path

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]
WORLD = 4
HUNG = 2


@pytest.mark.timeout(180)
def test_hung_rank_is_named_first_never_a_waiting_one(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        [
            "--nproc-per-node", str(WORLD), "--max-restarts", "1",
            "--ft-rank-heartbeat-timeout", "4", "--ft-journal", str(journal),
            "--log-dir", str(tmp_path / "logs"), "--redirects", "3",
        ],
        ["--steps", "8", "--fault", f"sleep:{HUNG}:4"],
    )  # fmt: skip
    assert launcher.wait(160) == ExitCode.SUCCESS, launcher.log()
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(schema_path("journal").read_text()))
    for record in records:
        validator.validate(record)

    terminated = [r for r in records if r["event"] == "rank_terminated_by_monitor"]
    assert terminated, launcher.log()
    assert all(r["cycle"] == 0 for r in terminated)
    # The monitors' evidence reaches the journal.
    assert any(r.get("stack") is not None for r in terminated), terminated

    hangs = [r for r in records if r["event"] == "hang_attributed"]
    assert len(hangs) == 1, hangs
    finding = hangs[0]
    assert finding["culprit"] in (HUNG, None), finding
    assert HUNG not in finding["victims"], finding
    decision = next(r for r in records if r["event"] == "decision" and r["cycle"] == 0)
    cause = decision["reason"].split(": ", 1)[1]
    assert cause.startswith("hang: " + finding["sentence"]), decision["reason"]
    if finding["culprit"] is not None:
        assert finding["sentence"].startswith(f"rank {HUNG}:"), finding
        assert sorted(finding["victims"]) == [r for r in range(WORLD) if r != HUNG], finding
    else:
        assert "undecided" in finding["sentence"], finding
    log = launcher.log()
    assert log.count("hang in cycle 0: ") == 1, log


@pytest.mark.timeout(180)
def test_a_rank_stopped_by_sigstop_is_named_by_its_state(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    """The demo's hang (SimulatedFault: the rank SIGSTOPs itself): state T decides."""
    journal = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        [
            "--nproc-per-node", str(WORLD), "--max-restarts", "1",
            "--ft-rank-heartbeat-timeout", "4", "--ft-journal", str(journal),
        ],
        ["--steps", "8", "--fault", f"hang:{HUNG}:4"],
    )  # fmt: skip
    assert launcher.wait(160) == ExitCode.SUCCESS, launcher.log()
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    terminated = {r["rank"]: r for r in records if r["event"] == "rank_terminated_by_monitor"}
    assert terminated[HUNG]["proc_state"] == "T", terminated[HUNG]
    assert all(r["proc_state"] != "T" for k, r in terminated.items() if k != HUNG), terminated
    [finding] = [r for r in records if r["event"] == "hang_attributed"]
    assert finding["culprit"] == HUNG, (finding, sorted(terminated))
    assert finding["basis"] == ["stopped"], finding
    # The victims are the waiting ranks the monitors terminated: a rank whose all_reduce
    # failed when another was killed exits by itself first, leaving no evidence.
    assert sorted(finding["victims"]) == sorted(k for k in terminated if k != HUNG), finding
