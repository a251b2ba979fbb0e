"""Node health checks run by the monitor: the GPU through NVML, the NIC's link_downed counter.

A failed check raises :class:`HealthError` saying which check failed and why; a check
that cannot run here (no NVML, no GPU, no InfiniBand) is skipped once with a log line.
NVML is initialised once per monitor, not per check.
"""

from __future__ import annotations

import glob
import logging
import os
import pathlib
import re
from typing import Any

from nvrx.ft.config import FaultToleranceConfig

__all__ = [
    "DEFAULT_LINK_DOWN_PATH_TEMPLATE",
    "GpuHealthCheck",
    "HealthChecks",
    "HealthError",
    "NicHealthCheck",
    "nic_for_gpu_from_topology",
]

DEFAULT_LINK_DOWN_PATH_TEMPLATE = "/sys/class/infiniband/{nic}/ports/1/counters/link_downed"


class HealthError(Exception):
    """A failed health check; ``cause`` is ``gpu_health`` or ``nic_health``."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


class GpuHealthCheck:
    """Asks NVML whether this rank's GPU needs a recovery action (driver r570+)."""

    def __init__(self, local_rank: int, logger: logging.Logger) -> None:
        self._logger = logger
        self._nvml: Any = None
        self._handle: Any = None
        self._index = local_rank
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:
            logger.info("GPU health check skipped: NVML is not available (%s)", exc)
            return
        try:
            count = pynvml.nvmlDeviceGetCount()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible:
                ids = [v.strip() for v in visible.split(",") if v.strip()]
                if local_rank < len(ids) and ids[local_rank].isdigit():
                    self._index = int(ids[local_rank])
            if self._index >= count:
                logger.info(
                    "GPU health check skipped: no GPU %d (this node has %d)", self._index, count
                )
                pynvml.nvmlShutdown()
                return
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self._index)
        except Exception as exc:
            logger.info("GPU health check skipped: %s", exc)
            pynvml.nvmlShutdown()
            return
        self._nvml = pynvml

    @property
    def active(self) -> bool:
        """True when NVML and this rank's GPU are available."""
        return self._nvml is not None

    @property
    def pci_bus_id(self) -> str | None:
        """The GPU's PCI bus id (lower case, ``0000:xx:yy.z``), if known."""
        if self._nvml is None:
            return None
        try:
            info = self._nvml.nvmlDeviceGetPciInfo(self._handle)
            bus = info.busId.decode() if isinstance(info.busId, bytes) else str(info.busId)
            return bus.lower()[-12:]
        except Exception:
            return None

    def check(self) -> None:
        """Raise HealthError when NVML reports the GPU lost or asks for a recovery action."""
        nvml = self._nvml
        if nvml is None:
            return
        try:
            values = nvml.nvmlDeviceGetFieldValues(
                self._handle, [nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
            )
        except nvml.NVMLError as exc:
            lost = getattr(nvml, "NVMLError_GpuIsLost", None)
            if lost is not None and isinstance(exc, lost):
                raise HealthError("gpu_health", f"GPU {self._index} is lost: {exc}") from None
            self._logger.debug("GPU recovery action not readable: %s", exc)
            return
        field = values[0]
        if getattr(field, "nvmlReturn", 0) != nvml.NVML_SUCCESS:
            return
        action = int(field.value.uiVal)
        if action != nvml.NVML_GPU_RECOVERY_ACTION_NONE:
            names = {
                getattr(nvml, n): n.removeprefix("NVML_GPU_RECOVERY_ACTION_")
                for n in dir(nvml)
                if n.startswith("NVML_GPU_RECOVERY_ACTION_")
            }
            raise HealthError(
                "gpu_health",
                f"GPU {self._index} needs recovery action {names.get(action, action)}",
            )

    def close(self) -> None:
        """Shut NVML down."""
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:
                self._logger.debug("nvmlShutdown failed: %s", exc)
            self._nvml = None


def nic_for_gpu_from_topology(topo_file: str | os.PathLike[str], gpu_index: int) -> str | None:
    """The NIC closest to a GPU in an NCCL-style topology XML, or None.

    The GPU is the ``<gpu dev="N">`` element; its NIC is the first ``<net name=...>``
    under the nearest enclosing element that has one (same PCI switch first).
    """
    import xml.etree.ElementTree as ET

    root = ET.parse(topo_file).getroot()  # noqa: S314 - a local file the user configured
    parents = {child: parent for parent in root.iter() for child in parent}
    for gpu in root.iter("gpu"):
        if gpu.get("dev") != str(gpu_index):
            continue
        node = parents.get(gpu)
        while node is not None:
            for net in node.iter("net"):
                name = net.get("name")
                if name:
                    return name
            node = parents.get(node)
    return None


class NicHealthCheck:
    """Fails when the link_downed counter of this rank's InfiniBand NIC grows."""

    def __init__(
        self,
        cfg: FaultToleranceConfig,
        local_rank: int,
        gpu_bus_id: str | None,
        logger: logging.Logger,
    ) -> None:
        self._template = cfg.link_down_path_template or DEFAULT_LINK_DOWN_PATH_TEMPLATE
        self._logger = logger
        self._path: pathlib.Path | None = None
        self._last: int | None = None
        nic = self._pick_nic(cfg, local_rank, gpu_bus_id)
        if nic is None:
            return
        self.nic = nic
        self._path = pathlib.Path(self._template.format(nic=nic))
        self._last = self._read()
        logger.info("NIC health check watches %s (%s)", nic, self._path)

    def _pick_nic(
        self, cfg: FaultToleranceConfig, local_rank: int, gpu_bus_id: str | None
    ) -> str | None:
        if cfg.pci_topo_file:
            try:
                nic = nic_for_gpu_from_topology(cfg.pci_topo_file, local_rank)
            except (OSError, SyntaxError) as exc:  # ET.ParseError is a SyntaxError
                self._logger.warning("NIC health check: cannot read %s: %s", cfg.pci_topo_file, exc)
                nic = None
            if nic is not None:
                return nic
        pattern = re.escape(self._template).replace(re.escape("{nic}"), "([^/]+)")
        found = sorted(
            m.group(1)
            for p in glob.glob(self._template.replace("{nic}", "*"))
            if (m := re.fullmatch(pattern, p))
        )
        if not found:
            self._logger.info("NIC health check skipped: no NIC matches %s", self._template)
            return None
        if gpu_bus_id is not None:
            closest = _closest_nic(found, gpu_bus_id)
            if closest is not None:
                return closest
        return found[local_rank % len(found)]

    def _read(self) -> int | None:
        assert self._path is not None
        try:
            return int(self._path.read_text().strip())
        except (OSError, ValueError) as exc:
            self._logger.warning("NIC health check: cannot read %s: %s", self._path, exc)
            return None

    @property
    def active(self) -> bool:
        """True when a NIC counter is being watched."""
        return self._path is not None

    def check(self) -> None:
        """Raise HealthError if link_downed grew since the last check."""
        if self._path is None:
            return
        value = self._read()
        if value is None:
            return
        last, self._last = self._last, value
        if last is not None and value > last:
            raise HealthError(
                "nic_health",
                f"NIC {self.nic} link went down: link_downed {last} -> {value} ({self._path})",
            )


def _closest_nic(nics: list[str], gpu_bus_id: str) -> str | None:
    """The NIC whose sysfs PCI path shares the longest prefix with the GPU's."""
    try:
        gpu_path = os.path.realpath(f"/sys/bus/pci/devices/{gpu_bus_id}")
    except OSError:
        return None
    best, best_len = None, -1
    for nic in nics:
        nic_path = os.path.realpath(f"/sys/class/infiniband/{nic}/device")
        common = len(os.path.commonpath([gpu_path, nic_path])) if nic_path.startswith("/") else 0
        if common > best_len:
            best, best_len = nic, common
    return best


class HealthChecks:
    """The checks the configuration enables, run together."""

    def __init__(self, cfg: FaultToleranceConfig, local_rank: int, logger: logging.Logger) -> None:
        self._gpu = GpuHealthCheck(local_rank, logger) if cfg.enable_gpu_monitor else None
        bus_id = self._gpu.pci_bus_id if self._gpu is not None else None
        self._nic = (
            NicHealthCheck(cfg, local_rank, bus_id, logger) if cfg.enable_nic_monitor else None
        )

    def check(self) -> None:
        """Run every active check; the first failure raises HealthError."""
        if self._gpu is not None:
            self._gpu.check()
        if self._nic is not None:
            self._nic.check()

    def close(self) -> None:
        """Release NVML."""
        if self._gpu is not None:
            self._gpu.close()
