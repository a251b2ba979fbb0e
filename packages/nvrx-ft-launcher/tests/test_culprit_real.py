"""A real hang: 4 gloo ranks under their monitors, one hangs in user code, the rest wait.

Each rank runs under its own real monitor (nvrx.ft); the monitors' real
``rank_terminated`` events are the evidence find_culprit reads. It must name the hung
rank or stay undecided, never name a victim. benchmarks/bench_culprit.py repeats
:func:`run_hang` with a random hung rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from nvrx.ft import (
    MONITOR_SOCKET_ENV,
    FaultToleranceConfig,
    MonitorProcess,
    RankMonitorServer,
    create_runtime_dir,
)
from nvrx.ft._events import MAX_EVENT_BYTES, RankTerminated, parse_event
from nvrx.launcher._culprit import Basis, CulpritFinding, RankEvidence, find_culprit

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from _dstate import unavailable_reason, unserved_file  # type: ignore[import-not-found, unused-ignore]

WORLD = 4
HUNG_AT_STEP = 15
HEARTBEAT_TIMEOUT_S = 4.0
_DEADLINE_S = 90.0
_TRAIN = """\
import os, signal, sys, time
import torch
import torch.distributed as dist
from nvrx.ft import RankMonitorClient

hung, kind = int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "sleep"
rank = int(os.environ["RANK"])
client = RankMonitorClient()
client.init_workload_monitoring()
dist.init_process_group("gloo")
side = dist.new_group(list(range(dist.get_world_size())))
print("ready", flush=True)
for step in range(1_000_000):
    client.send_heartbeat()
    if rank == hung and step == {hung_at}:
        print("hanging", kind, flush=True)
        if kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen, waiting on no one
        elif kind == "desync":
            dist.broadcast(torch.ones(4), src=hung, group=side)  # not the others' all_reduce
        elif kind == "read":
            os.read(os.pipe()[0], 1)  # a read that never returns (interruptible: state S)
        elif kind == "dread":
            open(sys.argv[3], "rb").read()  # read(2) waits in the kernel in state D
        while True:
            time.sleep(0.5)  # the hang: user code, outside any collective
    dist.all_reduce(torch.ones(4))
    time.sleep(0.02)
"""
#: The line of ``time.sleep(0.5)`` in the training script.
HANG_LINE = 1 + next(i for i, text in enumerate(_TRAIN.splitlines()) if "time.sleep(0.5)" in text)


@dataclasses.dataclass(frozen=True)
class HangRun:
    """One run: the hung rank, the evidence the monitors sent, the finding."""

    hung_rank: int
    evidence: tuple[RankEvidence, ...]
    finding: CulpritFinding
    #: Seconds from the first hang event to the last rank's (when the finding can be made).
    decided_s: float = 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config() -> FaultToleranceConfig:
    return FaultToleranceConfig.from_kwargs(
        ignore_not_recognized=False,
        initial_rank_heartbeat_timeout=120.0,
        rank_heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
        rank_termination_grace_period=2.0,
        enable_gpu_monitor=False,
    )


def run_hang(
    hung_rank: int, workdir: pathlib.Path, kind: str = "sleep", *, flight_recorder: bool = True
) -> HangRun:
    """Start WORLD ranks under monitors, let ``hung_rank`` hang, collect every rank's evidence.

    ``kind``: ``sleep`` (user code, outside any collective), ``stop`` (SIGSTOP),
    ``desync`` (a broadcast on another group while the others all-reduce), ``read``
    (a blocking read of a pipe nobody writes) or ``dread`` (a read blocked in the kernel
    in state D, as on a dead NFS server: a file on a FUSE mount that never answers a READ, see
    :mod:`_dstate`; needs root). The mount is torn down after every rank is gone.
    ``flight_recorder=False`` turns torch's flight recorder off in the ranks
    (``TORCH_FR_BUFFER_SIZE=0``): the evidence is then the stacks, states and times.
    """
    env = {} if flight_recorder else {"TORCH_FR_BUFFER_SIZE": "0"}
    if kind != "dread":
        return _run_hang(hung_rank, workdir, kind, None, env)
    with unserved_file() as blocking:
        return _run_hang(hung_rank, workdir, kind, blocking, env)


def _run_hang(
    hung_rank: int,
    workdir: pathlib.Path,
    kind: str,
    blocking: pathlib.Path | None,
    extra_env: dict[str, str],
) -> HangRun:
    script = workdir / "train.py"
    script.write_text(_TRAIN.replace("{hung_at}", str(HUNG_AT_STEP)))
    runtime = create_runtime_dir()
    events = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    events.bind(str(runtime / "events.sock"))
    monitors: list[MonitorProcess] = []
    ranks: list[subprocess.Popen[bytes]] = []
    port = _free_port()
    try:
        for local in range(WORLD):
            with (workdir / f"monitor-{local}.log").open("wb") as log:
                monitors.append(
                    RankMonitorServer.start_in_subprocess(
                        _config(),
                        runtime / f"monitor-{local}.sock",
                        local_rank=local,
                        events_socket=runtime / "events.sock",
                        stderr=log.fileno(),
                    )
                )
        for m in monitors:
            m.wait_ready(timeout=_DEADLINE_S)
        for rank in range(WORLD):
            env = {
                **os.environ,
                MONITOR_SOCKET_ENV: str(runtime / f"monitor-{rank}.sock"),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(WORLD),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "GLOO_SOCKET_IFNAME": "lo",
                **extra_env,
            }
            with (workdir / f"rank-{rank}.log").open("wb") as log:
                ranks.append(
                    subprocess.Popen(
                        [sys.executable, str(script), str(hung_rank), kind, str(blocking)],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        evidence: dict[int, RankEvidence] = {}
        first = last = 0.0
        deadline = time.monotonic() + _DEADLINE_S
        events.settimeout(1.0)
        while time.monotonic() < deadline and len(evidence) < WORLD:
            if all(r.poll() is not None for r in ranks) and evidence:
                events.settimeout(0.5)  # every rank is gone: read what is left, then stop
                deadline = min(deadline, time.monotonic() + 2.0)
            try:
                data = events.recv(MAX_EVENT_BYTES)
            except TimeoutError:
                continue
            event = parse_event(data)
            found = RankEvidence.from_event(event) if isinstance(event, RankTerminated) else None
            if found is not None:
                evidence.setdefault(found.rank, found)
                last = time.monotonic()
                first = first or last
        ordered = tuple(evidence[r] for r in sorted(evidence))
        finding = find_culprit(ordered, world_size=WORLD)
        return HangRun(hung_rank, ordered, finding, time.monotonic() - (first or time.monotonic()))
    finally:
        for r in ranks:
            if r.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.pid, signal.SIGKILL)
            r.wait(timeout=10)
        for m in monitors:
            m.stop(timeout=5.0)
        events.close()
        for child in runtime.iterdir():
            child.unlink()
        runtime.rmdir()


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_hung_rank_is_named_and_victims_wait_in_all_reduce(tmp_path: pathlib.Path) -> None:
    run = run_hang(2, tmp_path)
    finding = run.finding
    logs = "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted(tmp_path.glob("*.log"))
    )
    assert finding.culprit in (2, None), logs  # never a victim
    by_rank = {ev.rank: ev for ev in run.evidence}
    assert set(by_rank) == set(range(WORLD)), logs
    hung = by_rank[2]
    assert hung.stack is not None, logs
    assert (hung.stack.collective, hung.stack.location) == (None, f"train.py:{HANG_LINE}")
    assert hung.last_heartbeat_s is not None
    assert hung.last_heartbeat_s >= HEARTBEAT_TIMEOUT_S
    victims_in_all_reduce = [
        ev.rank
        for ev in run.evidence
        if ev.stack is not None and ev.stack.collective == "all_reduce"
    ]
    if finding.culprit is None:  # only when a victim was not seen inside all_reduce
        assert victims_in_all_reduce != [0, 1, 3], finding
    else:
        assert victims_in_all_reduce == [0, 1, 3], logs
        assert finding.victims == (0, 1, 3)
        assert finding.sentence.startswith("rank 2: last heartbeat "), finding.sentence
        assert f"stack in train.py:{HANG_LINE}; ranks 0, 1, 3: blocked in all_reduce" in (
            finding.sentence
        )


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(unavailable_reason() is not None, reason=f"{unavailable_reason()}")
@pytest.mark.parametrize("flight_recorder", [True, False], ids=["flight-recorder", "stacks"])
def test_a_rank_blocked_in_a_d_state_read_is_named(
    tmp_path: pathlib.Path, flight_recorder: bool
) -> None:
    """A rank in a read the kernel never ends (state D, a dead NFS server's kind of hang)."""
    run = run_hang(1, tmp_path, "dread", flight_recorder=flight_recorder)
    logs = "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted(tmp_path.glob("*.log"))
    )
    by_rank = {ev.rank: ev for ev in run.evidence}
    assert set(by_rank) == set(range(WORLD)), logs
    hung = by_rank[1]
    assert hung.proc_state == "D", logs
    assert hung.stack is None, "a stack dump ran in state D"  # the dump signal waits
    finding = run.finding
    assert (finding.culprit, finding.victims) == (1, (0, 2, 3)), (finding, logs)
    assert finding.culprit_frame == "blocked in the kernel"
    assert finding.sentence.startswith("rank 1: blocked in the kernel (state D), "), finding
    if flight_recorder:
        assert hung.collective is not None, hung
        assert not hung.collective.pending, hung  # it finished all_reduce #15
        assert finding.collective == {"op": "all_reduce", "group": "default_pg", "seq": 16}
        assert finding.basis == (Basis.COLLECTIVE, Basis.BLOCKED)
    else:
        assert hung.collective is None, hung
        assert finding.collective == {"op": "all_reduce", "group": None, "seq": None}
        assert finding.basis == (Basis.BLOCKED,)
    # The monitor's termination signal (default SIGTERM: no handler, so fatal) ends the
    # killable wait: no SIGKILL was needed.
    monitor_log = (tmp_path / "monitor-1.log").read_text()
    assert "survived" not in monitor_log, monitor_log
    assert "has exited" in monitor_log, monitor_log
