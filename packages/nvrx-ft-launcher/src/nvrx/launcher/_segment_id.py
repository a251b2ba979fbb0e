"""This node's segment id for ``--ft-segment``: NVRX_SEGMENT_ID, else its GPUs' NVLink domain.

On a multi-node NVLink system (GB200 NVL72 and the like) every GPU of one NVLink domain
reports the same fabric ClusterUUID through NVML (``nvmlDeviceGetGpuFabricInfo``); that
is the segment id, as in NVRx 0.7. Elsewhere (no NVML, GPUs without a fabric, CPU nodes,
tests) the scheduler or the user names it in ``NVRX_SEGMENT_ID``, which also wins over
NVML when set. Found at start-up; none found is a usage error (exit 2) with the reason.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

__all__: list[str] = []

SEGMENT_ID_ENV = "NVRX_SEGMENT_ID"
_MAX_LEN = 128


def parse_segment_id(text: str) -> str:
    """A segment id as given in the environment; ValueError unless 1-128 visible ASCII."""
    value = text.strip()
    if not value or len(value) > _MAX_LEN or not value.isascii() or not value.isprintable():
        raise ValueError(f"{SEGMENT_ID_ENV}={text!r}: not 1-{_MAX_LEN} printable ASCII characters")
    if any(c.isspace() for c in value) or "#" in value:
        raise ValueError(f"{SEGMENT_ID_ENV}={text!r}: no spaces or '#' in a segment id")
    return value


#: NVML's nvmlGpuFabricState_t values (pynvml: NVML_GPU_FABRIC_STATE_*).
_FABRIC_NOT_STARTED = 1
_FABRIC_IN_PROGRESS = 2
_FABRIC_COMPLETED = 3
#: How long a start-up waits for a GPU's fabric registration still in progress (boot).
FABRIC_WAIT_S = 60.0


def nvml_cluster_uuid(
    nvml: Any, *, wait_s: float = FABRIC_WAIT_S, sleep: Callable[[float], None] = time.sleep
) -> str:
    """The one fabric ClusterUUID of every GPU here; ValueError saying why there is none.

    ``nvml`` is the ``pynvml`` module, initialised by the caller. A GPU whose fabric
    registration is still in progress (just after boot its ClusterUUID reads as zeros)
    is asked again once a second for up to ``wait_s``.
    """
    read: Callable[[Any], Any] | None = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None)
    if read is None:
        raise ValueError("this pynvml cannot read NVLink fabric info (nvmlDeviceGetGpuFabricInfo)")
    count = int(nvml.nvmlDeviceGetCount())
    if count == 0:
        raise ValueError("NVML sees no GPU")
    ids = set()
    deadline = time.monotonic() + wait_s
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        while True:
            try:
                info = read(handle)
            except Exception as exc:  # NVMLError_NotSupported on GPUs without a fabric
                raise ValueError(f"GPU {index} has no NVLink fabric info: {exc}") from None
            state = getattr(info, "state", None)  # absent: an older struct, no state
            if state != _FABRIC_IN_PROGRESS:
                break
            if time.monotonic() >= deadline:
                raise ValueError(
                    f"GPU {index}'s NVLink fabric registration is still in progress after "
                    f"{wait_s:g} s"
                )
            sleep(1.0)
        if state == _FABRIC_NOT_STARTED:
            raise ValueError(
                f"GPU {index}'s NVLink fabric registration has not started (is the fabric "
                f"manager running?)"
            )
        status = getattr(info, "status", 0)
        if state == _FABRIC_COMPLETED and status != 0:
            raise ValueError(f"GPU {index}'s NVLink fabric registration failed (status {status})")
        raw = bytes(getattr(info, "clusterUuid", b"") or b"")[:16]
        if len(raw) != 16 or not any(raw):
            raise ValueError(f"GPU {index} is in no NVLink domain (ClusterUUID unset)")
        ids.add(str(uuid.UUID(bytes=raw)))
    if len(ids) != 1:
        raise ValueError(f"this node's GPUs are in {len(ids)} NVLink domains: {sorted(ids)}")
    return ids.pop()


def _from_nvml() -> str:
    try:
        import pynvml
    except ImportError:
        raise ValueError("no pynvml (nvidia-ml-py) to read the GPUs' NVLink domain") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        raise ValueError(f"NVML is not available: {exc}") from None
    try:
        return nvml_cluster_uuid(pynvml)
    finally:
        with contextlib.suppress(Exception):  # nothing to do about it
            pynvml.nvmlShutdown()


def node_segment_id(
    env: Mapping[str, str], nvml_reader: Callable[[], str] = _from_nvml
) -> tuple[str, str]:
    """(segment id, where it came from); ValueError saying why this node has none."""
    if env.get(SEGMENT_ID_ENV) is not None:
        return parse_segment_id(env[SEGMENT_ID_ENV]), SEGMENT_ID_ENV
    try:
        return nvml_reader(), "the GPUs' NVLink ClusterUUID"
    except ValueError as exc:
        raise ValueError(
            f"this node has no segment id: {SEGMENT_ID_ENV} is not set and {exc}"
        ) from None
