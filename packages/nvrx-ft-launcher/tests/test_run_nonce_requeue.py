"""A requeued run does not follow the earlier run's signed decision (issue 26, item 4).

Real launchers on a c10d rendezvous whose TCPStore this test hosts, so the store outlives
the first run as etcd or an external store would. The first run restarts once (a signed
restart decision of cycle 0 is in the store) and is killed, as a preempted job is; the
requeued run, same ``--rdzv-id`` and job key, must start at cycle 0 and journal the old
decision as ignored: with the scheduler's next requeue count (a new nonce record), and
with the same count (Kubernetes restarting the job: the earlier run's record is there,
nobody answers its challenge, so the new run replaces it).
"""

from __future__ import annotations

import datetime
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from launcher_testkit import Launcher, free_port, read_events, wait_for  # type: ignore[import-not-found]
from torch._C._distributed_c10d import TCPStore

from nvrx.launcher import ExitCode

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]
RUN_ID = "requeuejob"


def _journal(log_dir: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_dir / "ft_launcher_events.jsonl").open()]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("attempts", [("0", "1"), ("0", "0")], ids=["next-attempt", "same-attempt"])
def test_a_requeued_run_ignores_the_earlier_runs_signed_decision(
    start_launcher: Start, tmp_path: pathlib.Path, attempts: tuple[str, str]
) -> None:
    key_file = tmp_path / "job.key"
    key_file.write_text("0123456789abcdef0123456789abcdef\n")
    key_file.chmod(0o600)
    port = free_port()
    store = TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )
    rdzv = [
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        RUN_ID,
        "--rdzv-conf",
        "is_host=false",
    ]
    first_logs = tmp_path / "logs1"
    first = start_launcher(
        [*rdzv, "--max-restarts", "3", "--log-dir", str(first_logs)],
        ["--steps", "100000", "--no-checkpoint", "--fault", "sigkill:1:5"],
        env={"NVRX_JOB_KEY_FILE": str(key_file), "SLURM_RESTART_CNT": attempts[0]},
        name="first",
    )
    try:
        wait_for(
            lambda: any(
                e["event"] == "step" and e.get("cycle") == 1 for e in read_events(first.out)
            ),
            timeout=150,
            what="the first run to restart and train again",
        )
    finally:
        first.kill_tree()  # preempted: no clean exit, the rendezvous stays open
    decision_key = f"nvrx.launcher.{RUN_ID}/cycle/0/decision"
    old = json.loads(json.loads(store.get(decision_key))["body"])
    assert old["action"] == "restart", old

    second_logs = tmp_path / "logs2"
    second = start_launcher(
        [*rdzv, "--max-restarts", "0", "--log-dir", str(second_logs)],
        ["--steps", "10", "--no-checkpoint"],
        env={"NVRX_JOB_KEY_FILE": str(key_file), "SLURM_RESTART_CNT": attempts[1]},
        name="second",
    )
    assert second.wait(200) == ExitCode.SUCCESS, second.log()[-4000:]
    log = second.log()
    assert f"ignoring the value under nvrx.launcher.{RUN_ID}/cycle/0/decision" in log, log
    if attempts[0] == attempts[1]:
        # The earlier run's record stood; its challenge went unanswered (SIGKILLed).
        assert "that run is over" in log, log
    journal = _journal(second_logs)
    ignored = [e for e in journal if e["event"] == "store_value_ignored"]
    assert [e for e in ignored if e["key"] == decision_key], ignored
    assert all("earlier run" in e["why"] for e in ignored), ignored
    # Logged once per value, not at every read.
    assert len([e for e in ignored if e["key"] == decision_key]) == 1, ignored
    # The new run starts at cycle 0: it did not follow the old restart.
    cycles = [e["cycle"] for e in journal if e["event"] == "cycle_start"]
    assert cycles == [0], journal
    assert not [e for e in journal if e["event"] == "decision"], journal
