"""Local checkpoints in one process: tree, format, store, placement, agreement, API."""

from __future__ import annotations

import json
import logging
import os
import pathlib
from typing import Any

import pytest
import torch

from nvrx.ft.checkpointing.local import (
    LocalCheckpoints,
    LocalCkptSettings,
    RestoreResult,
    RestoreSource,
    _agreement,
    _format,
    _placement,
    _tree,
)
from nvrx.ft.checkpointing.local._contract import read_restore_records

pytestmark = pytest.mark.timeout(60)


def settings(node_dir: pathlib.Path, **kw: Any) -> LocalCkptSettings:
    return LocalCkptSettings(node_dir=node_dir, job_id=kw.pop("job_id", "job-a"), **kw)


def training_state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "step": 7,
        "rng": torch.get_rng_state(),
        "misc": {"tuple": (1, 2.5, "x", None, True), "bytes": b"\x00\x01", 3: [torch.arange(5)]},
        "scalar": torch.tensor(1.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
        "noncontig": torch.arange(12.0).reshape(3, 4).t(),
        "half": torch.ones(3, dtype=torch.bfloat16),
        "flags": torch.tensor([True, False]),
    }


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype
        assert a.shape == b.shape
        assert torch.equal(a.cpu(), b.cpu())
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=False):
            assert_same(x, y)
    else:
        assert a == b
        assert type(a) is type(b)


# -- tree -------------------------------------------------------------------------------------
def test_tree_round_trip_keeps_types_and_tensors() -> None:
    state = training_state()
    tree, tensors, paths = _tree.flatten(state)
    json.dumps(tree)  # plain JSON
    assert "model.0.weight" in paths
    back = _tree.unflatten(json.loads(json.dumps(tree)), lambda i, _p: tensors[i])
    assert_same(state, back)


def _deep(n: int, leaf: Any = 0) -> Any:
    out: Any = leaf
    for _ in range(n):
        out = [out]
    return out


@pytest.mark.parametrize(
    "bad",
    [
        object(),
        {1.5j: 1},
        {"f": lambda: 0},
        {"s": {1, 2}},
        {"m": {"sparse": torch.eye(3).to_sparse()}},
        {"deep": _deep(80)},
        {"deep": _deep(63, {"t": torch.ones(1)})},  # a tensor one level too deep
    ],
)
def test_tree_refuses_what_needs_pickle(bad: Any) -> None:
    state = bad if isinstance(bad, dict) else {"x": bad}
    with pytest.raises(TypeError) as slow:
        _tree.flatten(state)
    # The save's one-pass walk refuses the same states, with the same message.
    with pytest.raises(TypeError) as fast:
        _tree.flatten_for_save(state)
    assert str(fast.value) == str(slow.value)
    _tree.flatten_for_save({"ok": _deep(62, {"t": torch.ones(1)})})


# -- format -----------------------------------------------------------------------------------
def _snapshot_bytes(job: str = "job-a") -> bytearray:
    data = torch.arange(10, dtype=torch.int32)
    offsets, end = _format.layout([data])
    raw = bytes(data.view(torch.uint8).tolist())  # no numpy in the package's own venv
    import zlib

    entry = _format.TensorEntry("int32", (10,), offsets[0], len(raw), zlib.crc32(raw), "cpu")
    man = _format.encode_manifest(
        job=job, owner=0, world_size=1, iteration=3, wall=1.0, tree={"T": 0}, entries=[entry]
    )
    buf = bytearray(end + len(man))
    buf[offsets[0] : offsets[0] + len(raw)] = raw
    buf[end:] = man
    pre = _format.Preamble(
        3, 0, 1, end - _format.PREAMBLE_SIZE, end, len(man), zlib.crc32(man), len(buf)
    )
    buf[: _format.PREAMBLE_SIZE] = _format.encode_preamble(pre)
    return buf


def test_format_parses_and_checks_everything() -> None:
    buf = _snapshot_bytes()
    _pre, man = _format.parse(memoryview(buf), job="job-a", world_size=1)
    assert man.iteration == 3
    assert torch.equal(
        _format.tensor_view(memoryview(buf), man.tensors[0]), torch.arange(10, dtype=torch.int32)
    )
    with pytest.raises(_format.SnapshotError, match="job"):
        _format.parse(memoryview(buf), job="other")
    with pytest.raises(_format.SnapshotError, match="world"):
        _format.parse(memoryview(buf), job="job-a", world_size=2)
    flipped = bytearray(buf)
    flipped[_format.PREAMBLE_SIZE + 5] ^= 0xFF
    with pytest.raises(_format.SnapshotError, match="checksum"):
        _format.parse(memoryview(flipped), job="job-a")
    with pytest.raises(_format.SnapshotError, match="truncated"):
        _format.parse(memoryview(buf)[: len(buf) - 3], job="job-a")
    old = bytearray(buf)
    old[8] = 99  # version field
    with pytest.raises(_format.SnapshotError):
        _format.parse(memoryview(old), job="job-a")


def test_manifest_is_what_json_dumps_writes() -> None:
    # The manifest is spliced from pieces; its bytes are json.dumps's of the document.
    entries = [
        _format.TensorEntry("float32", (3, 4), 4096, 48, 0xFFFFFFFF, "cpu"),
        _format.TensorEntry("bfloat16", (), 4160, 2, 0, "cuda"),
        _format.TensorEntry("int8", (0, 7), 4224, 0, 12345, "cpu"),
    ]
    tree = {"d": [["é\n", {"T": 0}], [1, {"l": [{"T": 1}, {"T": 2}, {"v": -0.0}]}]]}
    for n in (0, 1, 3):
        got = _format.encode_manifest(
            job="j\u2603",
            owner=2,
            world_size=4,
            iteration=10,
            wall=1.5,
            tree=tree,
            entries=entries[:n],
        )
        doc = {
            "format": _format.FORMAT_VERSION,
            "job": "j\u2603",
            "owner": 2,
            "world_size": 4,
            "iteration": 10,
            "wall": 1.5,
            "tree": tree,
            "tensors": [
                [e.dtype, list(e.shape), e.offset, e.nbytes, e.crc, e.device] for e in entries[:n]
            ],
        }
        assert got == json.dumps(doc, separators=(",", ":")).encode()


# -- placement / agreement -------------------------------------------------------------------
@pytest.mark.parametrize("nodes", [[2, 2], [2, 2, 2], [4, 2, 3], [1, 1, 1, 1, 1], [3]])
@pytest.mark.parametrize("replicas", [1, 2])
def test_placement_survives_any_r_lost_nodes(nodes: list[int], replicas: int) -> None:
    node_of_rank = [n for n, size in enumerate(nodes) for _ in range(size)]
    r = _placement.effective_replicas(node_of_rank, replicas)
    assert r == min(replicas, len(nodes) - 1)
    for owner in range(len(node_of_rank)):
        holders = _placement.replica_holders(owner, node_of_rank, replicas)
        assert len(holders) == r
        held_nodes = {node_of_rank[h] for h in holders} | {node_of_rank[owner]}
        assert len(held_nodes) == r + 1  # every copy on a different node
        for h in holders:
            assert owner in _placement.owners_held_by(h, node_of_rank, replicas)


def _table(
    blocks: list[tuple[list[tuple[int, int, int]], int | None]], slots: int = 4
) -> torch.Tensor:
    return torch.stack([_agreement.encode(o, g, slots) for o, g in blocks])


def test_choose_newest_complete_iteration_own_first() -> None:
    table = _table(
        [
            ([(0, 5, 100), (0, 4, 100), (1, 5, 90)], None),
            ([(1, 4, 90)], None),  # rank 1 lost its iteration 5; rank 0 holds a replica
        ]
    )
    plan = _agreement.choose(table, 2)
    assert plan.iteration == 5
    assert plan.source_of == (0, 0)
    assert plan.nbytes_of == (100, 90)


def test_choose_global_when_as_new_or_nothing_complete() -> None:
    table = _table([([(0, 5, 10)], 5), ([(1, 5, 10)], None)])
    plan = _agreement.choose(table, 2)
    assert plan.iteration is None
    assert plan.global_iteration == 5
    table = _table([([(0, 5, 10)], None), ([(1, 4, 10)], None)])
    assert _agreement.choose(table, 2).iteration is None
    table = _table([([(0, 5, 10)], None), ([(1, 5, 10)], None)])
    assert _agreement.choose(table, 3).iteration is None  # world grew: owner 2 missing


# -- the API in one process ------------------------------------------------------------------
def test_save_restore_round_trip(node_dir: pathlib.Path) -> None:
    lc = LocalCheckpoints(settings(node_dir))
    first = lc.restore(global_iteration=None)
    assert first == RestoreResult(RestoreSource.NONE, None, None, first.seconds)
    state = training_state()
    assert lc.save(1, state)
    assert lc.wait(30)
    state2 = training_state(seed=1)
    assert lc.save(2, state2)
    lc.close()

    again = LocalCheckpoints(settings(node_dir))
    got = again.restore(state, global_iteration=1)
    assert got.source is RestoreSource.OWN
    assert got.iteration == 2
    assert got.state is not None
    assert_same(state2, got.state)
    records = read_restore_records(node_dir)
    assert [(r.source, r.iteration) for r in records] == [(RestoreSource.OWN, 2)]
    # A global checkpoint as new wins.
    g = again.restore(state, global_iteration=2)
    assert (g.source, g.iteration, g.state) == (RestoreSource.GLOBAL, 2, None)
    again.close()


def test_two_slots_reused_in_place(node_dir: pathlib.Path) -> None:
    lc = LocalCheckpoints(settings(node_dir))
    for it in range(5):
        assert lc.save(it, {"w": torch.full((1000,), float(it))})
        assert lc.wait(30)
    names = sorted(p.name for p in (node_dir / "local0").iterdir())
    assert names == ["0.0.snap", "0.1.snap"]
    lc.close()
    got = LocalCheckpoints(settings(node_dir)).restore()
    assert got.iteration == 4
    assert got.state is not None
    assert torch.equal(got.state["w"], torch.full((1000,), 4.0))


def test_corrupt_newest_falls_back_to_older_slot(
    node_dir: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    lc = LocalCheckpoints(settings(node_dir))
    lc.save(1, {"w": torch.ones(100)})
    lc.wait(30)
    lc.save(2, {"w": torch.ones(100) * 2})
    lc.close()
    newest = node_dir / "local0" / "0.1.snap"
    with newest.open("r+b") as f:
        f.seek(_format.PREAMBLE_SIZE + 8)
        f.write(b"\xff\xff\xff\xff")
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.local_checkpoint"):
        got = LocalCheckpoints(settings(node_dir)).restore()
    assert got.iteration == 1
    assert got.state is not None
    assert torch.equal(got.state["w"], torch.ones(100))
    assert sum("checksum" in r.getMessage() for r in caplog.records) == 1


def test_other_job_is_never_loaded(node_dir: pathlib.Path) -> None:
    lc = LocalCheckpoints(settings(node_dir, job_id="job-a"))
    lc.save(3, {"w": torch.ones(4)})
    lc.close()
    got = LocalCheckpoints(settings(node_dir, job_id="job-b")).restore(global_iteration=1)
    assert got.source is RestoreSource.GLOBAL
    assert got.state is None


def test_unsupported_value_skips_with_one_warning(
    node_dir: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    lc = LocalCheckpoints(settings(node_dir))
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.local_checkpoint"):
        assert not lc.save(1, {"f": object()})
        assert not lc.save(2, {"f": object()})
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1
    assert lc.save(3, {"ok": torch.ones(2)})
    lc.close()


def test_max_share_skips_and_keeps_training(node_dir: pathlib.Path) -> None:
    lc = LocalCheckpoints(settings(node_dir, max_share=1e-9))
    assert not lc.save(1, {"w": torch.ones(1 << 20)})
    assert lc.restore(global_iteration=None).source is RestoreSource.NONE
    lc.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_dir_skips(node_dir: pathlib.Path) -> None:
    node_dir.chmod(0o500)
    try:
        lc = LocalCheckpoints(settings(node_dir))
        assert not lc.save(1, {"w": torch.ones(4)})
        assert lc.restore(global_iteration=4).source is RestoreSource.GLOBAL
        lc.close()
    finally:
        node_dir.chmod(0o700)


def test_disabled_without_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NVRX_LOCAL_CKPT_DIR", raising=False)
    lc = LocalCheckpoints()
    assert not lc.enabled
    assert not lc.save(1, {"w": torch.ones(1)})
    assert not lc.maybe_save(1, {"w": torch.ones(1)})
    assert lc.restore(global_iteration=3).source is RestoreSource.GLOBAL
    assert lc.restore().source is RestoreSource.NONE
    lc.close()


def test_settings_from_env(node_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in settings(node_dir, every_n_steps=3).to_env().items():
        monkeypatch.setenv(k, v)
    lc = LocalCheckpoints()
    saved = [it for it in range(1, 10) if lc.maybe_save(it, {"w": torch.ones(1)}) and lc.wait(30)]
    assert saved == [3, 6, 9]
    lc.close()


def test_template_places_tensors_and_every_s(node_dir: pathlib.Path) -> None:
    lc = LocalCheckpoints(settings(node_dir, every_s=3600.0))
    assert not lc.maybe_save(1, {"w": torch.ones(1)})  # the hour has not passed
    assert lc.save(2, {"w": torch.ones(2), "n": 1})
    lc.close()
    template = {"w": torch.zeros(2, device="meta")}
    got = LocalCheckpoints(settings(node_dir)).restore(template)
    assert got.state is not None
    assert got.state["w"].device.type == "meta"


def test_unwritable_rank_dir_skips(node_dir: pathlib.Path) -> None:
    (node_dir / "local0").write_text("not a directory")  # works as root too
    lc = LocalCheckpoints(settings(node_dir))
    assert not lc.save(1, {"w": torch.ones(4)})
    assert lc.restore(global_iteration=4).source is RestoreSource.GLOBAL
    lc.close()


_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool]


def _leaves() -> Any:
    from hypothesis import strategies as st

    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**62), 2**62),
        st.floats(allow_nan=False),
        st.text(max_size=8),
        st.binary(max_size=8),
    )
    tensors = st.builds(
        lambda dtype, shape: torch.zeros(shape, dtype=dtype).random_(
            0, 2 if dtype == torch.bool else 100
        ),
        st.sampled_from(_DTYPES),
        st.lists(st.integers(0, 4), max_size=3),
    )
    return st.one_of(scalars, tensors)


@pytest.mark.timeout(180)
def test_tree_round_trip_property(node_dir: pathlib.Path) -> None:
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings
    from hypothesis import strategies as st

    states = st.dictionaries(
        st.text(min_size=1, max_size=5),
        st.recursive(
            _leaves(),
            lambda inner: st.one_of(
                st.lists(inner, max_size=3),
                st.lists(inner, max_size=3).map(tuple),
                st.dictionaries(
                    st.one_of(st.text(max_size=4), st.integers(-5, 5)), inner, max_size=3
                ),
            ),
            max_leaves=8,
        ),
        max_size=4,
    )
    lc = LocalCheckpoints(settings(node_dir))
    counter = iter(range(10**6))

    @hsettings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(states)
    def check(state: dict[str, Any]) -> None:
        it = next(counter)
        assert lc.save(it, state)
        assert lc.wait(30)
        got = lc.restore()
        assert got.iteration == it
        assert got.state is not None
        assert_same(state, got.state)

    check()
    lc.close()


def test_save_copies_now_across_layout_changes(node_dir: pathlib.Path) -> None:
    # The save reuses its layout and destination views while the tensors keep their
    # dtypes and shapes; it must still copy the values of the moment, follow a state
    # whose layout changes (grown slots are mapped again), and copy strided, conjugate
    # and grad-requiring tensors as they read.
    lc = LocalCheckpoints(settings(node_dir))
    w = torch.zeros(64, requires_grad=True)
    z = torch.complex(torch.arange(4.0), torch.ones(4)).conj()
    for it in range(6):
        with torch.no_grad():
            w.fill_(float(it))
        size = 1000 if it < 3 else 300_000  # grows past the slots' first size
        state = {
            "w": w,
            "z": z,
            "t": torch.arange(6.0).reshape(2, 3).t(),
            "big": torch.full((size,), it),
        }
        assert lc.save(it, state)
        expect = {k: v.detach().clone() for k, v in state.items()}
        with torch.no_grad():
            w.add_(100.0)  # after the call: not in the snapshot
        assert lc.wait(30)
        reader = LocalCheckpoints(settings(node_dir))
        got = reader.restore()
        reader.close()
        assert got.iteration == it
        assert got.state is not None
        assert_same(expect, got.state)
        assert not got.state["z"].is_conj()
    lc.close()


def test_slots_keep_their_allocation_as_the_manifest_grows(node_dir: pathlib.Path) -> None:
    # The manifest grows by a few bytes with the iteration's digits (9 -> 10 -> 100),
    # the wall time's and a plain value's: the slots are reused as allocated, not
    # allocated (and faulted in) again.
    lc = LocalCheckpoints(settings(node_dir))
    w = torch.randn(50_000)
    sizes = set()
    for it in (0, 1, 9, 10, 11, 99, 100, 101, 9999, 10000, 10001):
        assert lc.save(it, {"w": w, "step": it, "note": "x" * (it % 7)})
        assert lc.wait(30)
        sizes.add(tuple(os.stat(p).st_size for p in sorted((node_dir / "local0").iterdir())))
    lc.close()
    assert len(sizes) == 2, sizes  # slot 0 alone, then both: never grown again
