"""Nested dict/list helpers under NVRx's name (``fault_tolerance.dict_utils``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["dict_list_map_inplace", "nested_values"]


def dict_list_map_inplace(f: Callable[[Any], Any], x: Any) -> Any:
    """Replace every leaf of nested dicts and lists with ``f(leaf)``, in place.

    Dicts and lists are changed in place and returned; a leaf (anything else, tuples
    included) is returned as ``f(leaf)``.
    """
    if isinstance(x, dict):
        for k in list(x):
            x[k] = dict_list_map_inplace(f, x[k])
        return x
    if isinstance(x, list):
        x[:] = [dict_list_map_inplace(f, v) for v in x]
        return x
    return f(x)


def nested_values(x: dict[Any, Any] | list[Any]) -> Any:
    """Iterate over the leaves of nested dicts and lists, depth first."""
    for v in x.values() if isinstance(x, dict) else x:
        if isinstance(v, (dict, list)):
            yield from nested_values(v)
        else:
            yield v
