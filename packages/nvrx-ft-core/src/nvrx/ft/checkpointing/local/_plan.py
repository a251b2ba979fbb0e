"""A saved state's structure, kept so that the next save checks instead of walking.

A training loop saves the same structure every time: the same nested dicts and lists
with the same keys, tensors of the same dtype, shape, device and layout; only the
tensors' values and a few plain values (the step, a learning rate) change. A
:class:`Plan` is made from a state that :func:`_tree.flatten_for_save` accepted. Its
:meth:`Plan.match` checks a later state against it with bulk operations that run in C
(key lists compared whole, every tensor's metadata read by one ``map`` of an
``attrgetter`` and compared as one list) and returns the tensors and the tree's JSON,
spliced from constant pieces and the plain values' JSON: byte for byte what
:func:`_tree.flatten_for_save` and :func:`_format.encode_tree` give for that state.
On any difference it returns None and the caller walks the state in full.
:meth:`Plan.same_tensor_meta` checks the rest of the tensors' metadata (all but the
dtype) apart, so that the engine can do it off the training thread.

A plan holds no tensor and no container of the state (only keys, types, tensor
metadata and the last save's plain values), so it keeps no memory of the training
alive.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Mapping
from itertools import chain, compress
from operator import attrgetter, is_not, methodcaller
from typing import Any

import torch

from nvrx.ft.checkpointing.local import _tree

__all__: list[str] = []

# The containers a plan follows: their iteration order is their items' order. A state
# with any other mapping type is walked in full at every save.
_MAPPINGS = frozenset((dict, collections.OrderedDict, collections.defaultdict))
_SEQUENCES = frozenset((list, tuple))
_SEQ_KIND: dict[Any, str] = {list: "l", tuple: "t"}
_SEP = (",", ":")
_CPU_META = attrgetter("dtype", "shape", "is_cpu", "layout")
_DEVICE_META = attrgetter("dtype", "shape", "device", "layout")
_DTYPE = attrgetter("dtype")
_encode_str: Callable[[str], str] = json.encoder.encode_basestring_ascii

# What a node's children are, in runs: (_RUN, i, j): tensors i..j-1; (_LEAF, i, j):
# leaves i..j-1 (values that are neither tensors nor containers); (_SUB, i, node).
_RUN, _LEAF, _SUB = 0, 1, 2


class _Mismatch(Exception):
    """The state differs from the plan's structure."""


class _Uncacheable(Exception):
    """The state has something a plan does not follow (it is walked in full)."""


def _float_json(v: float) -> str:
    # json's rule: repr for finite floats, its own names for the others.
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "Infinity" if v > 0 else "-Infinity"
    return float.__repr__(v)


def _leaf_json(v: Any) -> str:
    """One leaf's tree node as JSON (what json.dumps writes for it in the tree)."""
    t = type(v)
    if t is int:
        return '{"v":' + int.__repr__(v) + "}"
    if t is float:
        return '{"v":' + _float_json(v) + "}"
    if t is str:
        return '{"v":' + _encode_str(v) + "}"
    if t is bool:
        return '{"v":true}' if v else '{"v":false}'
    if v is None:
        return '{"v":null}'
    if isinstance(v, (torch.Tensor, Mapping)):
        raise _Mismatch
    node = _tree.other_leaf(v)
    if node is None:
        raise _Mismatch
    return json.dumps(node, separators=_SEP)


class _Node:
    """One container of the state: its type, length, keys and what each child is."""

    __slots__ = ("flat", "key_types", "keys", "kids", "kids_dicts", "n", "ops", "typ")

    def __init__(
        self,
        typ: Any,  # a type: Any, so that matching a value against it narrows nothing
        n: int,
        keys: list[Any] | None,
        ops: list[tuple[int, int, Any]],
    ) -> None:
        self.typ = typ
        self.n = n
        self.keys = keys
        self.key_types = None if keys is None else [type(k) for k in keys]
        # Every child a tensor: the children are the tensors, in order.
        self.flat = n > 0 and ops == [(_RUN, 0, n)]
        self.ops = ops
        # Every child a mapping of tensors only (an optimizer's per-parameter state):
        # the children are checked together, as four lists: their types, their
        # lengths, all their keys one after the other, and those keys' types.
        subs = [arg for op, _, arg in ops if op == _SUB]
        self.kids: tuple[list[Any], list[int], list[Any], list[Any]] | None = None
        if (
            n > 1
            and len(subs) == n
            and all(k.flat and k.keys is not None and k.key_types is not None for k in subs)
        ):
            self.kids = (
                [k.typ for k in subs],
                [k.n for k in subs],
                [key for k in subs for key in k.keys or ()],
                [t for k in subs for t in k.key_types or ()],
            )
        self.kids_dicts = all(k.typ is dict for k in subs)


_values = methodcaller("values")


def _match(node: _Node, value: Any, tensors: list[Any], leaves: list[Any]) -> None:
    """Follow ``value`` against ``node``, collecting its tensors and leaves in the full
    walk's order; _Mismatch on any structural difference."""
    if type(value) is not node.typ or len(value) != node.n:
        raise _Mismatch
    if node.keys is not None:
        keys = list(value)
        if keys != node.keys or list(map(type, keys)) != node.key_types:
            raise _Mismatch
        vals = list(value.values())
    else:
        vals = value
    if node.flat:
        tensors.extend(vals)
        return
    kids = node.kids
    if kids is not None:
        if list(map(type, vals)) != kids[0] or list(map(len, vals)) != kids[1]:
            raise _Mismatch
        keys = list(chain.from_iterable(vals))  # iterating a mapping gives its keys
        if keys != kids[2] or list(map(type, keys)) != kids[3]:
            raise _Mismatch
        # dict.values only on plain dicts: an OrderedDict's own order is its values'.
        values = dict.values if node.kids_dicts else _values
        tensors.extend(chain.from_iterable(map(values, vals)))
        return
    for op, i, arg in node.ops:
        if op == _RUN:
            tensors.extend(vals[i:arg])
        elif op == _LEAF:
            leaves.extend(vals[i:arg])
        else:
            _match(arg, vals[i], tensors, leaves)


class Plan:
    """The structure of one accepted state, to check the next one against.

    It also keeps the last state's leaves and their JSON: a leaf that is the same
    object as last time (leaves are immutable: bytearray is never planned) is not
    encoded again, and when no leaf changed the tree's JSON is the last one."""

    def __init__(
        self,
        root: _Node,
        frags: list[str],
        meta: list[tuple[Any, ...]],
        on_devices: bool,
    ) -> None:
        self._root = root
        self._frags = frags  # the tree's JSON between the leaves: one more than leaves
        self._meta = meta
        self._dtypes = [m[0] for m in meta]
        self._get_meta = _DEVICE_META if on_devices else _CPU_META
        self._leaves: list[Any] = []  # the last state's leaves,
        self._leaf_types: list[type] = []  # their types,
        self._leaf_json: list[str] = []  # their JSON,
        self._json = frags[0]  # and the tree's JSON they made

    @classmethod
    def of(
        cls, state: Mapping[str, Any], tensors: list[torch.Tensor], tree_json: str
    ) -> Plan | None:
        """The plan of ``state``, which :func:`_tree.flatten_for_save` accepted with these
        tensors and whose tree is ``tree_json``; None when a plan cannot follow it."""
        pieces: list[str | None] = []  # None: a leaf
        leaves: list[Any] = []
        count = [0]

        def build(value: Any) -> _Node:
            typ = type(value)
            if typ in _MAPPINGS:
                keys = list(value)
                if any(type(k) is float for k in keys):
                    raise _Uncacheable  # 0.0 and -0.0 are one key with two spellings
                vals = list(value.values())
                pieces.append('{"d":[')
                ops = child_ops(vals, [json.dumps(k, separators=_SEP) for k in keys])
                pieces.append("]}")
                return _Node(typ, len(vals), keys, ops)
            if typ in _SEQUENCES:
                pieces.append('{"' + _SEQ_KIND[typ] + '":[')
                ops = child_ops(list(value), None)
                pieces.append("]}")
                return _Node(typ, len(value), None, ops)
            raise _Uncacheable

        def child_ops(vals: list[Any], key_json: list[str] | None) -> list[tuple[int, int, Any]]:
            ops: list[tuple[int, int, Any]] = []
            for i, v in enumerate(vals):
                if i:
                    pieces.append(",")
                if key_json is not None:
                    pieces.append("[" + key_json[i] + ",")
                if isinstance(v, torch.Tensor):
                    pieces.append('{"T":' + str(count[0]) + "}")
                    count[0] += 1
                    if ops and ops[-1][0] == _RUN and ops[-1][2] == i:
                        ops[-1] = (_RUN, ops[-1][1], i + 1)
                    else:
                        ops.append((_RUN, i, i + 1))
                elif type(v) in _MAPPINGS or type(v) in _SEQUENCES:
                    ops.append((_SUB, i, build(v)))
                elif isinstance(v, Mapping):
                    raise _Uncacheable  # a mapping type the plan does not follow
                else:
                    pieces.append(None)
                    leaves.append(v)
                    if ops and ops[-1][0] == _LEAF and ops[-1][2] == i:
                        ops[-1] = (_LEAF, ops[-1][1], i + 1)
                    else:
                        ops.append((_LEAF, i, i + 1))
                if key_json is not None:
                    pieces.append("]")
            return ops

        try:
            if type(state) not in _MAPPINGS:
                raise _Uncacheable
            root = build(state)
            frags = [""]
            for p in pieces:
                if p is None:
                    frags.append("")
                else:
                    frags[-1] += p
            on_devices = not all(t.is_cpu for t in tensors)
            meta = list(map(_DEVICE_META if on_devices else _CPU_META, tensors))
            plan = cls(root, frags, meta, on_devices)
            # The pieces must give exactly the full walk's JSON; else no plan.
            if count[0] != len(tensors) or plan._tree_json(leaves) != tree_json:
                return None
        except (_Uncacheable, _Mismatch):
            return None
        return plan

    def _tree_json(self, leaves: list[Any]) -> str:
        """The tree's JSON with these leaves (in the plan's order); _Mismatch when a
        leaf is not one (a mutable bytearray is never kept across saves)."""
        if not leaves:
            return self._frags[0]
        types = list(map(type, leaves))
        if types != self._leaf_types:
            if any(issubclass(t, bytearray) for t in set(types)):
                raise _Mismatch
            enc = list(map(_leaf_json, leaves))
        else:
            # Only leaves that are new objects are looked at; a float is encoded again
            # even when equal (0.0 == -0.0), anything else when it differs.
            last = self._leaves
            changed = [
                i
                for i in compress(range(len(leaves)), map(is_not, leaves, last))
                if types[i] is float or leaves[i] != last[i]
            ]
            if not changed:
                self._leaves = leaves
                return self._json
            enc = self._leaf_json.copy()
            for i in changed:
                enc[i] = _leaf_json(leaves[i])
        parts: list[str] = [""] * (2 * len(leaves) + 1)
        parts[0::2] = self._frags
        parts[1::2] = enc
        out = "".join(parts)
        self._leaves, self._leaf_types, self._leaf_json, self._json = leaves, types, enc, out
        return out

    def match(self, state: Mapping[str, Any]) -> tuple[list[Any], str] | None:
        """The values at the tensors' places and the tree JSON of ``state`` if it has
        this plan's structure and its tensors' dtypes, else None.

        The rest of the tensors' metadata (shape, device, layout) is
        :meth:`same_tensor_meta`'s to check. A dtype change must be seen here: a copy
        into the planned place would cast without a word, while a shape that no
        longer fits makes it raise."""
        tensors: list[Any] = []
        leaves: list[Any] = []
        try:
            _match(self._root, state, tensors, leaves)
            if list(map(_DTYPE, tensors)) != self._dtypes:
                return None
            return tensors, self._tree_json(leaves)
        except Exception:  # _Mismatch, or a value that is not what it was
            return None

    def same_tensor_meta(self, tensors: list[Any]) -> bool:
        """Whether ``tensors`` (from :meth:`match`) have the planned dtype, shape,
        device and layout, in order. A value that is not a tensor has no ``dtype``,
        ``shape``, ``is_cpu`` and ``layout`` equal to a tensor's."""
        try:
            return list(map(self._get_meta, tensors)) == self._meta
        except Exception:  # a value without those attributes
            return False
