"""A node that joins a running job takes the job's run nonce (issue 26, item 4).

Real launchers with a job key on a c10d rendezvous: the first node trains alone, the
second joins later, so torch's rendezvous holds the first launcher's main thread while
the second asks whether the run's nonce record is live. The first launcher's answering
thread (on a store connection of its own) answers; the second adopts the nonce, and the
job's signed values verify on both nodes.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import pytest
from launcher_testkit import Launcher, free_port, read_events, wait_for  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]


@pytest.mark.timeout(240)
def test_a_node_joining_a_running_job_adopts_its_nonce(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    key_file = tmp_path / "job.key"
    key_file.write_text("0123456789abcdef0123456789abcdef\n")
    key_file.chmod(0o600)
    env = {"NVRX_JOB_KEY_FILE": str(key_file)}
    port = free_port()
    common = [
        "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", "joinjob", "--local-addr", "127.0.0.1",
    ]  # fmt: skip
    # Cycle 0 trains long enough (15 s) for the second launcher to start and join.
    script = ["--steps", "300", "--step-time", "0.05", "--no-checkpoint"]
    conf = "last_call_timeout=1,is_host="
    first = start_launcher([*common, "--rdzv-conf", conf + "1"], script, name="node0", env=env)
    # Its rank trains (world 1) before the second node comes: with a fast start the join
    # could otherwise restart cycle 0 before its rank logged a step.
    wait_for(
        lambda: any(e["event"] == "start" for e in read_events(first.out)),
        timeout=120,
        what="the first node's rank to start training",
    )
    second = start_launcher([*common, "--rdzv-conf", conf + "0"], script, name="node1", env=env)
    assert second.wait(200) == ExitCode.SUCCESS, first.log() + second.log()
    assert first.wait(60) == ExitCode.SUCCESS, first.log() + second.log()
    # Both trained together after the join: the second node's values verified.
    starts = [e for e in read_events(first.out) if e["event"] == "start"]
    assert sorted({e["world"] for e in starts}) == [1, 2], starts
    assert "created the nonce of this run" in first.log()
    log = second.log()
    assert "created the nonce of this run" not in log, log
    assert "that run is over" not in log, log
    assert "ignoring the value" not in first.log() + log
