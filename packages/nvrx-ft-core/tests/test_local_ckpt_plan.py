"""The save plan: a state checked against the last one's structure instead of walked.

Whatever a plan accepts must be exactly what the full walk gives (the same tensors in
the same order, the same tree JSON byte for byte, the same layout); whatever changed
in structure, tensor metadata or a value's kind must make it step aside. The engine
tests save a state, change it one way, save again and restore what was saved.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch

from nvrx.ft.checkpointing.local import LocalCheckpoints, LocalCkptSettings, _format, _tree
from nvrx.ft.checkpointing.local._plan import Plan

pytestmark = pytest.mark.timeout(120)


def _full(state: Mapping[str, Any]) -> tuple[list[torch.Tensor], str, list[_tree.TensorKey]]:
    tree, tensors, key = _tree.flatten_for_save(state)
    return tensors, _format.encode_tree(tree), key


def _plan(state: Mapping[str, Any]) -> Plan:
    tensors, tree_json, _ = _full(state)
    plan = Plan.of(state, tensors, tree_json)
    assert plan is not None
    return plan


def _accepts(plan: Plan, state: Mapping[str, Any]) -> bool:
    """Whether the plan takes ``state``: its structure (match) and its tensors' metadata
    (same_tensor_meta, which the engine checks on the writer thread)."""
    got = plan.match(state)
    return got is not None and plan.same_tensor_meta(got[0])


def _same_as_full(plan: Plan, state: Mapping[str, Any], key: list[_tree.TensorKey]) -> bool:
    """Whether the plan accepted ``state``; if it did, it gave what the full walk gives."""
    got = plan.match(state)
    if got is None or not plan.same_tensor_meta(got[0]):
        return False
    tensors, tree_json, new_key = _full(state)
    assert new_key == key  # the layout the plan stands for still holds
    assert tree_json == got[1]
    assert len(got[0]) == len(tensors)
    assert all(a is b for a, b in zip(got[0], tensors, strict=True))
    return True


def training_state(step: int = 7) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "step": step,
        "rng": torch.get_rng_state(),
        "misc": {"tuple": (1, 2.5, "x", None, True), "bytes": b"\x00\x01", 3: [torch.arange(5)]},
        "size": torch.Size([2, 3]),
        "dtype": torch.bfloat16,
        "empty": torch.empty(0, 3),
        "defaults": collections.defaultdict(int, {"a": 1}),
    }


# -- the plan against the full walk -----------------------------------------------------------
def test_a_training_state_is_planned_and_matched_again() -> None:
    # model.state_dict() and optimizer.state_dict() make new dicts and new (detached)
    # tensor objects at every call: the plan follows them all the same.
    first = training_state()
    plan = _plan(first)
    key = _full(first)[2]
    assert _same_as_full(plan, first, key)
    assert _same_as_full(plan, training_state(step=8), key)


class _Str(str):
    """A str subclass: the full walk refuses it as a key."""


def _rename(d: dict[Any, Any], old: Any, new: Any) -> None:
    """Rename key ``old`` to ``new`` in place, keeping its position."""
    items = [(new if k == old and type(k) is type(old) else k, v) for k, v in d.items()]
    d.clear()
    d.update(items)


@pytest.mark.parametrize(
    ("change", "hit"),
    [
        (lambda s: s.update(step=8), True),
        (lambda s: s.update(step=8.0), True),  # int -> float: the JSON follows
        (lambda s: s.update(step=True), True),
        (lambda s: s.update(step=None), True),
        (lambda s: s.update(step='é\n"x"\ud800'), True),
        (lambda s: s.update(step=-0.0), True),
        (lambda s: s.update(step=math.nan), True),
        (lambda s: s.update(step=-math.inf), True),
        (lambda s: s.update(step=b"\xff"), True),
        (lambda s: s.update(step=torch.Size([1])), True),
        (lambda s: s.update(step=torch.float16), True),
        (lambda s: s["misc"].update(tuple=(2, 3.5, "y", 0, False)), True),
        (lambda s: s.update(empty=torch.ones(0, 3)), True),
        (lambda s: s["model"].update({"0.weight": torch.ones(16, 8)}), True),  # same metadata
        (lambda s: s["model"].update({"0.weight": torch.ones(8, 16)}), False),  # shape
        (lambda s: s["model"].update({"0.weight": torch.ones(16, 8).double()}), False),
        (lambda s: s["model"].update({"0.weight": torch.ones(16, 8).to_sparse()}), False),
        (lambda s: s["model"].update({"0.weight": torch.ones(16, 8, device="meta")}), False),
        (lambda s: s["model"].update({"0.weight": 1.0}), False),  # tensor -> plain
        (lambda s: s["model"].update({"0.weight": {"w": torch.ones(1)}}), False),
        (lambda s: s.update(step=torch.ones(1)), False),  # plain -> tensor
        (lambda s: s.update(step=[1]), False),  # plain -> container
        (lambda s: s.update(step=object()), False),  # cannot be kept: the walk says why
        (lambda s: s.update(new=1), False),  # a key added
        (lambda s: s.pop("step"), False),  # removed
        (lambda s: s.update(step=s.pop("step")), False),  # moved last
        (lambda s: s["misc"].update({3: s["misc"].pop(3)}), True),  # already last
        (lambda s: s["misc"].update({True: s["misc"].pop(3)}), False),  # 3 -> True
        (lambda s: s["misc"].update(tuple=[1, 2.5, "x", None, True]), False),  # tuple -> list
        (lambda s: s["misc"].update(tuple=(1, 2.5, "x", None)), False),  # shorter
        (lambda s: s.update(misc=collections.OrderedDict(s["misc"])), False),  # dict type
        # Keys renamed in place, or of another type but equal: only the keys tell.
        (lambda s: _rename(s, "step", "iteration"), False),
        (lambda s: _rename(s["model"], "0.bias", "0.b"), False),
        (lambda s: _rename(s["misc"], 3, 3.0), False),  # 3 == 3.0, spelled otherwise
        (lambda s: _rename(s, "step", _Str("step")), False),  # cannot be kept
        (lambda s: _rename(s["optim"]["state"][1], "step", _Str("step")), False),
        (lambda s: _rename(s["optim"]["state"], 1, True), False),  # 1 == True
        # An optimizer's per-parameter states, checked together.
        (lambda s: s["optim"]["state"][1].update(exp_avg=torch.ones(16)), True),
        (lambda s: s["optim"]["state"][1].update(exp_avg=torch.ones(17)), False),
        (lambda s: s["optim"]["state"][1].update(extra=torch.ones(1)), False),
        (lambda s: s["optim"]["state"][1].pop("step"), False),
        (lambda s: s["optim"]["state"][1].update(step=1), False),  # tensor -> plain
        (lambda s: s["optim"]["state"][1].update(exp_avg={"a": torch.ones(16)}), False),
        (lambda s: s["optim"]["state"].update({1: list(s["optim"]["state"][1].values())}), False),
        (
            lambda s: s["optim"]["state"].update(
                {1: collections.OrderedDict(s["optim"]["state"][1])}
            ),
            False,
        ),
        (  # keys reordered
            lambda s: s["optim"]["state"].update(
                {1: dict(reversed(s["optim"]["state"][1].items()))}
            ),
            False,
        ),
        (lambda s: s["optim"]["state"].update({1: 5}), False),
        (  # renamed, same tensor: only the keys tell
            lambda s: s["optim"]["state"][1].update(moment=s["optim"]["state"][1].pop("exp_avg")),
            False,
        ),
        (  # two moments of one shape swapped: only the keys' order tells
            lambda s: s["optim"]["state"].update(
                {1: {k: s["optim"]["state"][1][k] for k in ("step", "exp_avg_sq", "exp_avg")}}
            ),
            False,
        ),
        (lambda s: s["optim"]["param_groups"][0].update(lr=0.5), True),
        (lambda s: s["optim"]["param_groups"][0]["params"].append(9), False),
    ],
)
def test_plan_follows_or_steps_aside(change: Any, hit: bool) -> None:
    first = training_state()
    plan = _plan(first)
    key = _full(first)[2]
    state = training_state()
    change(state)
    try:
        _tree.flatten_for_save(state)
    except TypeError:
        assert not _accepts(plan, state)
        return
    assert _same_as_full(plan, state, key) is hit


def test_leaves_are_encoded_as_they_are_at_each_match() -> None:
    # The plan reuses the JSON of leaves that are the same objects as last time; one
    # plan matched again and again must still follow every change of value.
    big = 10**30
    values: list[Any] = [
        0.0,
        -0.0,
        0.0,
        math.nan,
        math.nan,
        1,
        True,
        1,
        big,
        big + 0,
        "a",
        "a" + "b",
        b"x",
        torch.Size([1]),
        torch.float16,
        None,
        2.5,
        2.5,
    ]
    state: dict[str, Any] = {"w": torch.ones(2), "v": values[0], "k": [values[0], 7]}
    plan = _plan(state)
    key = _full(state)[2]
    for v in values:
        for nested in (v, values[0]):
            state = {"w": torch.ones(2), "v": v, "k": [nested, 7]}
            assert _same_as_full(plan, state, key)
            assert _same_as_full(plan, state, key)  # nothing changed: the last JSON


def test_a_key_moved_between_sibling_dicts_is_seen() -> None:
    # Per-parameter dicts are checked together: all their keys in a row, and each
    # one's length, so a key that moves to the next dict is a change.
    t = torch.ones(2)
    first = {"s": {0: {"a": t, "b": t}, 1: {"c": t}}}
    plan = _plan(first)
    key = _full(first)[2]
    assert _same_as_full(plan, {"s": {0: {"a": t, "b": t}, 1: {"c": t}}}, key)
    assert not _same_as_full(plan, {"s": {0: {"a": t}, 1: {"b": t, "c": t}}}, key)


def test_a_mutable_leaf_is_never_planned() -> None:
    buf = bytearray(b"ab")
    state: dict[str, Any] = {"w": torch.ones(2), "b": buf}
    tensors, tree_json, _ = _full(state)
    assert Plan.of(state, tensors, tree_json) is None
    plan = _plan({"w": torch.ones(2), "b": b"ab"})
    assert not _accepts(plan, state)  # bytes -> bytearray: walked in full


def test_tensor_changed_in_place_is_seen() -> None:
    # The same tensor object whose shape, dtype or device changed under it.
    w = torch.zeros(4, 4)
    state = {"w": w, "b": torch.zeros(2)}
    plan = _plan(state)
    key = _full(state)[2]
    assert _same_as_full(plan, state, key)
    w.resize_(2, 8)
    assert not _same_as_full(plan, state, key)
    w.resize_(4, 4)
    assert _same_as_full(plan, state, key)
    w.data = torch.zeros(4, 4, dtype=torch.float64)
    assert not _same_as_full(plan, state, key)
    # (``.data =`` to another device type is a GPU test's: CPU and meta do not mix.)


def test_what_a_plan_does_not_follow_is_walked() -> None:
    class Frozen(Mapping[str, Any]):
        def __init__(self, d: dict[str, Any]) -> None:
            self._d = d

        def __getitem__(self, k: str) -> Any:
            return self._d[k]

        def __iter__(self) -> Iterator[str]:
            return iter(self._d)

        def __len__(self) -> int:
            return len(self._d)

    for state in ({"m": Frozen({"w": torch.ones(2)})}, {"f": {1.5: torch.ones(2)}}):
        tensors, tree_json, _ = _full(state)
        assert Plan.of(state, tensors, tree_json) is None


def _mutated(value: Any, draw: Any, leaf: Any) -> Any:
    """A copy of ``value``'s containers with some of its parts changed."""
    from hypothesis import strategies as st

    what = draw(st.sampled_from(["keep"] * 6 + ["leaf", "meta", "same-meta"]))
    if isinstance(value, torch.Tensor):
        if what == "same-meta":
            return torch.zeros_like(value)
        if what == "meta":
            return value.double() if value.dtype != torch.float64 else value.float()
        return draw(leaf) if what == "leaf" else value
    if isinstance(value, dict):
        out = {k: _mutated(v, draw, leaf) for k, v in value.items()}
        if what == "leaf":
            out[draw(st.text(max_size=2))] = draw(leaf)
        elif what == "meta" and out:
            out.pop(draw(st.sampled_from(sorted(out, key=repr))))
        return out
    if type(value) in (list, tuple):
        items = [_mutated(v, draw, leaf) for v in value]
        if what == "leaf":
            items.append(draw(leaf))
        return type(value)(items)
    return draw(leaf) if what in ("leaf", "meta") else value


_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool]


@pytest.mark.timeout(300)
def test_plan_matches_only_what_the_full_walk_gives() -> None:
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings
    from hypothesis import strategies as st

    leaf = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.text(max_size=6),
        st.binary(max_size=4),
        st.sampled_from([torch.Size([2, 1]), torch.float16]),
        st.builds(
            lambda dtype, shape: torch.zeros(shape, dtype=dtype),
            st.sampled_from(_DTYPES),
            st.lists(st.integers(0, 3), max_size=3),
        ),
    )
    keys = st.one_of(st.text(max_size=4), st.integers(-3, 3), st.booleans(), st.none())
    states = st.dictionaries(
        st.text(min_size=1, max_size=4),
        st.recursive(
            leaf,
            lambda inner: st.one_of(
                st.lists(inner, max_size=4),
                st.lists(inner, max_size=4).map(tuple),
                st.dictionaries(keys, inner, max_size=4),
            ),
            max_leaves=12,
        ),
        max_size=5,
    )
    outcomes = collections.Counter[str]()

    @hsettings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(states, st.data())
    def check(first: dict[str, Any], data: Any) -> None:
        plan = _plan(first)
        key = _full(first)[2]
        assert _same_as_full(plan, first, key)
        second = _mutated(first, data.draw, leaf)
        try:
            new_key = _full(second)[2]
        except TypeError:
            assert not _accepts(plan, second)
            return
        hit = _same_as_full(plan, second, key)
        outcomes["hit" if hit else "miss"] += 1
        if not hit:
            return
        assert new_key == key
        # Back and forth: the plan's kept leaves follow each state.
        assert _same_as_full(plan, first, key)
        assert _same_as_full(plan, second, key)

    check()
    assert outcomes["hit"] > 30, outcomes
    assert outcomes["miss"] > 30, outcomes


# -- the engine: what was saved is what the state held ------------------------------------------
def _restored(node_dir: pathlib.Path) -> dict[str, Any]:
    reader = LocalCheckpoints(LocalCkptSettings(node_dir=node_dir, job_id="plan"))
    got = reader.restore()
    reader.close()
    assert got.state is not None
    return got.state


def _assert_canonical_manifest(node_dir: pathlib.Path, iteration: int) -> None:
    """The snapshot of ``iteration`` has the manifest ``json.dumps`` writes for its
    document (what a plan splices must be exactly that), and its tensors check out."""
    for path in sorted((node_dir / "local0").iterdir()):
        buf = memoryview(path.read_bytes())
        try:
            pre = _format.parse_preamble(buf)
        except _format.SnapshotError:
            continue
        if pre.iteration != iteration:
            continue
        _format.parse(buf, job="plan")
        raw = bytes(buf[pre.manifest_off : pre.manifest_off + pre.manifest_len])
        assert raw == json.dumps(json.loads(raw), separators=(",", ":")).encode()
        return
    raise AssertionError(f"no snapshot of iteration {iteration}")


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert torch.equal(a, b)
    elif isinstance(a, Mapping):
        assert isinstance(b, dict)
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float)
        assert math.isnan(b)
    else:
        assert (type(a), repr(a)) == (type(b), repr(b))


@pytest.mark.timeout(240)
def test_every_save_holds_its_own_state(node_dir: pathlib.Path) -> None:
    # One state changed between saves in every way a plan must notice; each save,
    # restored, is the state as it was at its call.
    lc = LocalCheckpoints(LocalCkptSettings(node_dir=node_dir, job_id="plan"))
    w = torch.zeros(3, 4)
    state: dict[str, Any] = {"m": {"w": w, "b": torch.zeros(4)}, "step": 0, "lr": [0.1]}
    changes: list[Any] = [
        lambda: w.add_(1.0),  # values only
        lambda: state["m"].update(b=torch.full((4,), 2.0)),  # another object, same metadata
        lambda: w.resize_(4, 3),  # same object, new shape
        lambda: setattr(w, "data", torch.ones(4, 3, dtype=torch.float64)),  # new dtype
        lambda: state["m"].update(extra=torch.arange(3)),  # a key added
        lambda: state["m"].pop("b"),  # removed
        lambda: state.update(m=collections.OrderedDict(reversed(state["m"].items()))),
        lambda: state.update(step=-0.0),  # a plain value's kind and spelling
        lambda: state.update(step=math.nan),
        lambda: state.update(lr=(0.1,)),  # list -> tuple
        lambda: None,  # nothing
        lambda: state.update(lr=torch.tensor([0.1])),  # plain -> tensor
        lambda: state.update(lr={1: "a"}),
        lambda: state.update(lr={True: "a"}),  # a key of another type, equal to the last
        lambda: state.update(lr={0.5: "a"}),  # a float key: never planned
        lambda: state.update(lr={0.5: "b"}),
    ]
    for it, change in enumerate(changes):
        change()
        assert lc.save(it, state)
        expect = {
            "m": {k: v.clone() for k, v in state["m"].items()},
            "step": state["step"],
            "lr": state["lr"].clone() if isinstance(state["lr"], torch.Tensor) else state["lr"],
        }
        assert lc.wait(30)
        _assert_canonical_manifest(node_dir, it)
        _assert_same(expect, _restored(node_dir))
    lc.close()


def test_a_change_that_cannot_be_kept_skips_like_a_first_save(
    node_dir: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    lc = LocalCheckpoints(LocalCkptSettings(node_dir=node_dir, job_id="plan"))
    state: dict[str, Any] = {"w": torch.ones(4, 4), "n": 1}
    assert lc.save(0, state)
    assert lc.wait(30)
    assert lc.save(1, state)
    assert lc.wait(30)
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.local_checkpoint"):
        state["w"] = torch.ones(4, 4).to_sparse()
        assert not lc.save(2, state)
        state["w"] = torch.ones(4, 4, device="meta")
        assert not lc.save(3, state)
    assert lc.wait(30)
    state["w"] = torch.full((4, 4), 5.0)
    assert lc.save(4, state)
    assert lc.wait(30)
    lc.close()
    _assert_same({"w": torch.full((4, 4), 5.0), "n": 1}, _restored(node_dir))


def test_a_tensor_that_still_broadcasts_into_its_place_drops_only_that_snapshot(
    node_dir: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The plan reads shapes on the writer thread, after the copy: a tensor shrunk to a
    # shape that broadcasts into its planned place copies without an error, so that
    # snapshot is dropped there; the next save walks the state and keeps the new shape.
    lc = LocalCheckpoints(LocalCkptSettings(node_dir=node_dir, job_id="plan"))
    w = torch.arange(12.0).reshape(3, 4)
    state: dict[str, Any] = {"w": w, "step": 0}
    assert lc.save(0, state)  # walked in full and planned
    assert lc.wait(30)
    w.resize_(1, 4)  # the same object and dtype
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.local_checkpoint"):
        assert lc.save(1, state)
        assert lc.wait(30)
    assert "snapshot of iteration 1 is dropped" in caplog.text
    assert _restored(node_dir)["w"].shape == (3, 4)  # iteration 0, still the newest
    state["step"] = 2
    assert lc.save(2, state)
    assert lc.wait(30)
    lc.close()
    _assert_canonical_manifest(node_dir, 2)
    _assert_same({"w": torch.arange(4.0).reshape(1, 4), "step": 2}, _restored(node_dir))
