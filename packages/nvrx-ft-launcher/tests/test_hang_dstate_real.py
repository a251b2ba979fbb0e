"""A real ft_launcher job with a rank stuck in the kernel (state D), as on a dead NFS server.

Rank 1 of 4 gloo ranks reads a file on a FUSE mount whose server never answers a READ
(:mod:`_dstate`) in cycle 0: read(2) sits in state ``D``, its stack dump cannot run,
its flight recorder still answers. The launcher names it, and the collective the others
wait in; its monitor ends it, and cycle 1 finishes the job. The ranks handle SIGTERM
(as frameworks that save on SIGTERM do): the handler cannot run in ``D``, so the
SIGKILL after the grace period ends the rank. (Without a handler the termination signal
is fatal and ends the wait at once: test_culprit_real's D-state test shows it.)
"""

from __future__ import annotations

import json
import pathlib
import sys

import jsonschema  # type: ignore[import-untyped]
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from _dstate import unavailable_reason, unserved_file  # type: ignore[import-not-found, unused-ignore]
from launcher_testkit import FAST_FT, Launcher  # type: ignore[import-not-found, unused-ignore]

from nvrx.launcher import ExitCode
from nvrx.launcher.journal import schema_path

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.slow,
    pytest.mark.skipif(unavailable_reason() is not None, reason=f"{unavailable_reason()}"),
]
WORLD = 4
HUNG = 1
_TRAIN = """\
import os, signal, sys, time
import torch
import torch.distributed as dist
from nvrx.ft import RankMonitorClient

path = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: print("SIGTERM handled", flush=True))
rank = int(os.environ["RANK"])
cycle = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
client = RankMonitorClient()
client.init_workload_monitoring()
dist.init_process_group("gloo")
for step in range(1, 9):
    if rank == {hung} and step == 4 and cycle == 0:
        print("reading", path, flush=True)
        open(path, "rb").read()  # state D until the monitor kills the rank
    dist.all_reduce(torch.ones(4))
    client.send_heartbeat()
    time.sleep(0.05)
dist.barrier()
client.shutdown_workload_monitoring()
dist.destroy_process_group()
"""


@pytest.mark.timeout(240)
def test_a_rank_in_state_d_is_named_killed_and_restarted(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(_TRAIN.replace("{hung}", str(HUNG)))
    journal = tmp_path / "journal.jsonl"
    out = tmp_path / "out"
    out.mkdir()
    with unserved_file() as blocking:
        args = [
            *FAST_FT, "--nproc-per-node", str(WORLD), "--max-restarts", "1",
            "--ft-rank-heartbeat-timeout", "4", "--ft-journal", str(journal),
            "--log-dir", str(tmp_path / "logs"), "--redirects", "3",
            str(script), str(blocking),
        ]  # fmt: skip
        launcher = Launcher(args, out, tmp_path / "launcher.log")
        try:
            code = launcher.wait(200)
        finally:
            launcher.kill_tree()  # before the mount goes: nothing of the job outlives it
    log = launcher.log()
    assert code == ExitCode.SUCCESS, log[-6000:]
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(schema_path("journal").read_text()))
    for record in records:
        validator.validate(record)
    terminated = {r["rank"]: r for r in records if r["event"] == "rank_terminated_by_monitor"}
    assert terminated[HUNG]["proc_state"] == "D", terminated[HUNG]
    assert terminated[HUNG]["stack"] is None, terminated[HUNG]
    [finding] = [r for r in records if r["event"] == "hang_attributed"]
    assert finding["culprit"] == HUNG, finding
    assert finding["victims"] == [0, 2, 3], finding
    assert finding["collective"] == {"op": "all_reduce", "group": "default_pg", "seq": 4}
    assert finding["culprit_frame"] == "blocked in the kernel", finding
    [line] = [t for t in log.splitlines() if "hang in cycle 0: " in t]
    assert f"rank {HUNG}: blocked in the kernel (state D), " in line, line
    assert f"wait in all_reduce #4 on default_pg while rank {HUNG} is blocked in the kernel" in (
        line
    )
    # The handler cannot run in D: the SIGKILL after the grace period ended the rank.
    assert f"rank pid {terminated[HUNG]['pid']} survived SIGTERM" in log, log[-6000:]
