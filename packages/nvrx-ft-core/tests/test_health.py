"""Health checks: NIC link_downed counter through a sysfs-like tree, topology XML, NVML absent."""

from __future__ import annotations

import logging
import pathlib
import time
from typing import TYPE_CHECKING

import pytest

from nvrx.ft import FaultToleranceConfig, HealthError
from nvrx.ft._health import GpuHealthCheck, NicHealthCheck, nic_for_gpu_from_topology

if TYPE_CHECKING:
    from tests.conftest import Events, MakeConfig, MonitorFactory, RankFactory

LOG = logging.getLogger("test")


def _tree(root: pathlib.Path, nics: dict[str, int]) -> str:
    for nic, value in nics.items():
        counter = root / nic / "ports" / "1" / "counters" / "link_downed"
        counter.parent.mkdir(parents=True)
        counter.write_text(f"{value}\n")
    return str(root / "{nic}" / "ports" / "1" / "counters" / "link_downed")


def test_nic_check_fails_only_when_link_downed_grows(tmp_path: pathlib.Path) -> None:
    template = _tree(tmp_path, {"mlx5_0": 3, "mlx5_1": 0})
    cfg = FaultToleranceConfig(enable_nic_monitor=True, link_down_path_template=template)
    check = NicHealthCheck(cfg, local_rank=1, gpu_bus_id=None, logger=LOG)
    assert check.active
    assert check.nic == "mlx5_1"  # no GPU info: local rank picks among sorted NICs
    check.check()
    counter = tmp_path / "mlx5_1" / "ports" / "1" / "counters" / "link_downed"
    counter.write_text("2\n")
    with pytest.raises(HealthError, match=r"mlx5_1 link went down: link_downed 0 -> 2") as info:
        check.check()
    assert info.value.cause == "nic_health"
    check.check()  # no further growth: healthy again


def test_nic_check_skips_without_nics(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = FaultToleranceConfig(
        enable_nic_monitor=True, link_down_path_template=str(tmp_path / "{nic}" / "x")
    )
    with caplog.at_level(logging.INFO):
        check = NicHealthCheck(cfg, local_rank=0, gpu_bus_id=None, logger=LOG)
    assert not check.active
    check.check()
    assert "NIC health check skipped" in caplog.text


def test_topology_file_maps_gpu_to_its_nic(tmp_path: pathlib.Path) -> None:
    topo = tmp_path / "topo.xml"
    topo.write_text(
        """<system version="1">
  <cpu numaid="0">
    <pci busid="0000:10:00.0">
      <pci busid="0000:11:00.0"><gpu dev="0"/></pci>
      <pci busid="0000:12:00.0"><nic><net name="mlx5_3" dev="0"/></nic></pci>
    </pci>
    <pci busid="0000:20:00.0">
      <pci busid="0000:21:00.0"><gpu dev="1"/></pci>
      <pci busid="0000:22:00.0"><nic><net name="mlx5_7" dev="1"/></nic></pci>
    </pci>
  </cpu>
</system>"""
    )
    assert nic_for_gpu_from_topology(topo, 0) == "mlx5_3"
    assert nic_for_gpu_from_topology(topo, 1) == "mlx5_7"
    assert nic_for_gpu_from_topology(topo, 5) is None
    template = _tree(tmp_path / "sys", {"mlx5_3": 0, "mlx5_7": 0})
    cfg = FaultToleranceConfig(
        enable_nic_monitor=True, link_down_path_template=template, pci_topo_file=str(topo)
    )
    assert NicHealthCheck(cfg, local_rank=1, gpu_bus_id=None, logger=LOG).nic == "mlx5_7"


def test_gpu_check_is_skipped_cleanly_without_a_gpu(caplog: pytest.LogCaptureFixture) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with caplog.at_level(logging.INFO):
        check = GpuHealthCheck(local_rank=0, logger=LOG)
    assert not check.active
    check.check()
    check.close()
    assert "GPU health check skipped" in caplog.text


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_monitor_terminates_rank_when_nic_goes_down(
    tmp_path: pathlib.Path,
    make_config: MakeConfig,
    start_monitor: MonitorFactory,
    start_rank: RankFactory,
    events: Events,
) -> None:
    template = _tree(tmp_path / "sys", {"mlx5_0": 0})
    _, log = start_monitor(
        make_config(
            enable_nic_monitor=True,
            link_down_path_template=template,
            node_health_check_interval=0.2,
        )
    )
    rank = start_rank([["init"], ["say", "up"], ["beat_for", 60, 0.05]])
    rank.wait_output("up")
    events.wait("rank_connected")
    deadline = time.monotonic() + 30
    while "NIC health check watches mlx5_0" not in log.read_text():  # baseline taken
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    (tmp_path / "sys" / "mlx5_0" / "ports" / "1" / "counters" / "link_downed").write_text("1\n")
    ev = events.wait("rank_terminated")
    assert ev.cause == "nic_health"
    assert ev.message is not None
    assert "mlx5_0 link went down" in ev.message
    assert ev.observed_s is None
    rank.wait_exit()
