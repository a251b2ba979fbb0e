"""The reclaim wait as a cycle step: only this launcher's GPUs, never a crash on NVML errors."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable

import pytest

from nvrx.launcher._cluster import GpuMemorySettings
from nvrx.launcher._gpu_memory import (
    GpuMemoryWatch,
    GpuProcess,
    MemoryReading,
    nvml_reader,
    visible_gpus,
    wait_for_reclaim,
)

UUIDS = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-abcd-3333", "GPU-cccc-4444"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, [0, 1, 2, 3]),
        ("2,3", [2, 3]),
        (" 1 ", [1]),
        ("GPU-bbbb-2222,GPU-cccc", [1, 3]),
        ("GPU-a", []),  # an ambiguous prefix names no GPU: CUDA stops there
        ("1,7,2", [1]),  # no GPU 7: the list ends there
        ("", []),
        ("-1", []),
        ("0,0", [0]),
        ("MIG-1234,0", []),
    ],
)
def test_cuda_visible_devices_as_cuda_reads_it(text: str | None, expected: list[int]) -> None:
    assert visible_gpus(text, UUIDS) == expected


class _FakeNvml(types.ModuleType):
    """pynvml's calls the reader makes, over four GPUs (this machine has none)."""

    class NVMLError(Exception):
        pass

    def __init__(self, *, lost: int | None = None) -> None:
        super().__init__("pynvml")
        self.lost = lost
        self.used = [100.0, 200.0, 300.0, 400.0]
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index == self.lost:
            raise self.NVMLError("GPU is lost")
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return UUIDS[handle]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(used=int(self.used[handle] * 1024 * 1024))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[types.SimpleNamespace]:
        return [types.SimpleNamespace(pid=1, usedGpuMemory=int(self.used[handle] * 1024 * 1024))]


def test_a_lost_gpu_at_open_is_a_reason_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml(lost=2)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    read, why = nvml_reader({})
    assert read is None
    assert "GPU is lost" in why
    assert fake.shutdowns == 1


def test_the_reader_covers_only_the_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    read, why = nvml_reader({"CUDA_VISIBLE_DEVICES": "GPU-cccc-4444,1"})
    assert read is not None, why
    reading = read()
    assert dict(reading.used_mb) == {3: 400.0, 1: 200.0}
    assert sorted(p.gpu for p in reading.processes) == [1, 3]
    read, why = nvml_reader({"CUDA_VISIBLE_DEVICES": ""})
    assert read is None
    assert "CUDA_VISIBLE_DEVICES" in why


def test_a_neighbour_jobs_growth_does_not_hold_the_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    slept: list[float] = []
    watch = GpuMemoryWatch(
        GpuMemorySettings(timeout=50, tolerance_mb=512, poll_interval=2),
        lambda: nvml_reader({"CUDA_VISIBLE_DEVICES": "0"}),
        sleep=slept.append,
    )
    assert watch.before_start(restart=False) is None
    fake.used[1] += 40000.0  # another job on GPU 1
    result = watch.before_start(restart=True)
    assert result is not None
    assert result.reclaimed
    assert slept == []


def _settings(check: bool) -> GpuMemorySettings:
    return GpuMemorySettings(
        timeout=0, tolerance_mb=512, poll_interval=2, check_remaining_processes=check
    )


def _holding() -> Callable[[], MemoryReading]:
    used = [{0: 100.0}, {0: 9000.0}]

    def read() -> MemoryReading:
        now = used.pop(0) if len(used) > 1 else used[0]
        return MemoryReading(now, (GpuProcess(7, "x", 0, 8900.0),))

    return read


@pytest.mark.parametrize("check", [False, True])
def test_leftover_is_named_only_with_check_remaining_processes(check: bool) -> None:
    watch = GpuMemoryWatch(_settings(check), lambda: (_holding(), ""), sleep=lambda s: None)
    watch.before_start(restart=False)
    result = watch.before_start(restart=True)
    assert result is not None
    assert not result.reclaimed
    assert [p.pid for p in result.leftover] == ([7] if check else [])
    plain = wait_for_reclaim(
        _holding(), {0: 100.0}, timeout=0, tolerance_mb=0, poll_interval=1, name_leftover=False
    )
    assert plain.leftover == ()


def test_a_failing_read_is_logged_once_and_skips_the_wait(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def read() -> MemoryReading:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return MemoryReading({0: 100.0})

    watch = GpuMemoryWatch(_settings(True), lambda: (read, ""), sleep=lambda s: None)
    with caplog.at_level(logging.INFO, logger="nvrx.launcher"):
        assert watch.before_start(restart=False) is None
        assert watch.before_start(restart=True) is None
        assert watch.before_start(restart=True) is None
    failed = [r for r in caplog.records if "NVML read failed" in r.getMessage()]
    assert len(failed) == 1


def test_an_opener_that_fails_turns_the_wait_off(caplog: pytest.LogCaptureFixture) -> None:
    opened = []

    def opener() -> tuple[Callable[[], MemoryReading] | None, str]:
        opened.append(1)
        raise RuntimeError("NVML_ERROR_UNKNOWN")

    watch = GpuMemoryWatch(_settings(True), opener)
    with caplog.at_level(logging.INFO, logger="nvrx.launcher"):
        assert watch.before_start(restart=False) is None
        assert watch.before_start(restart=True) is None
    assert opened == [1]
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.gpu
def test_nvml_reader_follows_cuda_visible_devices_by_uuid() -> None:
    import pynvml

    read, why = nvml_reader({})
    assert read is not None, why
    everything = set(read().used_mb)
    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    one, why = nvml_reader({"CUDA_VISIBLE_DEVICES": text})
    assert one is not None, why
    assert set(one().used_mb) == {0} <= everything
    none, why = nvml_reader({"CUDA_VISIBLE_DEVICES": ""})
    assert none is None
    assert "CUDA_VISIBLE_DEVICES" in why
