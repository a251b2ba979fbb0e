"""A real ft_launcher job whose ranks survive SIGTERM: the hang is explained at once.

Frameworks that save on SIGTERM (Lightning, NeMo) keep a hung rank alive through the
monitors' termination signal, so it exits only at the SIGKILL that ends the grace
period. The launcher must not wait for that exit to name the culprit: it attributes
the hang as soon as every local rank whose monitor saw it has reported (or the short
evidence wait ends), seconds before the ranks are gone; the rest of the failure
handling (``rank_failed``, the decision, the stop, the restart) follows the exits as
before. Times are compared between the journal's own records, never with a fixed bound.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from launcher_testkit import Launcher  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode
from nvrx.launcher.journal import schema_path

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]
WORLD = 2
HUNG = 1
#: Longer than FAST_FT's, so the wait for the exits is plain to see in the records.
GRACE_S = 8.0


def _first(records: list[dict[str, Any]], event: str) -> tuple[int, dict[str, Any]]:
    return next((i, r) for i, r in enumerate(records) if r["event"] == event)


@pytest.mark.timeout(200)
def test_the_culprit_is_named_before_the_ranks_survive_sigterm(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        [
            "--nproc-per-node", str(WORLD), "--max-restarts", "1",
            "--ft-rank-heartbeat-timeout", "4", "--ft-journal", str(journal),
            "--ft-rank-termination-grace-period", str(GRACE_S),
        ],
        ["--steps", "8", "--fault", f"sleep:{HUNG}:4", "--ignore-sigterm"],
    )  # fmt: skip
    assert launcher.wait(180) == ExitCode.SUCCESS, launcher.log()
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(schema_path("journal").read_text()))
    for record in records:
        validator.validate(record)

    i_report, report = _first(records, "rank_terminated_by_monitor")
    i_found, finding = _first(records, "hang_attributed")
    i_failed, failed = _first(records, "rank_failed")
    i_decision, decision = _first(records, "decision")
    i_stopped, _ = _first(records, "workers_stopped")
    i_restart, _ = _first(records, "restart")
    assert [r["event"] for r in records].count("hang_attributed") == 1, records
    assert finding["culprit"] == HUNG, finding
    # The records keep their order: evidence, attribution, failures, decision, stop, restart.
    assert i_report < i_found < i_failed < i_decision < i_stopped < i_restart, records
    assert decision["reason"].split(": ", 1)[1].startswith("hang: " + finding["sentence"])
    # The ranks survived SIGTERM: they failed only at the SIGKILL after the grace period
    # (the monitor sends it no earlier than GRACE_S after the report).
    until_exit = failed["t"] - report["t"]
    named_after = finding["t"] - report["t"]
    assert until_exit > GRACE_S / 2, (until_exit, records)
    # Named in the first half of that wait (at once, in fact: within the evidence wait).
    assert named_after < until_exit / 2, (named_after, until_exit)

    log = launcher.log()
    lines = log.splitlines()
    hang_lines = [i for i, line in enumerate(lines) if "hang in cycle 0: " in line]
    assert len(hang_lines) == 1, log[-6000:]
    survived = [i for i, line in enumerate(lines) if "survived SIGTERM" in line]
    assert survived, log[-6000:]
    assert hang_lines[0] < min(survived), "\n".join(lines[-80:])
