"""NVRx users change only imports: downstream projects' call shapes, run for real.

Each test is a real ``ft_launcher`` run on CPU (gloo, 2 ranks) written from what NeMo,
NeMo-Run, NeMo-Framework-Launcher, Megatron-LM and Megatron-Bridge document they pass
to NVRx (the NeMo and Megatron rows of ``nvrx_surface.py``): their launch lines,
a whole NeMo job YAML, their constructor keywords, their section names and FT state
files. Each asserts the outcome NVRx gives. The scripts are ours (``scripts/``), not
copies of those projects' code.
"""

from __future__ import annotations

import inspect
import json
import math
import pathlib
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence

import pytest
from conftest import Launch
from itest_harness import (
    DDP_STEPS,
    LauncherRun,
    assert_every_step_once,
    free_port,
    matches,
    restart_reasons,
)

from nvrx.ptl import FaultToleranceCallback

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"
MEGATRON = SCRIPTS / "compat_megatron.py"
BRIDGE = SCRIPTS / "compat_bridge.py"
LIGHTNING = SCRIPTS / "compat_lightning.py"
RANK1 = r"rank 1 \(local rank 1, pid \d+\)"

ExactLaunch = Callable[[Sequence[str]], LauncherRun]


@pytest.fixture
def exact_launch(tmp_path: pathlib.Path, out_dir: pathlib.Path) -> Iterator[ExactLaunch]:
    """``ft_launcher ARGS`` exactly as a downstream project writes them (no test defaults
    beyond the harness's log options); afterwards fail if a process was left behind."""
    runs: list[LauncherRun] = []
    logs = tmp_path / "exact-logs"
    logs.mkdir()

    def start(args: Sequence[str]) -> LauncherRun:
        run = LauncherRun(f"launcher{len(runs)}", list(args), out_dir, logs)
        runs.append(run)
        return run

    try:
        yield start
    finally:
        problems = [problem for run in runs for problem in run.cleanup()]
        if problems:
            pytest.fail("processes left behind:\n" + "\n".join(problems), pytrace=False)


def _rdzv(style: str = "-") -> list[str]:
    """torchrun's rendezvous options on one node, in NeMo-Run's or NeMo-Launcher's spelling."""
    sep = "-" if style == "-" else "_"
    return [
        f"--rdzv{sep}backend=c10d",
        f"--rdzv{sep}endpoint=127.0.0.1:{free_port()}",
        f"--rdzv{sep}id={uuid.uuid4().hex}",
        "--nnodes=1",
        f"--nproc{sep}per{sep}node=2",
    ]


@pytest.mark.timeout(150)
def test_nemo_run_launch_line_restarts_a_hung_rank(
    exact_launch: ExactLaunch, out_dir: pathlib.Path
) -> None:
    """NeMo-Run's FaultTolerance launcher: ``--ft-param-*`` values, then torchrun's options
    with ``--tee 3 --no-python``; a rank that stops is killed with the given signal."""
    run = exact_launch(
        [
            "--ft-param-workload_check_interval", "0.1",
            "--ft-param-initial_rank_heartbeat_timeout", "60",
            "--ft-param-rank_heartbeat_timeout", "4",
            "--ft-param-rank_termination_signal", "SIGKILL",
            "--ft-param-log_level", "INFO",
            "--max-restarts", "2",
            *_rdzv(),
            "--node-rank", "0",
            "--tee", "3",
            "--no-python",
            sys.executable, str(DDP_STEPS), "--out", str(out_dir),
            "--fault", "hang:1:4:0",
        ]
    )  # fmt: skip
    run.expect_exit(0, timeout=130)
    reasons = restart_reasons(run.cycles())
    assert len(reasons) == 1, reasons
    assert matches(rf"{RANK1} was killed by signal SIGKILL.*heartbeat_timeout", reasons[0])
    assert_every_step_once(run.journal(), 12)
    log = run.log()
    assert "--ft-param-rank_heartbeat_timeout is deprecated" in log


NEMO_JOB_YAML = """\
name: megatron_gpt
trainer:
  devices: 2
  num_nodes: 1
  max_steps: 12
exp_manager:
  explicit_log_dir: /results
  create_fault_tolerance_callback: true
  fault_tolerance:
    workload_check_interval: 0.1
    initial_rank_heartbeat_timeout: 60
    rank_heartbeat_timeout: 4
    calculate_timeouts: true
    safety_factor: 5.0
    rank_termination_signal: 9
    log_level: INFO
    max_rank_restarts: 0
    max_subsequent_job_failures: 2
    additional_ft_launcher_args: ""
    simulated_fault:
      fault_type: rank_killed
      base_delay: 300
model:
  micro_batch_size: 1
"""


@pytest.mark.timeout(150)
def test_nemo_launcher_reads_the_whole_job_yaml(
    exact_launch: ExactLaunch, out_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """NeMo-Framework-Launcher: ``--fault-tol-cfg-path=$FAULT_TOL_CFG_PATH`` (the whole
    job YAML, NeMo's own keys included) with ``--ignore-missing-fault-tol-cfg`` and the
    underscore spellings; the YAML's timeouts and signal (as a number) are in force."""
    job_yaml = tmp_path / "job.yaml"
    job_yaml.write_text(NEMO_JOB_YAML)
    run = exact_launch(
        [
            f"--fault-tol-cfg-path={job_yaml}",
            "--ignore-missing-fault-tol-cfg",
            *_rdzv("_"),
            "--max-restarts=1",
            str(DDP_STEPS), "--out", str(out_dir), "--fault", "hang:1:5:0",
        ]
    )  # fmt: skip
    run.expect_exit(0, timeout=130)
    reasons = restart_reasons(run.cycles())
    assert len(reasons) == 1, reasons
    # rank_termination_signal: 9 is SIGKILL, rank_heartbeat_timeout: 4 (not 2700).
    assert matches(rf"{RANK1} was killed by signal SIGKILL.*heartbeat_timeout", reasons[0])
    assert_every_step_once(run.journal(), 12)
    ignored = [line for line in run.log().splitlines() if "max_subsequent_job_failures" in line]
    assert len(ignored) == 1, f"expected one warning naming NeMo's keys: {ignored}"
    for key in ("calculate_timeouts", "max_rank_restarts", "additional_ft_launcher_args"):
        assert key in ignored[0], ignored[0]


@pytest.mark.timeout(180)
def test_megatron_lm_sections_warmup_and_ft_state_json(
    launch: Launch, out_dir: pathlib.Path
) -> None:
    """Megatron-LM: ``init_workload_monitoring(num_warmup_iters=2)`` with its launch flags.

    The first two steps take longer than the ``step`` timeout and pass (warmup); a
    hang in ``step`` later is killed by that timeout; the FT state saved to
    ``ft_state.json`` from ``state_dict()`` is loaded by the next attempt.
    """
    run = launch(
        ["--hang", "1:4:0", "--exit-after-save", "1:1", "--slow-time", "4"],
        [
            "--ft-param-rank_section_timeouts=setup:60,step:3,checkpointing:60,warmup:30",
            "--ft-param-rank_out_of_section_timeout=30",
        ],
        script=MEGATRON,
    )
    run.expect_exit(0, timeout=160)
    reasons = restart_reasons(run.cycles())
    assert len(reasons) == 2, reasons
    assert matches(rf"{RANK1} .*section_timeout, section 'step'", reasons[0]), reasons[0]
    assert matches(rf"{RANK1} exited with code 7", reasons[1]), reasons[1]
    journal = run.journal()
    slow = [e for e in journal if e["event"] == "step" and e["slow"]]
    assert sorted((e["rank"], e["step"]) for e in slow) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    hang = [e for e in journal if e["event"] == "fault" and e["kind"] == "hang_in_section"]
    assert [(e["attempt"], e["step"]) for e in hang] == [(0, 4)]
    saved = [e for e in journal if e["event"] == "saved" and e["attempt"] == 1 and e["rank"] == 0]
    assert len(saved) == 1, saved
    assert saved[0]["calculated"] is True, saved
    state = json.loads((out_dir / "ft_state.json").read_text())
    assert "current_timeouts" in state
    inits = {(e["attempt"], e["rank"]): e for e in journal if e["event"] == "init"}
    for rank in (0, 1):
        assert inits[(0, rank)]["loaded"] is False
        later = inits[(2, rank)]
        assert later["loaded"] is True
        # What attempt 1 calculated and saved is what attempt 2 starts with.
        assert later["timeouts"]["section"] == saved[0]["timeouts"]["section"]
        assert set(later["timeouts"]["calculated_sections"]) >= {"setup", "step", "checkpointing"}


@pytest.mark.timeout(150)
def test_megatron_bridge_straggler_report_by_rank(launch: Launch) -> None:
    """Megatron-Bridge: FT sections with its flags and the straggler Detector calls;
    rank 1 is three times slower and is named, and every score is readable by rank."""
    run = launch(
        [],
        ["--ft-rank_section_timeouts=setup:60,step:20", "--ft-rank_out_of_section_timeout=30"],
        script=BRIDGE,
    )
    run.expect_exit(0, timeout=130)
    assert restart_reasons(run.cycles()) == []
    journal = run.journal()
    section = next(e["section"] for e in journal if e["event"] == "start")
    assert section == "TrainStepWrapper.train_step"
    reports = {r: [e for e in journal if e["event"] == "report" and e["rank"] == r] for r in (0, 1)}
    assert reports[0], "rank 0 got no straggler report"
    assert len(reports[0]) == len(reports[1]), "ranks disagree on when an interval elapsed"
    assert not any(e["has_report"] for e in reports[1]), "gather_on_rank0: rank 1 gets None"
    last = reports[0][-1]
    for scores in (last["gpu_relative"], last["gpu_individual"], last["rank_to_node"]):
        assert set(scores) == {"0", "1"}
    # No CUDA kernels on CPU: GPU scores are NaN (never stragglers), not missing.
    assert all(math.isnan(v) for v in last["gpu_relative"].values())
    assert last["stragglers"]["gpus_relative"] == []
    relative = last["section_relative"][section]
    assert relative["1"] < 0.7 < relative["0"], relative
    assert last["stragglers"]["sections_relative"] == {section: [1]}


#: State NVRx wrote in an earlier job (values above the floor and below the configured
#: 60 s, which they would otherwise be raised or capped to).
NVRX_HEARTBEAT_STATE = {
    "current_timeouts": {
        "heartbeat": {"initial": 50.0, "subsequent": 40.0, "were_calculated": True}
    }
}


@pytest.mark.timeout(240)
def test_nemo2_fault_tolerance_callback(
    launch: Launch, out_dir: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NeMo 2's FaultTolerancePlugin callback with autoresume, a simulated rank kill from a
    DictConfig, and NVRx's ``_ft_state.json`` from an earlier job."""
    finished = tmp_path / "finished.flag"
    monkeypatch.setenv("FAULT_TOL_FINISHED_FLAG_FILE", str(finished))
    state_file = out_dir / "ft_state" / "_ft_state.json"
    state_file.parent.mkdir()
    state_file.write_text(json.dumps(NVRX_HEARTBEAT_STATE))
    run = launch(
        ["--style", "nemo2", "--max-steps", "12", "--step-time", "0.4", "--fault-delay", "3"],
        ["--ft-param-initial_rank_heartbeat_timeout=60", "--ft-param-rank_heartbeat_timeout=60"],
        script=LIGHTNING,
    )
    run.expect_exit(0, timeout=220)
    reasons = restart_reasons(run.cycles())
    assert len(reasons) == 1, reasons
    assert matches(rf"{RANK1} was killed by signal SIGKILL", reasons[0]), reasons[0]
    journal = run.journal()
    first = [e for e in journal if e["event"] == "resume" and e["attempt"] == 0]
    # Rank 1 may be killed before its train start under load; rank 0 always starts.
    assert 0 in {e["rank"] for e in first}, first
    for resume in first:
        assert resume["hb_timeouts"] == {"initial": 50.0, "subsequent": 40.0}, resume
    done = [e for e in journal if e["event"] == "done"]
    assert {(e["attempt"], e["step"]) for e in done} == {(1, 12)}
    assert finished.exists(), "autoresume: the finished flag file marks a completed run"
    state = json.loads(state_file.read_text())
    assert state["current_timeouts"]["heartbeat"]["were_calculated"] is True
    default_logger = inspect.signature(FaultToleranceCallback).parameters["logger_name"].default
    assert f"[{default_logger}]" in run.log()


#: The same for the sections callback (NVRx's file name ends in an underscore).
NVRX_SECTIONS_STATE = {
    "current_timeouts": {
        "section": {
            "section": {"setup": 40.0, "step": 35.0, "checkpointing": 35.0},
            "out_of_section": 45.0,
            "calculated_sections": ["checkpointing", "setup", "step"],
            "is_out_of_section_calculated": True,
        }
    }
}


@pytest.mark.timeout(180)
def test_nemo_sections_callback_and_straggler_recipe(launch: Launch, out_dir: pathlib.Path) -> None:
    """FaultToleranceSectionsCallback loading NVRx's ``_ft_state_.json`` under NVRx's own
    functional-test flags (and NeMo's logger name), next to NeMo's StragglerDetectionCallback
    recipe call."""
    state_file = out_dir / "ft_state" / "_ft_state_.json"
    state_file.parent.mkdir()
    state_file.write_text(json.dumps(NVRX_SECTIONS_STATE))
    run = launch(
        ["--style", "sections-straggler", "--max-steps", "40", "--step-time", "0.1"],
        [
            "--ft-param-rank_section_timeouts=setup:60,step:60,checkpointing:60",
            "--ft-param-rank_out_of_section_timeout=60",
        ],
        script=LIGHTNING,
    )
    run.expect_exit(0, timeout=160)
    assert restart_reasons(run.cycles()) == []
    journal = run.journal()
    for resume in (e for e in journal if e["event"] == "resume"):
        assert resume["section_timeouts"] == {
            "section": {"setup": 40.0, "step": 35.0, "checkpointing": 35.0},
            "out_of_section": 45.0,
        }, resume
    log = run.log()
    assert "[nemo_logger.FaultToleranceSectionsCallback]" in log
    # What NeMo's own tests look for in the log.
    assert "Straggler report processing time" in log
    assert "GPU relative performance" in log
    done = [e for e in journal if e["event"] == "done" and e["rank"] == 0]
    assert len(done) == 1
    assert done[0]["step"] == 40
    # enable_ptl_logging: the scores reach trainer.callback_metrics, as log_dict does (on
    # CPU only section scores exist: no kernels, so no GPU score).
    metrics = set(done[0]["metrics"])
    assert "section_relative_perf/DDPStrategy.training_step/min" in metrics, metrics


@pytest.mark.timeout(60)
def test_monitor_started_without_ft_launcher(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NVRx's ``RankMonitorServer.run_in_subprocess(cfg, ipc_socket_path,
    is_restarter_logger=False, mp_ctx=None)``, for people who run monitors themselves: it
    returns once the monitor listens, a rank connects through NVRx's variable name, a
    section without a timeout is unmonitored and logged once, and the handle stops the
    monitor like a ``multiprocessing.Process``. A socket in /tmp itself is refused."""
    from nvrx.ft import FaultToleranceConfig, RankMonitorClient, RankMonitorServer
    from nvrx.ft.data import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR

    cfg = FaultToleranceConfig(rank_section_timeouts={"step": 30.0}, rank_heartbeat_timeout=30.0)
    with pytest.raises(PermissionError, match="mkdir -m 700"):
        RankMonitorServer.run_in_subprocess(cfg, "/tmp/_ft_rmon0.socket")
    too_long = tmp_path / ("d" * 120)
    too_long.mkdir(mode=0o700)
    with pytest.raises(ValueError, match="at most 107"):
        RankMonitorServer.run_in_subprocess(cfg, str(too_long / "rmon0.socket"))
    # tmp_path can itself be too long for a socket (CI checkouts): a short private dir.
    private = pathlib.Path(tempfile.mkdtemp(prefix="nvrx-rmon-", dir="/tmp"))
    socket_path = private / "rmon0.socket"
    proc = RankMonitorServer.run_in_subprocess(
        cfg, str(socket_path), is_restarter_logger=False, mp_ctx=None
    )
    try:
        assert proc.is_alive()
        assert proc.exitcode is None
        monkeypatch.setenv(FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR, str(socket_path))
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("LOCAL_RANK", "0")
        client = RankMonitorClient()
        client.init_workload_monitoring()
        client.send_heartbeat()
        client.start_section("step")
        client.end_section("step")
        with caplog.at_level("WARNING"):
            for _ in range(3):
                client.start_section("data_loading")
                client.end_section("data_loading")
        named = [r for r in caplog.records if "data_loading" in r.getMessage()]
        assert len(named) == 1, [r.getMessage() for r in named]
        client.shutdown_workload_monitoring()
    finally:
        proc.terminate()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
        shutil.rmtree(private, ignore_errors=True)
    assert not proc.is_alive()
    assert proc.exitcode is not None
