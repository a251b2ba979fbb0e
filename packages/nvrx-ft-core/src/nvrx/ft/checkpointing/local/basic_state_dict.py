"""NVRx's ``BasicTensorAwareStateDict``: a plain nested state dict as a TensorAwareStateDict.

Differences from NVRx (additive): tensors may be on the CPU as well as on CUDA
(NVRx asserts CUDA); ``restore_tensor_device`` returns each tensor to the device it
came from instead of always ``cuda``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from nvrx.ft.checkpointing.local.base_state_dict import TensorAwareStateDict
from nvrx.ft.dict_utils import dict_list_map_inplace, nested_values

__all__ = [
    "BasicTensorAwareStateDict",
    "TensorPlaceholder",
    "dict_list_map_inplace",
    "nested_values",
]


class TensorPlaceholder:
    """Device, shape and dtype of a tensor taken out of a state."""

    def __init__(self, ten: torch.Tensor) -> None:
        self._device = ten.device
        self._shape = ten.shape
        self._dtype = ten.dtype

    def init_tensor(self) -> torch.Tensor:
        """An empty tensor of the recorded device, shape and dtype."""
        return torch.empty(self._shape, dtype=self._dtype, device=self._device)


class BasicTensorAwareStateDict(TensorAwareStateDict):
    """Wraps a state dict whose tensors are nested in dicts and lists only.

    The dict stays in ``.state_dict``. The local checkpoint manager stores the tensors as
    raw bytes and everything else as JSON (str, int, float, bool, None, bytes, tuples).
    """

    def __init__(self, state_dict: dict[str, Any]) -> None:
        self.state_dict = state_dict
        self._is_hollow = False
        self._devices: list[torch.device] = []

    def _tensors(self) -> Iterator[torch.Tensor]:
        for v in nested_values(self.state_dict):
            if isinstance(v, torch.Tensor):
                yield v

    def pop_tensors(self) -> Sequence[torch.Tensor]:
        """Take the tensors out, leaving :class:`TensorPlaceholder` objects."""
        assert not self._is_hollow, "the state dict is hollow"
        out = list(self._tensors())
        dict_list_map_inplace(
            lambda x: TensorPlaceholder(x) if isinstance(x, torch.Tensor) else x, self.state_dict
        )
        self._is_hollow = True
        return out

    @property
    def tensors(self) -> Iterator[torch.Tensor]:
        """The tensors, depth first."""
        assert not self._is_hollow, "the state dict is hollow"
        return self._tensors()

    @property
    def is_hollow(self) -> bool:
        """True after ``pop_tensors`` until the tensors are back."""
        return self._is_hollow

    def insert_tensors(self, tensor_data: Iterable[torch.Tensor]) -> None:
        """Put tensors back in place of the placeholders, in order."""
        assert self._is_hollow, "the state dict is not hollow"
        stack = list(tensor_data)[::-1]
        dict_list_map_inplace(
            lambda x: stack.pop() if isinstance(x, TensorPlaceholder) else x, self.state_dict
        )
        self._is_hollow = False

    def init_tensors(self) -> None:
        """Replace the placeholders with empty tensors."""
        assert self._is_hollow, "the state dict is not hollow"
        dict_list_map_inplace(
            lambda x: x.init_tensor() if isinstance(x, TensorPlaceholder) else x, self.state_dict
        )
        self._is_hollow = False

    def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
        """Replace every tensor with a CPU copy, remembering its device."""
        assert not self._is_hollow, "the state dict is hollow"
        self._devices = [t.device for t in self._tensors()]
        dict_list_map_inplace(
            lambda x: x.to("cpu", non_blocking=non_blocking) if isinstance(x, torch.Tensor) else x,
            self.state_dict,
        )

    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        """Move the tensors back to the devices ``copy_tensors_to_cpu`` saw (else keep)."""
        assert not self._is_hollow, "the state dict is hollow"
        devices = list(self._devices)[::-1]
        if not devices:
            return

        def back(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and devices:
                return x.to(devices.pop(), non_blocking=non_blocking)
            return x

        dict_list_map_inplace(back, self.state_dict)
