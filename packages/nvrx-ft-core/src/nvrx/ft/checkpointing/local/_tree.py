"""Flatten a nested training state into tensors plus a JSON tree, and back.

A state is dicts, lists and tuples nesting tensors and plain values (str, int, float,
bool, None; bytes too). The tree keeps the structure as JSON; each tensor in it is
``{"T": index}`` into the tensor list, so the tensors' bytes can live elsewhere (raw,
with a manifest) and nothing is ever pickled. Anything else raises TypeError naming
the key path, and the caller skips the save with a warning.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__: list[str] = []

Json = Any  # a value json.dumps accepts
_MAX_DEPTH = 64
_QUANTIZED = frozenset((torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4))


def _key_ok(key: object) -> bool:
    return key is None or type(key) in (str, int, float, bool)


def flatten(state: Mapping[str, Any]) -> tuple[Json, list[torch.Tensor], list[str]]:
    """Return (tree, tensors, key paths of the tensors); TypeError on what cannot be kept."""
    tensors: list[torch.Tensor] = []
    paths: list[str] = []

    def walk(value: object, path: str, depth: int) -> Json:
        if depth > _MAX_DEPTH:
            raise TypeError(f"{path or '<root>'}: nested deeper than {_MAX_DEPTH}")
        if isinstance(value, torch.Tensor):
            if value.is_sparse or value.is_quantized or value.layout != torch.strided:
                raise TypeError(f"{path}: only dense (strided) tensors can be kept")
            tensors.append(value)
            paths.append(path)
            return {"T": len(tensors) - 1}
        if value is None or type(value) in (bool, int, float, str):
            return {"v": value}
        if isinstance(value, (bytes, bytearray)):
            return {"b": base64.b64encode(bytes(value)).decode("ascii")}
        if isinstance(value, Mapping):
            items = []
            for k, v in value.items():
                if not _key_ok(k):
                    raise TypeError(f"{path}: a key of type {type(k).__name__} cannot be kept")
                items.append([k, walk(v, f"{path}.{k}" if path else str(k), depth + 1)])
            return {"d": items}
        if isinstance(value, torch.Size):
            return {"S": [int(x) for x in value]}
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            kind = "l" if isinstance(value, list) else "t"
            return {kind: [walk(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]}
        if isinstance(value, torch.dtype):
            return {"D": str(value).removeprefix("torch.")}
        raise TypeError(
            f"{path or '<root>'}: a {type(value).__name__} cannot be kept without pickle "
            "(only tensors, dicts, lists, tuples, str, int, float, bool, None, bytes)"
        )

    if not isinstance(state, Mapping):
        raise TypeError(f"the state must be a mapping, not {type(state).__name__}")
    return walk(state, "", 0), tensors, paths


TensorKey = tuple[torch.dtype, torch.Size, str]


def flatten_for_save(
    state: Mapping[str, Any],
) -> tuple[Json, list[torch.Tensor], list[TensorKey]]:
    """:func:`flatten` for the training thread: (tree, tensors, each tensor's (dtype,
    shape, device type)) in one pass that builds no key paths; on what cannot be kept,
    :func:`flatten` runs again to raise its TypeError naming the key path."""
    tensors: list[torch.Tensor] = []
    keys: list[TensorKey] = []
    tensor_type, strided, plain = torch.Tensor, torch.strided, (bool, int, float, str)

    def walk(value: object, depth: int) -> Json:
        if depth > _MAX_DEPTH:
            raise _Unkept
        if isinstance(value, tensor_type):
            dtype = value.dtype
            if value.layout is not strided or dtype in _QUANTIZED:
                raise _Unkept
            tensors.append(value)
            keys.append((dtype, value.shape, "cpu" if value.is_cpu else value.device.type))
            return {"T": len(tensors) - 1}
        if value is None or type(value) in plain:
            return {"v": value}
        if isinstance(value, Mapping):
            items = []
            for k, v in value.items():
                if not (k is None or type(k) in plain):
                    raise _Unkept
                items.append([k, walk(v, depth + 1)])
            return {"d": items}
        if type(value) is list:
            return {"l": [walk(v, depth + 1) for v in value]}
        if type(value) is tuple:
            return {"t": [walk(v, depth + 1) for v in value]}
        node = other_leaf(value)
        if node is None:
            raise _Unkept
        return node

    try:
        if not isinstance(state, Mapping):
            raise _Unkept
        return walk(state, 0), tensors, keys
    except _Unkept:
        flatten(state)  # raises TypeError with the key path
        raise TypeError("the state cannot be kept without pickle") from None


def other_leaf(value: object) -> Json | None:
    """The tree node of a bytes, torch.Size or torch.dtype value; None for anything else
    (the leaves that are neither tensors nor plain values)."""
    if isinstance(value, (bytes, bytearray)):
        return {"b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, torch.Size):
        return {"S": [int(x) for x in value]}
    if isinstance(value, torch.dtype):
        return {"D": str(value).removeprefix("torch.")}
    return None


class _Unkept(Exception):
    """A value :func:`flatten_for_save` cannot keep (flatten says where and why)."""


def unflatten(tree: Json, tensor_at: Callable[[int, str], torch.Tensor]) -> Any:
    """Rebuild the nested state; ``tensor_at(index, path)`` gives each tensor."""

    def walk(node: Json, path: str, depth: int) -> Any:
        if depth > _MAX_DEPTH or not isinstance(node, dict) or len(node) != 1:
            raise ValueError(f"{path or '<root>'}: malformed tree node")
        ((kind, body),) = node.items()
        if kind == "T":
            if type(body) is not int:
                raise ValueError(f"{path}: malformed tensor reference")
            return tensor_at(body, path)
        if kind == "v":
            if body is not None and type(body) not in (bool, int, float, str):
                raise ValueError(f"{path}: malformed value")
            return body
        if kind == "b":
            return base64.b64decode(str(body).encode("ascii"), validate=True)
        if kind == "S":
            return torch.Size([int(x) for x in body])
        if kind == "D":
            dtype = getattr(torch, str(body), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"{path}: unknown dtype {body!r}")
            return dtype
        if kind == "d":
            out: dict[Any, Any] = {}
            for item in body:
                if not isinstance(item, list) or len(item) != 2 or not _key_ok(item[0]):
                    raise ValueError(f"{path}: malformed dict item")
                k = item[0]
                out[k] = walk(item[1], f"{path}.{k}" if path else str(k), depth + 1)
            return out
        if kind in ("l", "t"):
            if not isinstance(body, list):
                raise ValueError(f"{path}: malformed sequence")
            seq = [walk(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(body)]
            return seq if kind == "l" else tuple(seq)
        raise ValueError(f"{path or '<root>'}: unknown tree node kind {kind!r}")

    return walk(tree, "", 0)


def tensor_paths(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Key path -> tensor of a template state (values that cannot be kept are ignored)."""
    found: dict[str, torch.Tensor] = {}

    def walk(value: object, path: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            return
        if isinstance(value, torch.Tensor):
            found[path] = value
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else str(k), depth + 1)
        elif type(value) in (list, tuple):
            for i, v in enumerate(value):  # type: ignore[arg-type]
                walk(v, f"{path}[{i}]", depth + 1)

    walk(state, "", 0)
    return found
