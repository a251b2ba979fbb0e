"""SimulatedFaultParams parsing and the fault injector, with real signals and real processes."""

from __future__ import annotations

import random
import signal
import textwrap
import time

import pytest
from omegaconf import OmegaConf

from nvrx.ptl import SimulatedFaultParams
from nvrx.ptl.simulated_fault import parse_simulated_fault_params, plan_simulated_fault

from .conftest import Procs, free_port


def test_params_from_instance_dict_and_dictconfig() -> None:
    inst = SimulatedFaultParams(fault_type="rank_hung", base_delay=2, rand_delay=1, rank_to_fail=1)
    assert parse_simulated_fault_params(inst) is inst
    as_dict = {"fault_type": "rank_hung", "base_delay": 2, "rand_delay": 1, "rank_to_fail": 1}
    assert parse_simulated_fault_params(as_dict) == inst
    assert parse_simulated_fault_params(OmegaConf.create(as_dict)) == inst
    assert parse_simulated_fault_params(None) is None
    assert isinstance(inst.base_delay, float)


def test_defaults() -> None:
    params = SimulatedFaultParams(fault_type="random", base_delay=1.5)
    assert params.rand_delay == 0.0
    assert params.rank_to_fail is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"fault_type": "rank_exploded", "base_delay": 1}, "fault_type"),
        ({"fault_type": "rank_killed", "base_delay": -1}, "base_delay"),
        ({"fault_type": "rank_killed", "base_delay": "soon"}, "base_delay"),
        ({"fault_type": "rank_killed", "base_delay": float("nan")}, "base_delay"),
        ({"fault_type": "rank_killed", "base_delay": 1, "rand_delay": -0.5}, "rand_delay"),
        ({"fault_type": "rank_killed", "base_delay": 1, "rank_to_fail": -1}, "rank_to_fail"),
        ({"fault_type": "rank_killed", "base_delay": 1, "rank_to_fail": 1.5}, "rank_to_fail"),
        ({"fault_type": "rank_killed", "base_delay": 1, "rank": 0}, "rank"),
        ({"base_delay": 1}, "fault_type"),
        ({"fault_type": "rank_killed"}, "base_delay"),
    ],
)
def test_bad_spec_names_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_simulated_fault_params(spec)
    with pytest.raises(ValueError, match=field):
        parse_simulated_fault_params(OmegaConf.create(spec))


def test_bad_type_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="simulated_fault_params"):
        parse_simulated_fault_params("rank_killed")


def test_plan_without_distributed() -> None:
    params = SimulatedFaultParams(fault_type="random", base_delay=1.0, rand_delay=2.0)
    seen_types = set()
    seen_ranks = set()
    for seed in range(40):
        plan = plan_simulated_fault(params, world_size=4, rng=random.Random(seed))
        assert 1.0 <= plan.delay <= 3.0
        seen_types.add(plan.fault_type)
        seen_ranks.add(plan.rank_to_fail)
    assert seen_types == {"rank_killed", "rank_hung"}
    assert seen_ranks == {0, 1, 2, 3}

    fixed = SimulatedFaultParams(fault_type="rank_hung", base_delay=0.5, rank_to_fail=3)
    plan = plan_simulated_fault(fixed, world_size=4)
    assert (plan.rank_to_fail, plan.fault_type, plan.delay) == (3, "rank_hung", 0.5)
    assert plan.signal == signal.SIGSTOP


def test_rank_to_fail_outside_the_job() -> None:
    params = SimulatedFaultParams(fault_type="rank_killed", base_delay=1, rank_to_fail=2)
    with pytest.raises(ValueError, match="rank_to_fail=2"):
        plan_simulated_fault(params, world_size=2)


_AGREE = textwrap.dedent(
    """
    import os, random, sys
    import torch.distributed as dist
    from nvrx.ptl.simulated_fault import SimulatedFaultParams, plan_simulated_fault
    dist.init_process_group("gloo", rank=int(sys.argv[1]), world_size=2)
    params = SimulatedFaultParams(fault_type="rank_killed", base_delay=0)
    # each rank has its own random stream: only rank 0's choice may win
    plans = [plan_simulated_fault(params, 2, rng=random.Random(1000 * int(sys.argv[1]) + i))
             for i in range(16)]
    print("TARGETS", [p.rank_to_fail for p in plans], flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_random_rank_is_agreed_across_ranks_on_gloo(procs: Procs) -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    ranks = [procs.python(["-c", _AGREE, str(r)], env=env) for r in range(2)]
    outputs = [p.communicate(timeout=80)[0] for p in ranks]
    targets = []
    for proc, out in zip(ranks, outputs, strict=True):
        assert proc.returncode == 0, out
        targets.append(next(line for line in out.splitlines() if line.startswith("TARGETS")))
    assert targets[0] == targets[1], targets
    expected = [random.Random(i).randrange(2) for i in range(16)]
    assert targets[0] == f"TARGETS {expected}"


_INJECT = textwrap.dedent(
    """
    import logging, sys, time
    from nvrx.ptl.simulated_fault import FaultPlan, SimulatedFault
    fault = SimulatedFault(FaultPlan(0, sys.argv[1], float(sys.argv[2])), 0,
                           logging.getLogger("test.fault"))
    fault.start()
    print("ARMED", flush=True)
    if sys.argv[3] == "cancel":
        fault.cancel()
    time.sleep(float(sys.argv[4]))
    print("SURVIVED", flush=True)
    """
)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.timeout(60)
def test_rank_hung_fault_stops_the_process(procs: Procs) -> None:
    proc = procs.python(["-c", _INJECT, "rank_hung", "0.3", "keep", "2"])
    deadline = time.monotonic() + 40
    while _state(proc.pid) != "T":
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the process was never stopped"
        time.sleep(0.05)
    time.sleep(2.5)
    assert _state(proc.pid) == "T", "a hung rank must stay stopped"
    proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "SURVIVED" in out


@pytest.mark.timeout(60)
def test_cancelled_fault_never_fires(procs: Procs) -> None:
    proc = procs.python(["-c", _INJECT, "rank_killed", "0.5", "cancel", "1.5"])
    out, _ = proc.communicate(timeout=50)
    assert proc.returncode == 0, out
    assert "SURVIVED" in out


@pytest.mark.timeout(60)
def test_killed_session_leader_takes_its_children_along(procs: Procs) -> None:
    """A session leader (as under ft_launcher) takes its child processes down with it."""
    script = textwrap.dedent(
        """
        import logging, subprocess, sys, time
        from nvrx.ptl.simulated_fault import FaultPlan, SimulatedFault
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("CHILD", child.pid, flush=True)
        SimulatedFault(FaultPlan(0, "rank_killed", 0.5), 0, logging.getLogger("t")).start()
        time.sleep(30)
        """
    )
    proc = procs.python(["-c", script])
    out, _ = proc.communicate(timeout=50)
    assert proc.returncode == -signal.SIGKILL, out
    assert "Simulating fault rank_killed on rank 0" in out
    child_pid = int(next(line for line in out.splitlines() if line.startswith("CHILD")).split()[1])
    deadline = time.monotonic() + 10
    while True:
        try:
            state = _state(child_pid)
        except FileNotFoundError:
            break
        if state == "Z":
            break
        assert time.monotonic() < deadline, "the child survived the group kill"
        time.sleep(0.05)
