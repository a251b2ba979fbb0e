"""Real ft_launcher jobs whose hang line names the collective the waiting ranks are in.

One of 4 gloo ranks hangs in user code (``sleep``) or calls another collective than the
others (``desync``: a broadcast on another group while they all-reduce). The launcher
turns torch's flight recorder on, each monitor reads its rank's before signalling it, and
the journal's ``hang_attributed`` record and the log line name the culprit, the
collective the others wait in (operation, process group, sequence number) and where the
culprit was instead.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Callable

import jsonschema  # type: ignore[import-untyped]
import pytest
from launcher_testkit import Launcher  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode
from nvrx.launcher.journal import schema_path

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]
WORLD = 4
HUNG = 1


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("fault", "doing"), [("sleep", "at train_script.py:"), ("desync", "in broadcast #1 on group ")]
)
def test_the_hang_line_names_the_collective(
    start_launcher: Start, tmp_path: pathlib.Path, fault: str, doing: str
) -> None:
    journal = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        [
            "--nproc-per-node", str(WORLD), "--max-restarts", "1",
            "--ft-rank-heartbeat-timeout", "4", "--ft-journal", str(journal),
            "--log-dir", str(tmp_path / "logs"), "--redirects", "3",
        ],
        ["--steps", "8", "--fault", f"{fault}:{HUNG}:4"],
    )  # fmt: skip
    assert launcher.wait(160) == ExitCode.SUCCESS, launcher.log()
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(schema_path("journal").read_text()))
    for record in records:
        validator.validate(record)
    terminated = {r["rank"]: r for r in records if r["event"] == "rank_terminated_by_monitor"}
    waiting = {"op": "all_reduce", "group": "default_pg", "seq": 4, "pending": True}
    assert sorted(r for r, t in terminated.items() if t["collective"] == waiting) == [0, 2, 3]
    assert terminated[HUNG]["collective"] != waiting, terminated[HUNG]
    [finding] = [r for r in records if r["event"] == "hang_attributed"]
    assert finding["culprit"] == HUNG, finding
    assert HUNG not in finding["victims"], finding
    assert "collective" in finding["basis"], finding
    # Step 4 of each rank all-reduces its 4th time on the default group.
    assert finding["collective"] == {"op": "all_reduce", "group": "default_pg", "seq": 4}, finding
    assert finding["culprit_frame"].startswith(doing), finding
    log = launcher.log()
    [line] = [t for t in log.splitlines() if "hang in cycle 0: " in t]
    assert re.search(
        rf"ranks 0, 2, 3 wait in all_reduce #4 on default_pg while rank {HUNG} is ", line
    ), line
