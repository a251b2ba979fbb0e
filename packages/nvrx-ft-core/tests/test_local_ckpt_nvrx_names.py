"""NVRx's local-checkpoint names over nvrx's engine, in one process."""

from __future__ import annotations

import importlib
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from nvrx.ft.checkpointing.async_ckpt.core import AsyncCallsQueue, AsyncRequest
from nvrx.ft.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict
from nvrx.ft.checkpointing.local.ckpt_managers.base_manager import (
    CheckpointingException,
    CkptID,
)
from nvrx.ft.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
from nvrx.ft.checkpointing.local.replication.group_utils import parse_group_sequence
from nvrx.ft.checkpointing.local.replication.strategies import (
    CliqueReplicationStrategy,
    LazyCliqueReplicationStrategy,
)
from nvrx.ft.dict_utils import dict_list_map_inplace

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def root() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="nvrx-test-lcm-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_every_nvrx_import_path_exists() -> None:
    names = {
        "nvrx.ft.checkpointing.local.base_state_dict": ["TensorAwareStateDict"],
        "nvrx.ft.checkpointing.local.basic_state_dict": [
            "BasicTensorAwareStateDict",
            "TensorPlaceholder",
            "nested_values",
            "dict_list_map_inplace",
        ],
        "nvrx.ft.checkpointing.local.ckpt_managers.base_manager": [
            "BaseCheckpointManager",
            "CkptID",
            "CheckpointingException",
            "SameMachineReplicationException",
        ],
        "nvrx.ft.checkpointing.local.ckpt_managers.local_manager": ["LocalCheckpointManager"],
        "nvrx.ft.checkpointing.local.replication.strategies": [
            "ReplicationStrategy",
            "CliqueReplicationStrategy",
            "LazyReplicationStrategyBuilder",
            "LazyCliqueReplicationStrategy",
            "NoReplicasAvailableError",
        ],
        "nvrx.ft.checkpointing.local.replication.group_utils": [
            "GroupWrapper",
            "ExchangePlan",
            "ExchangePlanEntry",
            "parse_group_sequence",
        ],
        "nvrx.ft.checkpointing.async_ckpt.core": ["AsyncRequest", "AsyncCallsQueue"],
        "nvrx.ft.dict_utils": ["dict_list_map_inplace"],
    }
    for module, wanted in names.items():
        mod = importlib.import_module(module)
        for name in wanted:
            assert hasattr(mod, name), f"{module}.{name}"


def test_manager_save_find_load_like_nvrx(root: pathlib.Path) -> None:
    manager = LocalCheckpointManager(root)
    assert manager.find_latest() == -1
    with pytest.raises(CheckpointingException):
        manager.load()
    state: dict[str, Any] = {
        "w": torch.arange(6.0).reshape(2, 3),
        "meta": {"step": 1, "names": ["a", "b"]},
    }
    assert manager.save(BasicTensorAwareStateDict(state), 1) is None
    assert manager.find_latest() == 1
    tasd, ckpt_id = manager.load()
    assert ckpt_id == CkptID(1, 0, "")
    assert ckpt_id == (1, 0, "")
    assert isinstance(tasd, BasicTensorAwareStateDict)
    assert torch.equal(tasd.state_dict["w"], state["w"])
    assert tasd.state_dict["meta"] == state["meta"]
    with pytest.raises(AssertionError):
        manager.save(BasicTensorAwareStateDict(state), 1)  # at or below the cached latest
    manager.close()

    # A fresh manager (a restart) finds it again.
    again = LocalCheckpointManager(root)
    assert again.find_latest() == 1
    again.save(BasicTensorAwareStateDict({"w": torch.ones(2)}), 2)
    assert again.find_latest() == 2
    tasd2, _ = again.load()
    assert torch.equal(tasd2.state_dict["w"], torch.ones(2))
    again.close()


def test_async_save_through_the_queue(root: pathlib.Path) -> None:
    manager = LocalCheckpointManager(root, session_id="s1")
    queue = AsyncCallsQueue(persistent=False)
    req = manager.save(BasicTensorAwareStateDict({"w": torch.ones(3)}), 5, is_async=True)
    assert isinstance(req, AsyncRequest)
    queue.schedule_async_request(req)
    assert queue.maybe_finalize_async_calls(blocking=True) == [0]
    assert queue.get_num_unfinalized_calls() == 0
    assert manager.find_latest() == 5
    assert (root / "s1" / "0").is_dir()
    queue.close()
    manager.close()


def test_unpicklable_free_state_rejected(root: pathlib.Path) -> None:
    manager = LocalCheckpointManager(root)
    with pytest.raises(CheckpointingException):
        manager.save(BasicTensorAwareStateDict({"f": object()}), 1)
    manager.close()


def test_tasd_round_trip_and_helpers() -> None:
    tasd = BasicTensorAwareStateDict({"a": torch.ones(2), "b": [torch.zeros(1), 3]})
    tensors = tasd.pop_tensors()
    assert tasd.is_hollow
    assert len(tensors) == 2
    tasd.insert_tensors(tensors)
    assert torch.equal(tasd.state_dict["a"], torch.ones(2))
    tasd.pop_tensors()
    tasd.init_tensors()
    assert tasd.state_dict["b"][0].shape == (1,)
    x = {"a": [1, 2], "b": {"c": 3}}
    assert dict_list_map_inplace(lambda v: v * 2, x) == {"a": [2, 4], "b": {"c": 6}}


def test_strategies_and_groups() -> None:
    assert parse_group_sequence(2, 2, 8) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    with pytest.raises(AssertionError):
        parse_group_sequence(2, 2, 6)
    assert CliqueReplicationStrategy.from_replication_params(8, 2).replicas == 1
    assert LazyCliqueReplicationStrategy(replication_factor=3).replicas == 2
    with pytest.raises(ValueError, match="replication_factor"):
        CliqueReplicationStrategy.from_replication_params(1, 0)
