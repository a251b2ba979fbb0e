"""GPU kernel timing from CUPTI activity records through ``cupti-python``.

Importing this module never imports CUPTI or CUDA; :func:`make_kernel_timer` does,
and falls back to a :class:`~nvrx.straggler._kernels.NullKernelTimer` that says why
(no GPU, cupti-python missing, CUPTI held by another subscriber such as
torch.profiler or Nsight). Section timing carries on in every case.

CONCURRENT_KERNEL activity is enabled only while a profiled section runs (outermost
entry to outermost exit). Completed buffers are parsed by cupti-python; the callback
only hands the kernel records to the shared :class:`~nvrx.straggler._kernels.KernelAggregator`.
Dropped records reported by CUPTI and records without timestamps are counted and
reported with each window. The process-wide CUPTI state is never finalised, so other
CUPTI users keep working after shutdown.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import threading
from typing import Any

from nvrx.straggler._kernels import (
    DEFAULT_MAX_SAMPLES_PER_KERNEL,
    KernelAggregator,
    KernelTimer,
    KernelTimingStatus,
    KernelWindow,
    NullKernelTimer,
)

__all__ = ["BUFFER_SIZE", "CuptiInUse", "CuptiKernelTimer", "make_kernel_timer"]

log = logging.getLogger(__name__)

BUFFER_SIZE = 8 * 1024 * 1024
"""Bytes per activity buffer CUPTI asks for (cupti-python allocates them)."""

_registered_lock = threading.Lock()
_registered: CuptiKernelTimer | None = None


class CuptiInUse(RuntimeError):
    """CUPTI is held by another subscriber; kernel timing cannot start."""


def _other_subscriber(cupti: Any) -> str | None:
    """Ask CUPTI whether another tool subscribed (single-subscriber CUPTI refuses us)."""
    subscribe = getattr(cupti, "subscribe", None)
    unsubscribe = getattr(cupti, "unsubscribe", None)
    if subscribe is None or unsubscribe is None:
        return None
    try:
        handle = subscribe(lambda *args: None, 0)
    except Exception as e:
        if "MULTIPLE_SUBSCRIBERS" in str(e).upper():
            return f"another CUPTI subscriber (torch.profiler, Nsight) holds CUPTI ({e})"
        return None  # unknown binding shape: do not guess
    try:
        unsubscribe(handle)
    except Exception as e:
        log.debug("straggler detection: CUPTI unsubscribe after probe: %s", e)
    return None


class CuptiKernelTimer:
    """Kernel timing from CUPTI CONCURRENT_KERNEL records (one per process)."""

    def __init__(
        self, cupti_module: Any, max_samples_per_kernel: int = DEFAULT_MAX_SAMPLES_PER_KERNEL
    ) -> None:
        global _registered
        self._cupti = cupti_module
        self._kind = cupti_module.ActivityKind.CONCURRENT_KERNEL
        self._agg = KernelAggregator(max_samples_per_kernel)
        self._lock = threading.Lock()
        self._active = 0
        self._dropped = 0
        self._failed: str | None = None
        self._closed = False
        self._dropped_query_failed = False
        self._windows_enabled = 0
        with _registered_lock:
            if _registered is not None and not _registered._closed:
                raise CuptiInUse(
                    "another StragglerDetector in this process already times kernels with CUPTI"
                )
            other = _other_subscriber(cupti_module)
            if other is not None:
                raise CuptiInUse(other)
            cupti_module.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
            _registered = self

    @property
    def status(self) -> KernelTimingStatus:
        """Available unless CUPTI failed since; dropped records of this window."""
        return KernelTimingStatus(
            backend="cupti",
            available=self._failed is None and not self._closed,
            reason=self._failed,
            dropped_records=self._dropped,
        )

    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_SIZE, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        kind = int(self._kind)
        self._agg.add(a for a in activities if int(a.kind) == kind)

    def start(self) -> None:
        """Enable kernel activity at the outermost profiled section entry."""
        with self._lock:
            self._active += 1
            self._windows_enabled += 1
            if self._active == 1 and self._failed is None and not self._closed:
                try:
                    self._cupti.activity_enable(self._kind)
                except Exception as e:
                    self._fail(f"activity_enable failed: {e}")

    def stop(self) -> None:
        """Disable kernel activity when the outermost profiled section ends."""
        with self._lock:
            if self._active == 0:
                return
            self._active -= 1
            if self._active == 0 and self._failed is None and not self._closed:
                try:
                    self._cupti.activity_disable(self._kind)
                except Exception as e:
                    self._fail(f"activity_disable failed: {e}")

    def _fail(self, what: str) -> None:
        self._failed = (
            f"CUPTI {what}; another CUPTI subscriber (torch.profiler, Nsight) may hold CUPTI. "
            "GPU kernel scores are off; section timing continues"
        )
        log.warning("straggler detection: %s", self._failed)

    def _dropped_by_cupti(self) -> int:
        # cupti-python: (context, stream_id, address of the size_t it writes); context 0
        # is CUPTI's global queue, where records go unless per-context buffers are used.
        dropped = ctypes.c_size_t(0)
        try:
            self._cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(dropped))
            return int(dropped.value)
        except Exception as e:
            if not self._dropped_query_failed:  # the count is unknown: say so, once
                self._dropped_query_failed = True
                log.warning(
                    "straggler detection: cannot ask CUPTI for dropped records (%s); "
                    "dropped kernel records will not be counted",
                    e,
                )
            return 0

    def collect(self) -> KernelWindow:
        """Flush completed buffers (the caller synchronised the device) and take the window."""
        if self._failed is None and not self._closed:
            try:
                self._cupti.activity_flush_all(0)
            except Exception as e:
                self._fail(f"activity_flush_all failed: {e}")
        lost = self._dropped_by_cupti()
        if lost:
            log.warning("straggler detection: CUPTI dropped %d kernel records", lost)
        durations, counts, skipped = self._agg.take()
        status = self.status
        reason = status.reason
        if reason is None and self._windows_enabled and not durations:
            reason = (
                "CUPTI was enabled in profiled sections but delivered no kernel records; "
                "the sections launched no kernels, or another CUPTI user (torch.profiler, "
                "Nsight) took over the activity buffers"
            )
        status = KernelTimingStatus(
            backend=status.backend,
            available=status.available,
            reason=reason,
            dropped_records=self._dropped + lost + skipped,
        )
        self._dropped = 0
        self._windows_enabled = 0
        return KernelWindow(durations_us=durations, counts=counts, status=status)

    def close(self) -> None:
        """Stop capturing and flush; CUPTI is not finalised (other users may need it)."""
        global _registered
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._active:
                    self._cupti.activity_disable(self._kind)
                self._cupti.activity_flush_all(1)
            except Exception as e:
                log.debug("straggler detection: CUPTI teardown: %s", e)
            self._active = 0
        with _registered_lock:
            if _registered is self:
                _registered = None


def cuda_major_mismatch(cupti_version: str | None, torch_cuda: str | None) -> str | None:
    """Why cupti-python ``cupti_version`` cannot time kernels of a torch built with CUDA
    ``torch_cuda``, or None when their CUDA majors agree (or either is unknown).

    cupti-python's major is the CUDA major it binds; a CUPTI of another major than the
    CUDA runtime torch loaded fails in confusing ways, so kernel timing stays off.
    """
    if not cupti_version or not torch_cuda:
        return None
    cupti_major, cuda_major = cupti_version.split(".", 1)[0], torch_cuda.split(".", 1)[0]
    if not (cupti_major.isdigit() and cuda_major.isdigit()) or cupti_major == cuda_major:
        return None
    return (
        f"cupti-python {cupti_version} is for CUDA {cupti_major} but torch was built with "
        f"CUDA {torch_cuda}; install nvrx-straggler[cupti-cu{cuda_major}]. GPU kernel "
        "scores are off; section timing continues"
    )


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def make_kernel_timer(
    max_samples_per_kernel: int = DEFAULT_MAX_SAMPLES_PER_KERNEL,
    cupti_module: Any = None,
) -> KernelTimer:
    """The best kernel timer this process can have; a NullKernelTimer says why not.

    ``cupti_module`` stands in for ``cupti.cupti`` (tests); by default it is imported
    only when a CUDA device is present.
    """
    cupti = cupti_module
    if cupti is None:
        import torch

        if not torch.cuda.is_available():
            return NullKernelTimer("no CUDA device is available", backend="cupti")
        try:
            from cupti import cupti as bindings
        except ImportError as e:
            return NullKernelTimer(
                f"cupti-python is not importable ({e}); install nvrx-straggler[cupti]",
                backend="cupti",
            )
        mismatch = cuda_major_mismatch(_installed_version("cupti-python"), torch.version.cuda)
        if mismatch is not None:
            log.warning("straggler detection: %s", mismatch)
            return NullKernelTimer(mismatch, backend="cupti")
        cupti = bindings
    try:
        return CuptiKernelTimer(cupti, max_samples_per_kernel)
    except CuptiInUse as e:
        reason = f"{e}. GPU kernel scores are off; section timing continues"
        log.warning("straggler detection: %s", reason)
        return NullKernelTimer(reason, backend="cupti")
    except Exception as e:
        reason = (
            f"CUPTI callbacks could not be registered ({e}); another CUPTI subscriber "
            "(torch.profiler, Nsight) may hold CUPTI. GPU kernel scores are off; section "
            "timing continues"
        )
        log.warning("straggler detection: %s", reason)
        return NullKernelTimer(reason, backend="cupti")
