"""Learned timeouts: how fast a first run detects a hang, and the hot path with learning on.

- ``first_run_detection``: NeMo's settings (300 s heartbeat timeout, 1800 s initial),
  ``learn_timeouts`` on, a rank that heartbeats after each 1 s step and then hangs on
  its first run (no saved state). The figure is the monitor's own measure: the time
  from the last heartbeat to the termination. Target 10 s; NVRx, and nvrx with
  ``learn_timeouts: false``, take 300 s. The loop has no checkpoint or validation, so
  the learned timeout is 5 x the longest step (about 5 s) once 16 steps have run.
- ``heartbeat_learning`` / ``section_pair_learning``: the hot path with learned
  timeouts active (compare ``heartbeat`` and ``section_pair`` of the ``ft_core`` area).

    .venv-dev/bin/python benchmarks/run.py --only learned
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
from typing import Any

from _common import Metric, median_ns_per_call

from nvrx.ft import (
    MONITOR_SOCKET_ENV,
    FaultToleranceConfig,
    RankMonitorClient,
    RankMonitorServer,
    create_runtime_dir,
)
from nvrx.ft._events import RankTerminated, parse_event

AREA = "learned"
STEP_S = 1.0
_FIRST_RUN_RANK = """
import sys, time
from nvrx.ft import RankMonitorClient
c = RankMonitorClient()
c.init_workload_monitoring()
steps = int(sys.argv[1])
for _ in range(steps):
    time.sleep(float(sys.argv[2]))
    c.send_heartbeat()
print(c.learned_timeouts_active, c.hb_timeouts.subsequent, flush=True)
time.sleep(600)  # the hang
"""


def _nemo_config(**extra: Any) -> FaultToleranceConfig:
    return FaultToleranceConfig.from_kwargs(
        initial_rank_heartbeat_timeout=1800.0,
        rank_heartbeat_timeout=300.0,
        learn_timeouts=True,
        rank_termination_signal="SIGKILL",
        stack_dump_signal=None,
        enable_gpu_monitor=False,
        log_level="WARNING",
        **extra,
    )


def _first_run_detection(runtime: pathlib.Path, quick: bool) -> Metric:
    cfg = _nemo_config()
    events = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    events.bind(str(runtime / "events.sock"))
    events.settimeout(120)
    sock = runtime / "monitor-learn.sock"
    proc = RankMonitorServer.run_in_subprocess(
        cfg, sock, events_socket=runtime / "events.sock", stderr=subprocess.DEVNULL
    )
    detections: list[float] = []
    learned: list[float] = []
    steps = cfg.learn_min_steps + 2
    try:
        env = {**os.environ, MONITOR_SOCKET_ENV: str(sock), "RANK": "0"}
        for _ in range(1 if quick else 3):
            rank = subprocess.Popen(
                [sys.executable, "-c", _FIRST_RUN_RANK, str(steps), str(STEP_S)],
                env=env,
                start_new_session=True,
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert rank.stdout is not None
                active, value = rank.stdout.readline().split()
                if active != "True":
                    raise RuntimeError(f"learned timeouts not active after {steps} steps")
                learned.append(float(value))
                while True:
                    received = parse_event(events.recv(65536))
                    if isinstance(received, RankTerminated) and received.pid == rank.pid:
                        event = received
                        break
                assert event.observed_s is not None
                detections.append(event.observed_s)
                rank.wait(timeout=30)
            finally:
                if rank.poll() is None:
                    rank.kill()
                    rank.wait()
    finally:
        proc.stop()
        events.close()
    return Metric(
        AREA,
        "first_run_detection",
        statistics.median(detections),
        "s",
        len(detections),
        target=10.0,
        detail={
            "step_s": STEP_S,
            "configured_timeout_s": 300.0,
            "learned_timeout_s": statistics.median(learned),
            "steps_before_hang": steps,
            "reference_nvrx_s": 300.0,
        },
    )


def _hot_path_learning(runtime: pathlib.Path, quick: bool) -> list[Metric]:
    cfg = _nemo_config(rank_section_timeouts={"step": 3600.0, "fwd": 3600.0}, learn_min_steps=1)
    sock = runtime / "monitor-hot.sock"
    proc = RankMonitorServer.run_in_subprocess(cfg, sock, stderr=subprocess.DEVNULL)
    old = os.environ.get(MONITOR_SOCKET_ENV)
    try:
        os.environ[MONITOR_SOCKET_ENV] = str(sock)
        client = RankMonitorClient()
        client.init_workload_monitoring()
        for _ in range(3):
            client.send_heartbeat()
            client.start_section("step")
            client.end_section("step")
        if not client.learned_timeouts_active:
            raise RuntimeError("learned timeouts not active")
        calls, samples = (200, 301) if quick else (200, 1001)
        heartbeat = median_ns_per_call(
            client.send_heartbeat, calls_per_sample=calls, samples=samples
        )
        start, end = client.start_section, client.end_section

        def pair() -> None:
            start("step")
            end("step")

        section_pair = median_ns_per_call(pair, calls_per_sample=calls, samples=samples)
        client.shutdown_workload_monitoring()
    finally:
        if old is None:
            os.environ.pop(MONITOR_SOCKET_ENV, None)
        else:
            os.environ[MONITOR_SOCKET_ENV] = old
        proc.stop()
    return [
        Metric(AREA, "heartbeat_learning", heartbeat / 1000, "us", samples, target=1.0),
        Metric(AREA, "section_pair_learning", section_pair / 1000, "us", samples, target=2.0),
    ]


def run(quick: bool) -> list[Metric]:
    """First-run detection with learned timeouts, and the hot path with learning active."""
    runtime = create_runtime_dir()
    try:
        return [*_hot_path_learning(runtime, quick), _first_run_detection(runtime, quick)]
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
