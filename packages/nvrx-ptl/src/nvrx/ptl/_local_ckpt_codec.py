"""A Lightning checkpoint as a tree a local snapshot can hold without pickle.

A Lightning checkpoint dict holds more than tensors and JSON values: int keys
(optimizer state), tuples (Adam's ``betas``), non-finite floats (``kth_value``),
``OrderedDict``, paths, dtypes. :func:`encode` turns it into dicts with str keys,
lists, tensors, str, int, finite float, bool and None, which the local snapshot
stores as raw tensor bytes plus JSON; :func:`decode` gives the checkpoint back.
The special values are tagged dicts ``{"__nvrx__": kind, "v": ...}``; a dict of the
checkpoint that itself has the ``__nvrx__`` key is stored as a list of pairs, so a
tag never collides with data. A value of no known kind (an arbitrary object in
``hyper_parameters``, say) is stored as None and named in one warning: nothing is
ever pickled. No Lightning import here.
"""

from __future__ import annotations

import enum
import logging
import math
import pathlib
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["decode", "encode"]

_TAG = "__nvrx__"
_logger = logging.getLogger("nvrx.ptl.local_checkpoint")
_MAX_NAMED = 5


def encode(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint as str-keyed dicts, lists, tensors and JSON scalars (a new tree).

    Tensors are not copied (the snapshot copies them); they are detached from autograd.
    """
    dropped: list[str] = []
    out = _enc_mapping(checkpoint, "", dropped)
    if dropped:
        more = f" and {len(dropped) - _MAX_NAMED} more" if len(dropped) > _MAX_NAMED else ""
        _logger.warning(
            "local snapshot: %s%s cannot be stored without pickle and are restored as None",
            ", ".join(dropped[:_MAX_NAMED]),
            more,
        )
    return out


def _enc_mapping(obj: Mapping[Any, Any], path: str, dropped: list[str]) -> dict[str, Any]:
    if all(type(k) is str for k in obj) and _TAG not in obj:
        return {k: _enc(v, f"{path}/{k}", dropped) for k, v in obj.items()}
    items = [
        [_enc(k, f"{path}/<key {k!r}>", dropped), _enc(v, f"{path}/{k!r}", dropped)]
        for k, v in obj.items()
    ]
    return {_TAG: "items", "v": items}


def _enc(obj: Any, path: str, dropped: list[str]) -> Any:
    if obj is None or type(obj) in (bool, int, str):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if type(obj) is float:
        return obj if math.isfinite(obj) else {_TAG: "float", "v": repr(obj)}
    if isinstance(obj, Mapping):
        return _enc_mapping(obj, path, dropped)
    if isinstance(obj, list):
        return [_enc(v, f"{path}/{i}", dropped) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):  # torch.Size and named tuples too
        return {_TAG: "tuple", "v": [_enc(v, f"{path}/{i}", dropped) for i, v in enumerate(obj)]}
    if isinstance(obj, enum.Enum):
        return _enc(obj.value, path, dropped)
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return _enc(float(obj), path, dropped)
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, pathlib.PurePath):
        return {_TAG: "path", "v": str(obj)}
    if isinstance(obj, torch.dtype):
        return {_TAG: "dtype", "v": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {_TAG: "device", "v": str(obj)}
    numpy = _numpy_value(obj)
    if numpy is not None:
        return numpy
    dropped.append(f"{path or '/'} ({type(obj).__name__})")
    return None


def _numpy_value(obj: Any) -> Any:
    """A numpy scalar as its Python value, an array as a tagged tensor; else None.

    Recognised by type (numpy is not imported here: it is no dependency of ours).
    """
    kind = type(obj)
    if not kind.__module__.startswith("numpy"):
        return None
    dtype = getattr(getattr(obj, "dtype", None), "kind", "")
    if kind.__name__ == "ndarray" and dtype in ("b", "i", "u", "f"):
        return {_TAG: "ndarray", "v": torch.from_numpy(obj.copy())}
    if getattr(obj, "ndim", None) == 0 and callable(getattr(obj, "item", None)):
        return _enc(obj.item(), "", [])
    return None


def decode(tree: Any) -> Any:
    """The inverse of :func:`encode` (tensors are returned as the snapshot gave them)."""
    if isinstance(tree, dict):
        tag = tree.get(_TAG)
        if tag is None:
            return {k: decode(v) for k, v in tree.items()}
        value: Any = tree.get("v")
        if tag == "items":
            return {_hashable(decode(k)): decode(v) for k, v in value}
        if tag == "tuple":
            return tuple(decode(v) for v in value)
        if tag == "float":
            return float(value)
        if tag == "path":
            return pathlib.Path(value)
        if tag == "dtype":
            dtype = getattr(torch, str(value), None)
            return dtype if isinstance(dtype, torch.dtype) else None
        if tag == "device":
            return torch.device(value)
        if tag == "ndarray":
            return value.numpy() if isinstance(value, torch.Tensor) else None
        raise ValueError(f"local snapshot holds an unknown tag {tag!r}")
    if isinstance(tree, list):
        return [decode(v) for v in tree]
    return tree


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key
