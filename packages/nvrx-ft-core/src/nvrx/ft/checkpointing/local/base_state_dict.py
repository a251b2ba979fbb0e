"""NVRx's ``TensorAwareStateDict``: the contract between a caller and a checkpoint manager."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence, ValuesView
from typing import Any

import torch

__all__ = ["TensorAwareStateDict"]


class TensorAwareStateDict(abc.ABC):
    """A state that can hand over its tensors and keep the rest (NVRx's interface).

    nvrx's :class:`~nvrx.ft.checkpointing.local.ckpt_managers.local_manager.LocalCheckpointManager`
    never pickles one: it stores the tensors as raw bytes and the rest of a
    :class:`~nvrx.ft.checkpointing.local.basic_state_dict.BasicTensorAwareStateDict` as JSON.
    """

    @abc.abstractmethod
    def pop_tensors(self) -> Sequence[torch.Tensor]:
        """Take the tensors out, leaving placeholders (the object becomes hollow)."""

    @property
    @abc.abstractmethod
    def tensors(self) -> Iterable[torch.Tensor]:
        """The tensors, in a fixed order."""

    @property
    @abc.abstractmethod
    def is_hollow(self) -> bool:
        """True after ``pop_tensors`` until ``insert_tensors``/``init_tensors``."""

    @abc.abstractmethod
    def insert_tensors(self, tensor_data: Iterable[torch.Tensor]) -> None:
        """The reverse of ``pop_tensors``."""

    @abc.abstractmethod
    def init_tensors(self) -> None:
        """Fill a hollow object with empty tensors of the right shape, dtype and device."""

    @abc.abstractmethod
    def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
        """Replace the tensors with CPU copies (the devices are remembered)."""

    @abc.abstractmethod
    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        """Move the tensors back to their devices."""

    def values(self) -> ValuesView[Any]:
        """The object's attribute values."""
        return vars(self).values()
