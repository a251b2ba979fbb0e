"""Local checkpoints of CUDA state (``nox -s gpu_tests``): pinned staging, side stream."""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest
import torch

from nvrx.ft.checkpointing.local import LocalCheckpoints, LocalCkptSettings, RestoreSource

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def node_dir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="nvrx-test-lc-gpu-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_cuda_state_round_trips_and_is_a_snapshot(node_dir: pathlib.Path) -> None:
    settings = LocalCkptSettings(node_dir=node_dir, job_id="gpu", replicas=0)
    lc = LocalCheckpoints(settings)
    w = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    mixed = {"w": w, "cpu": torch.ones(3), "half": w[:10].half(), "step": 3}
    assert lc.save(3, mixed)
    w.add_(1.0)  # the next step's in-place update must not reach the snapshot
    assert lc.wait(60)
    assert lc._engine is not None
    assert lc._engine._staging is not None
    assert lc._engine._staging.is_pinned()
    lc.close()

    again = LocalCheckpoints(settings)
    got = again.restore({"w": torch.empty(0, device="cuda"), "cpu": torch.empty(0)})
    assert got.source is RestoreSource.OWN
    assert got.state is not None
    assert got.state["w"].is_cuda
    assert not got.state["cpu"].is_cuda
    assert got.state["half"].is_cuda  # no template entry: back to the saved device type
    expected = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    assert torch.equal(got.state["w"], expected)
    assert torch.equal(got.state["half"], expected[:10].half())
    again.close()


def test_nvrx_manager_with_cuda_tensors(node_dir: pathlib.Path) -> None:
    from nvrx.ft.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict
    from nvrx.ft.checkpointing.local.ckpt_managers.local_manager import (
        LocalCheckpointManager,
    )

    manager = LocalCheckpointManager(node_dir)
    w = torch.randn(1000, device="cuda")
    manager.save(BasicTensorAwareStateDict({"w": w, "n": 1}), 1)
    assert manager.find_latest() == 1
    tasd, _ = manager.load()
    assert tasd.state_dict["w"].is_cuda
    assert torch.equal(tasd.state_dict["w"], w)
    manager.close()
