"""GPU memory reclaim: the poll loop over synthetic readings; NVML on a GPU machine."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nvrx.launcher._gpu_memory import (
    GpuProcess,
    MemoryReading,
    nvml_reader,
    wait_for_reclaim,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _readings(
    *used: dict[int, float], procs: tuple[GpuProcess, ...] = ()
) -> Callable[[], MemoryReading]:
    left = list(used)

    def read() -> MemoryReading:
        return MemoryReading(left.pop(0) if len(left) > 1 else left[0], procs)

    return read


def test_memory_already_back_costs_one_read_and_no_sleep() -> None:
    clock = _Clock()
    result = wait_for_reclaim(
        _readings({0: 600.0, 1: 500.0}),
        {0: 500.0, 1: 500.0},
        timeout=50,
        tolerance_mb=512,
        poll_interval=2,
        clock=clock.time,
        sleep=clock.sleep,
    )
    assert result.reclaimed
    assert result.waited_s == 0.0
    assert clock.sleeps == []


def test_waits_until_every_gpu_is_within_tolerance() -> None:
    clock = _Clock()
    read = _readings({0: 70000.0, 1: 500.0}, {0: 30000.0, 1: 500.0}, {0: 900.0, 1: 600.0})
    result = wait_for_reclaim(
        read,
        {0: 500.0, 1: 500.0},
        timeout=50,
        tolerance_mb=512,
        poll_interval=2,
        clock=clock.time,
        sleep=clock.sleep,
    )
    assert result.reclaimed
    assert result.waited_s == 4.0
    assert clock.sleeps == [2, 2]
    assert result.leftover == ()


def test_timeout_names_the_processes_still_holding_memory() -> None:
    clock = _Clock()
    holder = GpuProcess(pid=4242, name="python3", gpu=0, used_mb=40000.0)
    result = wait_for_reclaim(
        _readings({0: 40500.0}, procs=(holder,)),
        {0: 500.0},
        timeout=5,
        tolerance_mb=512,
        poll_interval=2,
        clock=clock.time,
        sleep=clock.sleep,
    )
    assert not result.reclaimed
    assert clock.sleeps == [2, 2, 1]  # never past the deadline
    assert result.waited_s == 5.0
    assert result.leftover == (holder,)
    text = result.describe()
    assert "not reclaimed after 5.0 s" in text
    assert "python3 (pid 4242, GPU 0, 40000 MB)" in text


def test_tolerance_counts_as_reclaimed_and_zero_timeout_reads_once() -> None:
    clock = _Clock()
    result = wait_for_reclaim(
        _readings({0: 1012.0}),
        {0: 500.0},
        timeout=0,
        tolerance_mb=512,
        poll_interval=2,
        clock=clock.time,
        sleep=clock.sleep,
    )
    assert result.reclaimed
    result = wait_for_reclaim(
        _readings({0: 1013.0}),
        {0: 500.0},
        timeout=0,
        tolerance_mb=512,
        poll_interval=2,
        clock=clock.time,
        sleep=clock.sleep,
    )
    assert not result.reclaimed
    assert clock.sleeps == []


def test_without_nvml_the_reader_is_none_with_the_reason() -> None:
    read, why = nvml_reader()
    if read is not None:
        pytest.skip("NVML is available here (the gpu test covers it)")
    assert why


@pytest.mark.gpu
def test_nvml_reader_sees_memory_a_process_holds_and_its_release() -> None:
    import subprocess
    import sys

    read, why = nvml_reader()
    assert read is not None, why
    baseline = dict(read().used_mb)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import torch, sys, time; x = torch.empty(2**30, dtype=torch.uint8, device='cuda:0');"
            " torch.cuda.synchronize(); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"held"
        held = wait_for_reclaim(read, baseline, timeout=1, tolerance_mb=512, poll_interval=0.5)
        assert not held.reclaimed
        assert any(p.pid == holder.pid for p in held.leftover), held.describe()
    finally:
        holder.kill()
        holder.wait(30)
    back = wait_for_reclaim(read, baseline, timeout=30, tolerance_mb=512, poll_interval=0.5)
    assert back.reclaimed, back.describe()
