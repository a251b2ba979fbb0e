"""An outside process that writes to the rendezvous store does not steer the job.

Real launchers on a c10d rendezvous whose TCPStore listens on a known port; the
"attacker" is this test, connecting to that store as any process on the network could.
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
RUN_ID = "authjob"


def _rdzv(port: int) -> list[str]:
    return [
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
    ]


def _forge(port: int, cycles: tuple[int, ...]) -> None:
    """Write a garbage value, a forged stop and a forged free restart for each cycle."""
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    prefix = f"nvrx.launcher.{RUN_ID}"
    for cycle in cycles:
        key = f"{prefix}/cycle/{cycle}/decision"
        stop = {
            "action": "stop",
            "reason": "forged",
            "node": "evil",
            "state": {"cycle": cycle, "charged": 0, "no_progress": 0},
            "stop_cause": "restarts_exhausted",
            "charged": False,
            "excluded_node": None,
        }
        restart = dict(stop, action="restart", stop_cause=None)
        restart["state"] = {"cycle": cycle + 1, "charged": 0, "no_progress": 0}
        for value in [
            "\x00not json at all",
            json.dumps({"v": 1, "body": json.dumps(stop), "mac": "00" * 32}),
            json.dumps({"v": 1, "body": json.dumps(restart), "mac": None}),
        ]:
            store.set(key, value)
            store.set(f"{prefix}/state", value)


def _key_file(tmp_path: pathlib.Path, mode: int) -> pathlib.Path:
    """A job key file with these permissions."""
    key_file = tmp_path / "job.key"
    key_file.write_text("0123456789abcdef0123456789abcdef\n")
    key_file.chmod(mode)
    return key_file


def _journal(log_dir: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_dir / "ft_launcher_events.jsonl").open()]


@pytest.mark.timeout(180)
def test_forged_decisions_do_not_steer_a_job_with_a_key(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    key_file = _key_file(tmp_path, 0o600)
    port = free_port()
    log_dir = tmp_path / "logs"
    launcher = start_launcher(
        [*_rdzv(port), "--max-restarts", "1", "--log-dir", str(log_dir)],
        ["--steps", "80", "--fault", "sigkill:1:50"],
        env={"NVRX_JOB_KEY_FILE": str(key_file)},
    )
    wait_for(
        lambda: any(e["event"] == "step" for e in read_events(launcher.out)),
        what="training to start",
    )
    _forge(port, (0, 1))
    assert launcher.wait(150) == ExitCode.SUCCESS, launcher.log()
    log = launcher.log()
    assert "no job key" not in log
    assert "ignoring the value under" in log
    journal = _journal(log_dir)
    ignored = [e for e in journal if e["event"] == "store_value_ignored"]
    assert ignored, journal
    assert all("job's key" in e["why"] or "JSON" in e["why"] for e in ignored), ignored
    # The one real failure was the one decision: a restart charged to the budget.
    decisions = [e for e in journal if e["event"] == "decision"]
    assert [(d["action"], d["charged"], d["restarts_charged"]) for d in decisions] == [
        ("restart", True, 1)
    ], decisions


@pytest.mark.timeout(180)
def test_without_a_key_garbage_is_ignored_and_the_launcher_warns(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    port = free_port()
    log_dir = tmp_path / "logs"
    launcher = start_launcher(
        [*_rdzv(port), "--max-restarts", "0", "--log-dir", str(log_dir)], ["--steps", "40"]
    )
    wait_for(
        lambda: any(e["event"] == "step" for e in read_events(launcher.out)),
        what="training to start",
    )
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    store.set(f"nvrx.launcher.{RUN_ID}/cycle/0/decision", "not json")  # exit 5 before
    assert launcher.wait(150) == ExitCode.SUCCESS, launcher.log()
    log = launcher.log()
    # One node: no warning a single-node user cannot act on, but the INFO says what to do.
    assert "WARNING: no job key" not in log
    assert "single node without a job key: on a machine shared with other users" in log
    assert "ignoring the value under" in log


@pytest.mark.timeout(60)
def test_a_key_file_others_can_read_is_refused(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    key_file = _key_file(tmp_path, 0o644)
    launcher = start_launcher(
        ["--standalone", "--nproc-per-node", "1"],
        ["--steps", "2"],
        env={"NVRX_JOB_KEY_FILE": str(key_file)},
    )
    assert launcher.wait(60) == ExitCode.USAGE_ERROR, launcher.log()
    assert "owner-only" in launcher.log()
    assert not read_events(launcher.out)  # no rank started


@pytest.mark.timeout(180)
def test_a_forged_run_nonce_record_is_journalled_and_replaced(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    # The store is this test's (as an external store or etcd would be), so the forged
    # record is there before the launcher's first read of it.
    key_file = _key_file(tmp_path, 0o600)
    port = free_port()
    store = TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    record = f"nvrx.launcher.{RUN_ID}/run_nonce/0"  # attempt 0: no SLURM_RESTART_CNT
    forged = json.dumps({"v": 1, "body": json.dumps({"nonce": "a" * 32}), "mac": "00" * 32})
    store.set(record, forged)
    log_dir = tmp_path / "logs"
    launcher = start_launcher(
        [*_rdzv(port), "--rdzv-conf", "is_host=false", "--max-restarts", "0",
         "--log-dir", str(log_dir)],
        ["--steps", "5", "--no-checkpoint"],
        env={"NVRX_JOB_KEY_FILE": str(key_file)},
    )  # fmt: skip
    assert launcher.wait(150) == ExitCode.SUCCESS, launcher.log()
    log = launcher.log()
    assert store.get(record).decode() != forged, log[-3000:]  # replaced by a signed one
    ignored = [e for e in _journal(log_dir) if e["event"] == "store_value_ignored"]
    assert [e["key"] for e in ignored] == [record], ignored
    assert "job's key" in ignored[0]["why"], ignored
    assert "replacing the run nonce record" in ignored[0]["why"], ignored
