"""Wait for the GPU memory of stopped ranks to come back before starting new ones.

A rank that has exited can still hold GPU memory for a while (the driver tears its
context down asynchronously; a child the rank started may still hold it). New ranks
started meanwhile fail with out-of-memory, which costs a whole restart. So before
each restart the launcher polls every GPU's used memory until it is back to what it
was before the first start (plus a tolerance), for at most a timeout, and names the
processes still holding memory when it gives up (NVRx's
``--ft-gpu-memory-reclaim-timeout``, ``--ft-gpu-memory-tolerance-mb``,
``--ft-gpu-memory-poll-interval``, ``--ft-check-remaining-processes``).

:func:`wait_for_reclaim` is the loop, over any reader of :class:`MemoryReading`, so it
is tested without a GPU; :func:`nvml_reader` reads NVML, and is None without it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__: list[str] = []

_MB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU."""

    pid: int
    name: str
    gpu: int
    used_mb: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class MemoryReading:
    """Used memory per GPU index, and the processes holding it."""

    used_mb: Mapping[int, float]
    processes: tuple[GpuProcess, ...] = ()


@dataclasses.dataclass(frozen=True)
class ReclaimResult:
    """How the wait ended: back within tolerance, or timed out with what was left."""

    reclaimed: bool
    waited_s: float
    used_mb: dict[int, float]
    baseline_mb: dict[int, float]
    leftover: tuple[GpuProcess, ...]

    def describe(self) -> str:
        over = {
            gpu: round(used - self.baseline_mb.get(gpu, 0.0))
            for gpu, used in sorted(self.used_mb.items())
        }
        text = (
            f"GPU memory {'reclaimed' if self.reclaimed else 'not reclaimed'} after "
            f"{self.waited_s:.1f} s (MB above the baseline per GPU: {over})"
        )
        if self.leftover:
            text += "; still held by " + ", ".join(
                f"{p.name} (pid {p.pid}, GPU {p.gpu}, {p.used_mb:.0f} MB)" for p in self.leftover
            )
        return text


def _within(reading: MemoryReading, baseline: Mapping[int, float], tolerance_mb: float) -> bool:
    return all(
        used <= baseline.get(gpu, 0.0) + tolerance_mb for gpu, used in reading.used_mb.items()
    )


def wait_for_reclaim(
    read: Callable[[], MemoryReading],
    baseline: Mapping[int, float],
    *,
    timeout: float,
    tolerance_mb: float,
    poll_interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReclaimResult:
    """Poll ``read`` until every GPU is within ``tolerance_mb`` of ``baseline`` or time is up.

    Reads once at once (the usual case: memory is back already), then every
    ``poll_interval`` s, never sleeping past the deadline.
    """
    start = clock()
    deadline = start + timeout
    while True:
        reading = read()
        now = clock()
        done = _within(reading, baseline, tolerance_mb)
        if done or now >= deadline:
            leftover = () if done else reading.processes
            return ReclaimResult(
                done, now - start, dict(reading.used_mb), dict(baseline), tuple(leftover)
            )
        sleep(max(0.0, min(poll_interval, deadline - now)))


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as stream:
            return stream.read().strip() or "?"
    except OSError:
        return "?"


def nvml_reader() -> tuple[Callable[[], MemoryReading] | None, str]:
    """A reader of every GPU's used memory through NVML, or (None, why not)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:
        return None, f"NVML is not available ({exc or type(exc).__name__})"
    if count == 0:
        pynvml.nvmlShutdown()
        return None, "NVML sees no GPU"
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def read() -> MemoryReading:
        used: dict[int, float] = {}
        processes: list[GpuProcess] = []
        for index, handle in enumerate(handles):
            used[index] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / _MB
            try:
                running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:
                running = []
            for proc in running:
                held = proc.usedGpuMemory
                processes.append(
                    GpuProcess(
                        pid=int(proc.pid),
                        name=_process_name(int(proc.pid)),
                        gpu=index,
                        used_mb=float(held) / _MB if isinstance(held, int) else 0.0,
                    )
                )
        return MemoryReading(used, tuple(processes))

    return read, ""
