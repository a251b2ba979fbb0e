"""Wait for the GPU memory of stopped ranks to come back before starting new ones.

A rank that has exited can still hold GPU memory for a while (the driver tears its
context down asynchronously; a child the rank started may still hold it). New ranks
started meanwhile fail with out-of-memory, which costs a whole restart. So before
each restart the launcher polls every GPU's used memory until it is back to what it
was before the first start (plus a tolerance), for at most a timeout, and names the
processes still holding memory when it gives up (NVRx's
``--ft-gpu-memory-reclaim-timeout``, ``--ft-gpu-memory-tolerance-mb``,
``--ft-gpu-memory-poll-interval``, ``--ft-check-remaining-processes``).

Only this launcher's GPUs count (``CUDA_VISIBLE_DEVICES``, as indexes or GPU UUIDs):
a neighbour job's memory on the machine's other GPUs must not hold our restart up.

:func:`wait_for_reclaim` is the loop, over any reader of :class:`MemoryReading`, so it
is tested without a GPU; :func:`nvml_reader` reads NVML, and is None without it;
:class:`GpuMemoryWatch` is what a restart cycle calls, and never raises (a lost GPU
makes NVML fail: logged once, the wait skipped).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._cluster import GpuMemorySettings

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

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
    name_leftover: bool = True,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReclaimResult:
    """Poll ``read`` until every GPU is within ``tolerance_mb`` of ``baseline`` or time is up.

    Reads once at once (the usual case: memory is back already), then every
    ``poll_interval`` s, never sleeping past the deadline. ``name_leftover`` false
    (--ft-check-remaining-processes off): the result names no process.
    """
    start = clock()
    deadline = start + timeout
    while True:
        reading = read()
        now = clock()
        done = _within(reading, baseline, tolerance_mb)
        if done or now >= deadline:
            leftover = () if done or not name_leftover else reading.processes
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


def visible_gpus(text: str | None, uuids: Sequence[str]) -> list[int]:
    """The machine's GPU indexes that ``CUDA_VISIBLE_DEVICES=text`` leaves visible.

    ``uuids`` are the machine's GPUs' UUIDs by index. Unset: every GPU. As CUDA
    reads it: comma-separated indexes or (unique prefixes of) ``GPU-`` UUIDs, in
    order, up to the first entry that names no GPU (so ``""`` and ``-1`` hide all);
    a ``MIG-`` entry also ends the list (its memory is not a whole GPU's).
    """
    if text is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for raw in text.split(","):
        entry = raw.strip()
        if entry.isdigit() and int(entry) < len(uuids):
            index = int(entry)
        elif entry.startswith("GPU-"):
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
        else:
            break
        if index in chosen:
            break  # CUDA refuses a repeated device
        chosen.append(index)
    return chosen


def nvml_reader(
    env: Mapping[str, str] = os.environ,
) -> tuple[Callable[[], MemoryReading] | None, str]:
    """A reader of this launcher's GPUs' used memory through NVML, or (None, why not).

    The GPUs are those ``CUDA_VISIBLE_DEVICES`` in ``env`` leaves visible. Never
    raises: any NVML error (no driver, a lost GPU) is the "why not".
    """
    try:
        import pynvml
    except Exception as exc:
        return None, f"NVML is not available ({exc or type(exc).__name__})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return None, f"NVML is not available ({exc or type(exc).__name__})"
    try:
        count = pynvml.nvmlDeviceGetCount()
        all_handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in all_handles]
    except Exception as exc:
        _shutdown(pynvml)
        return None, f"NVML cannot list the GPUs ({exc or type(exc).__name__})"
    indexes = visible_gpus(env.get("CUDA_VISIBLE_DEVICES"), uuids)
    if not indexes:
        _shutdown(pynvml)
        if count == 0:
            return None, "NVML sees no GPU"
        return None, (
            f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r} leaves none of "
            f"this machine's {count} GPU(s) visible"
        )
    handles = {index: all_handles[index] for index in indexes}

    def read() -> MemoryReading:
        used: dict[int, float] = {}
        processes: list[GpuProcess] = []
        for index, handle in handles.items():
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


def _text(value: str | bytes) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def _shutdown(pynvml: Any) -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception as exc:  # nothing left to do about it
        logger.debug("nvmlShutdown: %r", exc)


class GpuMemoryWatch:
    """The reclaim wait as a step of the restart cycle: baseline first, wait on restarts.

    Never raises. Without NVML (or with no visible GPU) it says so once and is off;
    a read that fails (a lost GPU) is logged once and that wait is skipped.
    """

    def __init__(
        self,
        settings: GpuMemorySettings,
        open_reader: Callable[[], tuple[Callable[[], MemoryReading] | None, str]] = nvml_reader,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self._open = open_reader
        self._read: Callable[[], MemoryReading] | None = None
        self._off = False
        self._read_failed = False
        self._baseline: dict[int, float] | None = None
        self._clock = clock
        self._sleep = sleep

    def before_start(self, *, restart: bool) -> ReclaimResult | None:
        """Baseline at the first start; on a restart the wait's result (None: no wait)."""
        read = self._reader()
        if read is None:
            return None
        try:
            if self._baseline is None or not restart:
                self._baseline = dict(read().used_mb)
                return None
            settings = self.settings
            return wait_for_reclaim(
                read,
                self._baseline,
                timeout=settings.timeout,
                tolerance_mb=settings.tolerance_mb,
                poll_interval=settings.poll_interval,
                name_leftover=settings.check_remaining_processes,
                clock=self._clock,
                sleep=self._sleep,
            )
        except Exception as exc:  # NVML trouble never stops a restart
            if not self._read_failed:
                self._read_failed = True
                logger.warning(
                    "GPU memory reclaim wait skipped: NVML read failed: %r "
                    "(later failures not logged)",
                    exc,
                )
            return None

    def _reader(self) -> Callable[[], MemoryReading] | None:
        if self._read is None and not self._off:
            try:
                read, why = self._open()
            except Exception as exc:  # an opener is not supposed to raise; still never stop
                read, why = None, repr(exc)
            if read is None:
                self._off = True
                logger.info("GPU memory reclaim wait skipped: %s", why)
            self._read = read
        return self._read
