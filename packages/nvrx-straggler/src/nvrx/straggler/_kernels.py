"""GPU kernel timing behind one interface, so CPU tests feed records through the real code.

A :class:`KernelTimer` is switched on while a profiled section runs (``start``/``stop``
are reference counted, so nested sections are fine) and hands back the window's
durations with :meth:`KernelTimer.collect`. Every implementation pushes its records
through :class:`KernelAggregator`, which keys kernels by name and launch shape (as the
reference does) and keeps a bounded sample buffer per key. :class:`SyntheticKernelTimer`
takes records from the caller; :mod:`nvrx.straggler._cupti_timer` takes them from CUPTI.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from nvrx.straggler.statistics import Statistic, summarize

__all__ = [
    "DEFAULT_MAX_SAMPLES_PER_KERNEL",
    "KernelAggregator",
    "KernelRecord",
    "KernelTimer",
    "KernelTimingStatus",
    "KernelWindow",
    "NullKernelTimer",
    "SyntheticKernelRecord",
    "SyntheticKernelTimer",
    "kernel_key",
]

DEFAULT_MAX_SAMPLES_PER_KERNEL = 8 * 1024
"""Samples kept per kernel key and window; older ones are evicted but still counted."""


@runtime_checkable
class KernelRecord(Protocol):
    """The fields of a CUPTI CONCURRENT_KERNEL activity record that timing uses."""

    @property
    def name(self) -> str: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def grid_x(self) -> int: ...

    @property
    def grid_y(self) -> int: ...

    @property
    def grid_z(self) -> int: ...

    @property
    def block_x(self) -> int: ...

    @property
    def block_y(self) -> int: ...

    @property
    def block_z(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class SyntheticKernelRecord:
    """A kernel record made by hand, shaped like cupti-python's activity objects (ns)."""

    name: str
    start: int
    end: int
    grid_x: int = 1
    grid_y: int = 1
    grid_z: int = 1
    block_x: int = 1
    block_y: int = 1
    block_z: int = 1


def kernel_key(record: KernelRecord) -> str:
    """The grouping key of a kernel: its name and launch shape, as the reference builds it."""
    return (
        f"{record.name}_blk_{record.block_x}_{record.block_y}_{record.block_z}"
        f"_grid_{record.grid_x}_{record.grid_y}_{record.grid_z}"
    )


@dataclasses.dataclass(frozen=True)
class KernelTimingStatus:
    """Whether kernel timing works on this rank, why not, and what it lost.

    ``dropped_records`` counts records CUPTI reported as dropped plus records with
    no timestamps, since the last report.
    """

    backend: str
    available: bool
    reason: str | None = None
    dropped_records: int = 0


@dataclasses.dataclass(frozen=True)
class KernelWindow:
    """Kernel durations of one report window, in microseconds, by kernel key."""

    durations_us: dict[str, list[float]]
    counts: dict[str, int]
    status: KernelTimingStatus

    def summaries(self) -> dict[str, dict[Statistic, float]]:
        """Statistics per kernel key by the package's one definition (microseconds)."""
        return {
            key: summarize(values, self.counts[key])
            for key, values in self.durations_us.items()
            if values
        }


class KernelAggregator:
    """Collects kernel durations per key; safe to feed from a CUPTI worker thread."""

    def __init__(self, max_samples_per_kernel: int = DEFAULT_MAX_SAMPLES_PER_KERNEL) -> None:
        if max_samples_per_kernel < 1:
            raise ValueError(f"max_samples_per_kernel must be >= 1, got {max_samples_per_kernel!r}")
        self._cap = max_samples_per_kernel
        self._lock = threading.Lock()
        self._samples: dict[str, deque[float]] = {}
        self._counts: dict[str, int] = {}
        self._keys: dict[tuple[str, int, int, int, int, int, int], str] = {}
        self._zero_timestamps = 0

    def add(self, records: Iterable[KernelRecord]) -> int:
        """Add kernel records; returns how many were skipped for missing timestamps."""
        skipped = 0
        keys = self._keys
        with self._lock:
            for rec in records:
                start, end = rec.start, rec.end
                if not start or not end or end < start:
                    skipped += 1
                    continue
                shape = (
                    rec.name,
                    rec.block_x,
                    rec.block_y,
                    rec.block_z,
                    rec.grid_x,
                    rec.grid_y,
                    rec.grid_z,
                )
                key = keys.get(shape)
                if key is None:
                    key = keys[shape] = kernel_key(rec)
                buf = self._samples.get(key)
                if buf is None:
                    buf = self._samples[key] = deque(maxlen=self._cap)
                    self._counts[key] = 0
                buf.append((end - start) / 1000.0)
                self._counts[key] += 1
            self._zero_timestamps += skipped
        return skipped

    def take(self) -> tuple[dict[str, list[float]], dict[str, int], int]:
        """Hand over and clear the window: durations, counts and skipped-record count."""
        with self._lock:
            durations = {k: list(v) for k, v in self._samples.items()}
            counts = dict(self._counts)
            skipped = self._zero_timestamps
            self._samples.clear()
            self._counts.clear()
            self._zero_timestamps = 0
            if len(self._keys) > 16 * 1024:
                self._keys.clear()
        return durations, counts, skipped


@runtime_checkable
class KernelTimer(Protocol):
    """What the detector needs from a kernel timing backend."""

    @property
    def status(self) -> KernelTimingStatus:
        """Current availability, as of now (dropped count since the last collect)."""
        ...

    def start(self) -> None:
        """A profiled section begins: capture kernels (reference counted)."""
        ...

    def stop(self) -> None:
        """A profiled section ends: stop capturing when the outermost one ends."""
        ...

    def collect(self) -> KernelWindow:
        """Return the window's kernel durations and clear them."""
        ...

    def close(self) -> None:
        """Release the backend; idempotent."""
        ...


class NullKernelTimer:
    """No kernel timing (no GPU, no cupti-python, or another CUPTI user): says why."""

    def __init__(self, reason: str, backend: str = "none") -> None:
        self._status = KernelTimingStatus(backend=backend, available=False, reason=reason)

    @property
    def status(self) -> KernelTimingStatus:
        """Always unavailable, with the reason given at construction."""
        return self._status

    def start(self) -> None:
        """Nothing to capture."""

    def stop(self) -> None:
        """Nothing to capture."""

    def collect(self) -> KernelWindow:
        """An empty window carrying the reason."""
        return KernelWindow(durations_us={}, counts={}, status=self._status)

    def close(self) -> None:
        """Nothing to release."""


class SyntheticKernelTimer:
    """A kernel timer fed by the caller: tests and simulations use the real aggregation.

    Records given to :meth:`feed` count only while a section is active (between
    ``start`` and ``stop``), like CUPTI activity with the kind enabled, unless
    ``always=True``.
    """

    def __init__(self, max_samples_per_kernel: int = DEFAULT_MAX_SAMPLES_PER_KERNEL) -> None:
        self._agg = KernelAggregator(max_samples_per_kernel)
        self._active = 0
        self._dropped = 0
        self.start_calls = 0

    @property
    def status(self) -> KernelTimingStatus:
        """Available; dropped counts records fed while inactive or without timestamps."""
        return KernelTimingStatus(
            backend="synthetic", available=True, dropped_records=self._dropped
        )

    @property
    def active(self) -> bool:
        """True while a profiled section runs."""
        return self._active > 0

    def start(self) -> None:
        """Begin capturing (reference counted)."""
        self._active += 1
        self.start_calls += 1

    def stop(self) -> None:
        """End capturing when the outermost section ends."""
        if self._active == 0:
            raise RuntimeError("SyntheticKernelTimer.stop() without a matching start()")
        self._active -= 1

    def feed(self, records: Iterable[KernelRecord], *, always: bool = False) -> None:
        """Deliver records as a completed CUPTI buffer would."""
        recs = list(records)
        if not (always or self._active):
            return
        self._agg.add(recs)

    def add_dropped(self, count: int) -> None:
        """Simulate records the backend reports as dropped."""
        self._dropped += count

    def collect(self) -> KernelWindow:
        """The window's durations; clears them and the dropped count."""
        durations, counts, skipped = self._agg.take()
        status = dataclasses.replace(self.status, dropped_records=self._dropped + skipped)
        self._dropped = 0
        return KernelWindow(durations_us=durations, counts=counts, status=status)

    def close(self) -> None:
        """Nothing to release."""
        self._active = 0
