"""The fault matrix, job side: how a run ends, with which exit code, and nothing left behind.

Crash loops stopped by the progress rule, a spent restart budget, SIGTERM to the
launcher, a node of a two-node job killed outright, and a bad configuration file.
Exit codes are those of :class:`nvrx.launcher.exit_codes.ExitCode`.
"""

from __future__ import annotations

import os
import pathlib
import signal
import uuid

import psutil
import pytest
from conftest import Launch
from itest_harness import free_port, matches, restart_reasons, wait_for

from nvrx.launcher.exit_codes import ExitCode, exit_code_for_signal

pytestmark = pytest.mark.multiprocess


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_crash_loop_stops_on_the_progress_rule(launch: Launch, out_dir: pathlib.Path) -> None:
    # Rank 1 fails before step 5 in every attempt. Attempt 0 checkpoints step 3
    # (progress); attempts 1 and 2 resume from 3 and fail before reaching 6.
    run = launch(
        ["--fault", "raise:1:5:*", "--checkpoint-every", "3"],
        [
            "--max-restarts=10",
            f"--ft-progress-file={out_dir / 'progress'}",
            "--ft-max-no-progress-restarts=1",
        ],
    )
    run.expect_exit(ExitCode.NO_PROGRESS, timeout=210)
    cycles = run.cycles()
    assert [c["action"] for c in cycles] == ["restart", "restart", "stop"], cycles
    assert "no progress" in cycles[-1]["reason"]
    starts = {e["attempt"] for e in run.journal() if e["event"] == "start"}
    assert starts == {0, 1, 2}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_restarts_exhausted(launch: Launch) -> None:
    run = launch(["--fault", "exit:1:2:*"], ["--max-restarts=1"])
    run.expect_exit(ExitCode.RESTARTS_EXHAUSTED, timeout=150)
    cycles = run.cycles()
    assert [c["action"] for c in cycles] == ["restart", "stop"], cycles
    reason = cycles[-1]["reason"]
    assert matches(r"rank 1 .* exited with code 7; no restarts left \(1/1 used\)", reason)
    starts = {e["attempt"] for e in run.journal() if e["event"] == "start"}
    assert starts == {0, 1}


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sigterm_to_the_launcher_stops_every_rank(launch: Launch) -> None:
    run = launch(["--steps", "200", "--step-time", "0.2", "--record-sigterm"])
    run.wait_until(lambda: run.steps_done(rank=1) >= 2, 90, "rank 1 at step 2")
    early = restart_reasons(run.cycles())
    assert not early, f"restarted before SIGTERM was sent: {early}"
    os.kill(run.pid, signal.SIGTERM)
    run.expect_exit(exit_code_for_signal(signal.SIGTERM), timeout=60)
    journal = run.journal()
    forwarded = sorted(e["rank"] for e in journal if e["event"] == "sigterm")
    assert forwarded == [0, 1], "SIGTERM was not forwarded to every rank"
    assert not restart_reasons(run.cycles()), "a signal to the launcher must not restart"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_node_killed_the_other_exits_with_its_code(launch: Launch) -> None:
    """Two launchers on one machine act as two nodes; SIGKILL one of them.

    The killed node's ranks and monitors die with it (they are tied to their
    launcher). The survivor sees its rank fail, decides a restart, cannot gather the
    two nodes the job needs within the rendezvous join timeout, and exits with the
    launcher-error code after stopping everything it started.
    """
    port = free_port()
    common = [
        "--nnodes=2",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-backend=c10d",
        f"--rdzv-id=itest-{uuid.uuid4().hex[:8]}",
        "--rdzv-conf=join_timeout=20",
    ]
    script = ["--steps", "200", "--step-time", "0.2"]
    host = launch(script, common, name="node0", nproc=1, standalone=False)

    def listening() -> bool:
        try:
            conns = psutil.Process(host.pid).net_connections(kind="tcp")
        except psutil.Error:
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)

    # node0 must host the rendezvous store, so that it is node1 that goes away.
    wait_for(listening, 60, "node0 to host the rendezvous store")
    other = launch(script, common, name="node1", nproc=1, standalone=False)
    host.wait_until(lambda: host.steps_done(attempt=0, rank=1) >= 2, 120, "both nodes training")
    victims = [p for p in psutil.Process(other.pid).children(recursive=True)]
    assert victims, "node1 has no ranks or monitors"
    os.kill(other.pid, signal.SIGKILL)
    other.wait(10)
    _, alive = psutil.wait_procs(victims, timeout=10)
    assert not alive, f"node1's children outlived it: {alive}"

    host.expect_exit(ExitCode.LAUNCHER_ERROR, timeout=120)
    cycles = host.cycles()
    assert [c["action"] for c in cycles] == ["restart", "stop"], cycles
    assert cycles[0]["charged"], cycles[0]
    assert matches(r"rank 0 \(local rank 0, pid \d+\) exited with code 1", cycles[0]["reason"])
    assert cycles[1]["exit_code"] == ExitCode.LAUNCHER_ERROR
    assert "rendezvous" in cycles[1]["reason"], cycles[1]


BAD_CONFIGS = {
    "syntax-error": ("fault_tolerance: {rank_heartbeat_timeout: [1, 2\n", r"bad\.yaml: .*YAML"),
    "bad-value": (
        "fault_tolerance:\n  rank_heartbeat_timeout: -3\n",
        r"rank_heartbeat_timeout: invalid value -3",
    ),
    # A misspelt field is a warning with a suggestion since NVRx compatibility (issue 12,
    # item 4); YAML aliases are refused (issue 13, item 10).
    "alias": (
        "base: &t 3\nfault_tolerance:\n  rank_heartbeat_timeout: *t\n",
        r"bad\.yaml: .*[Aa]lias",
    ),
    "self-alias": ("fault_tolerance: &a\n  x: *a\n", r"bad\.yaml: .*[Aa]lias"),
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("text", "message"), list(BAD_CONFIGS.values()), ids=list(BAD_CONFIGS))
def test_bad_yaml_config_is_a_usage_error(
    launch: Launch, tmp_path: pathlib.Path, text: str, message: str
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    run = launch([], [f"--ft-cfg-path={cfg}"])
    run.expect_exit(ExitCode.USAGE_ERROR, timeout=60)
    log = run.log()
    assert "Traceback" not in log, log[-3000:]
    assert matches(message, log), f"{message!r} not in:\n{log[-3000:]}"
    assert not run.journal(), "no rank may start with a bad configuration"
