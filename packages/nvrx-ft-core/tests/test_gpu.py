"""GPU-only checks (``nox -s gpu_tests``): NVML health check and the NCCL reduce device."""

from __future__ import annotations

import logging
import socket

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_nvml_health_check_is_active_and_healthy() -> None:
    from nvrx.ft._health import GpuHealthCheck

    check = GpuHealthCheck(local_rank=0, logger=logging.getLogger("test"))
    try:
        assert check.active
        bus_id = check.pci_bus_id
        assert bus_id is not None
        assert bus_id.count(":") == 2
        check.check()  # a healthy GPU needs no recovery action
    finally:
        check.close()


def test_nccl_reduce_uses_the_gpu_and_keeps_values(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from nvrx.ft import SectionAction, TimeoutsCalc
    from nvrx.ft.timeouts_calc import _reduce_device

    assert _reduce_device("nccl").startswith("cuda")
    assert _reduce_device("cpu:gloo,cuda:nccl") == "cpu"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }.items():
        monkeypatch.setenv(key, value)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    try:
        calc = TimeoutsCalc(sections=["b", "a"], start_time=0.0)
        calc.update_on_section_event("a", SectionAction.OPEN, 1.0)
        calc.update_on_section_event("a", SectionAction.CLOSE, 3.5)
        calc.synchronize_all()
        assert calc.section_to_max_time == {"a": 2.5, "b": -1.0}
    finally:
        dist.destroy_process_group()
