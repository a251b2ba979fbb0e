"""LocalCheckpointCallback + HierarchicalCheckpointIO with a real trainer and manager.

Fits run in this process on the CPU (a tiny model), or as subprocesses that are
SIGKILLed and resumed (local_ckpt_train.py), against the real
LocalCheckpointManager of nvrx-ft-core.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import pickle
import signal
import socket
import subprocess
import time
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch.utils.data import DataLoader, TensorDataset

from nvrx.ft.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
from nvrx.ptl import LOCAL_CKPT_OPTS_KEY
from nvrx.ptl.local_checkpoint_callback import (
    LOCAL_PATH_PREFIX,
    HierarchicalCheckpointIO,
    LocalCheckpointCallback,
)

from .conftest import PACKAGE_TESTS, Procs

pytestmark = pytest.mark.timeout(240)

SCRIPT = PACKAGE_TESTS / "local_ckpt_train.py"


class RecordingIO(HierarchicalCheckpointIO):
    """A HierarchicalCheckpointIO subclass (as NeMo's) that notes each local save."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.saved: list[tuple[int, float]] = []

    def _save_local_checkpoint(self, checkpoint: dict[str, Any], opts: Any) -> Any:
        self.saved.append((int(opts["iteration"]), time.monotonic()))
        return super()._save_local_checkpoint(checkpoint, opts)


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.trainer.global_step)
        x = torch.randn(4, 3, generator=gen)
        loss: torch.Tensor = self.layer(x).pow(2).mean()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.05)


class Pace(Callback):
    def __init__(self, step_s: float) -> None:
        self.step_s = step_s

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(self.step_s)


class StartStep(Callback):
    def __init__(self) -> None:
        self.start: int | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start = trainer.global_step


def fit(
    root: pathlib.Path,
    callbacks: list[Callback],
    io: HierarchicalCheckpointIO | None,
    max_steps: int,
    ckpt_path: str | None = None,
) -> tuple[pl.Trainer, Tiny]:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        callbacks=callbacks,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    if io is not None:
        io.checkpoint_io = trainer.strategy.checkpoint_io
        trainer.strategy.checkpoint_io = io
    model = Tiny()
    data = DataLoader(TensorDataset(torch.zeros(12, 1)), batch_size=2)
    trainer.fit(model, train_dataloaders=data, ckpt_path=ckpt_path)
    return trainer, model


def manager(tmp_path: pathlib.Path) -> LocalCheckpointManager:
    return LocalCheckpointManager(tmp_path / "local")


def test_saves_every_n_train_steps(tmp_path: pathlib.Path) -> None:
    mgr = manager(tmp_path)
    io = RecordingIO(None, mgr, None)
    fit(tmp_path, [LocalCheckpointCallback(every_n_train_steps=3)], io, max_steps=10)
    assert [it for it, _ in io.saved] == [3, 6, 9]
    assert LocalCheckpointManager(tmp_path / "local").find_latest() == 9


def test_saves_every_time_interval(tmp_path: pathlib.Path) -> None:
    io = RecordingIO(None, manager(tmp_path), None)
    callback = LocalCheckpointCallback(train_time_interval=timedelta(seconds=0.25))
    fit(tmp_path, [callback, Pace(0.05)], io, max_steps=24)
    times = [t for _, t in io.saved]
    assert 1 <= len(times) < 24
    assert all(b - a >= 0.25 for a, b in itertools.pairwise(times))
    # seconds as a plain number too (nvrx); both intervals at once is ModelCheckpoint's error
    assert LocalCheckpointCallback(train_time_interval=0.5)._local_every_s == 0.5
    with pytest.raises(Exception, match="mutually exclusive"):
        LocalCheckpointCallback(every_n_train_steps=2, train_time_interval=timedelta(seconds=1))


def test_launcher_environment_alone_is_enough(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No HierarchicalCheckpointIO and no interval given: both come from the launcher."""
    monkeypatch.setenv("NVRX_LOCAL_CKPT_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("NVRX_LOCAL_CKPT_JOB", "job-1")
    monkeypatch.setenv("NVRX_LOCAL_CKPT_EVERY_N_STEPS", "3")
    monkeypatch.setenv("NVRX_LOCAL_CKPT_EVERY_S", "3600")
    callback = LocalCheckpointCallback()
    assert (callback._local_every_n, callback._local_every_s) == (3, 3600.0)
    trainer, _ = fit(tmp_path, [callback], None, max_steps=7)
    # the callback's IO is gone again after the fit; the snapshot of step 6 stays
    assert not isinstance(trainer.strategy.checkpoint_io, HierarchicalCheckpointIO)
    assert any((tmp_path / "node").rglob("*.snap"))
    start = StartStep()
    trainer, _ = fit(tmp_path, [LocalCheckpointCallback(), start], None, max_steps=9)
    assert start.start == 6
    assert trainer.ckpt_path == f"{LOCAL_PATH_PREFIX}6"
    # without the launcher's environment: one warning, no snapshots, a plain fit
    monkeypatch.delenv("NVRX_LOCAL_CKPT_DIR")
    start = StartStep()
    fit(tmp_path / "other", [LocalCheckpointCallback(every_n_train_steps=1), start], None, 2)
    assert start.start == 0
    assert not (tmp_path / "other").exists() or not any((tmp_path / "other").rglob("*.snap"))


def _local_and_global(tmp_path: pathlib.Path, local_it: int, global_it: int) -> tuple[Any, str]:
    mgr = manager(tmp_path)
    io = HierarchicalCheckpointIO(TorchCheckpointIO(), mgr, None)
    local = {"src": "local", "global_step": local_it, "w": torch.arange(4.0)}
    io.save_checkpoint(local, None, storage_options={LOCAL_CKPT_OPTS_KEY: {"iteration": local_it}})
    path = str(tmp_path / f"epoch=0-step={global_it}.ckpt")
    io.save_checkpoint({"src": "global", "global_step": global_it}, path)  # to the wrapped IO
    return io, path


@pytest.mark.parametrize(("global_it", "want"), [(4, "local"), (6, "local"), (8, "global")])
def test_io_loads_local_when_as_new_or_newer(
    tmp_path: pathlib.Path, global_it: int, want: str
) -> None:
    _io, path = _local_and_global(tmp_path, 6, global_it)
    fresh = HierarchicalCheckpointIO(TorchCheckpointIO(), manager(tmp_path), None)  # a new run
    assert fresh.load_checkpoint(path)["src"] == want  # iteration from the file name
    by_fn = HierarchicalCheckpointIO(TorchCheckpointIO(), manager(tmp_path), lambda p: global_it)
    loaded = by_fn.load_checkpoint(path)
    assert loaded["src"] == want
    if want == "local":
        assert torch.equal(loaded["w"], torch.arange(4.0))
    # a name without step=N: the global step is read from the checkpoint itself
    renamed = tmp_path / "plain.ckpt"
    os.rename(path, renamed)
    fresh = HierarchicalCheckpointIO(TorchCheckpointIO(), manager(tmp_path), None)
    assert fresh.load_checkpoint(str(renamed))["src"] == want


def test_io_routes_saves_and_refuses_a_local_path(tmp_path: pathlib.Path) -> None:
    io = HierarchicalCheckpointIO(TorchCheckpointIO(), manager(tmp_path), lambda p: 0)
    with pytest.raises(ValueError, match="Path shouldn't be set"):
        io.save_checkpoint(
            {"a": 1}, "x.ckpt", storage_options={LOCAL_CKPT_OPTS_KEY: {"iteration": 1}}
        )
    assert io.latest_local_iteration() == -1
    partial = HierarchicalCheckpointIO.get_partial_wrapper_constructor(manager(tmp_path), None)
    assert isinstance(partial(TorchCheckpointIO()), HierarchicalCheckpointIO)


def test_fit_without_path_resumes_from_local_and_state_is_identical(tmp_path: pathlib.Path) -> None:
    _, straight = fit(
        tmp_path / "a",
        [LocalCheckpointCallback(every_n_train_steps=1)],
        HierarchicalCheckpointIO(None, manager(tmp_path / "a"), None),
        max_steps=9,
    )
    io = HierarchicalCheckpointIO(None, manager(tmp_path / "b"), None)
    fit(tmp_path / "b", [LocalCheckpointCallback(every_n_train_steps=5)], io, max_steps=5)
    start = StartStep()
    trainer, resumed = fit(
        tmp_path / "b",
        [LocalCheckpointCallback(every_n_train_steps=5), start],
        HierarchicalCheckpointIO(None, manager(tmp_path / "b"), None),
        max_steps=9,
    )
    assert start.start == 5
    assert trainer.ckpt_path == f"{LOCAL_PATH_PREFIX}5"
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    # off: a fit without a path starts from scratch
    start = StartStep()
    fit(
        tmp_path / "b",
        [LocalCheckpointCallback(every_n_train_steps=5, resume_without_path=False), start],
        HierarchicalCheckpointIO(None, manager(tmp_path / "b"), None),
        max_steps=2,
    )
    assert start.start == 0


class EveryRankStrategy(SingleDeviceStrategy):
    """Calls the CheckpointIO itself on every rank, as NeMo's MegatronStrategy does."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)


class NemoStyleIO(HierarchicalCheckpointIO):
    """Shaped like NeMo's MCoreHierarchicalCheckpointIO: its own __init__ and conversions."""

    def __init__(
        self,
        wrapped_checkpoint_io: Any,
        local_ckpt_manager: Any,
        get_global_ckpt_iteration_fn: Any,
        async_save: bool = False,
        local_ckpt_algo: str = "fully_parallel",
    ) -> None:
        super().__init__(
            wrapped_checkpoint_io, local_ckpt_manager, get_global_ckpt_iteration_fn, async_save
        )
        self.local_ckpt_algo = local_ckpt_algo
        self.conversions: list[str] = []

    def to_tensor_aware_state_dict(self, checkpoint: dict[str, Any]) -> Any:
        self.conversions.append("to")
        return super().to_tensor_aware_state_dict(checkpoint)

    def from_tensor_aware_state_dict(  # type: ignore[override]  # NeMo's signature
        self, tensor_aware_checkpoint: Any, sharded_state_dict: Any = None, strict: Any = None
    ) -> Any:
        self.conversions.append("from")
        return super().from_tensor_aware_state_dict(tensor_aware_checkpoint)


def test_nemo_style_set_up_with_a_strategy_that_saves_on_every_rank(
    tmp_path: pathlib.Path,
) -> None:
    """NeMo's update_trainer_local_checkpoint_io, with only the import prefix changed."""

    def run(max_steps: int, ckpt_path: str | None, start: StartStep) -> NemoStyleIO:
        trainer = pl.Trainer(
            strategy=EveryRankStrategy(device=torch.device("cpu")),
            max_steps=max_steps,
            callbacks=[LocalCheckpointCallback(every_n_train_steps=2), start],
            default_root_dir=tmp_path,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        assert any(isinstance(cb, LocalCheckpointCallback) for cb in trainer.callbacks)  # type: ignore[attr-defined]
        manager = LocalCheckpointManager(f"{tmp_path}/local_ckpt/{socket.gethostname()}")
        io = NemoStyleIO(trainer.strategy.checkpoint_io, manager, lambda path: 0)
        trainer.strategy.checkpoint_io = io
        data = DataLoader(TensorDataset(torch.zeros(12, 1)), batch_size=2)
        trainer.fit(Tiny(), train_dataloaders=data, ckpt_path=ckpt_path)
        return io

    io = run(4, None, StartStep())
    assert io.conversions == ["to", "to"]
    TorchCheckpointIO().save_checkpoint({"global_step": 0}, str(tmp_path / "global.ckpt"))
    start = StartStep()
    io = run(6, str(tmp_path / "global.ckpt"), start)  # NVRx's example: lambda s: 0
    assert start.start == 4
    assert io.conversions == ["from", "to"]


def test_no_pickle_on_the_local_path(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle used on the local snapshot path")

    for name in ("dumps", "dump", "loads", "load"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(pickle, "Pickler", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "save", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    io = RecordingIO(None, manager(tmp_path), None)
    fit(tmp_path, [LocalCheckpointCallback(every_n_train_steps=2)], io, max_steps=6)
    assert [it for it, _ in io.saved] == [2, 4, 6]
    start = StartStep()
    fit(
        tmp_path,
        [LocalCheckpointCallback(every_n_train_steps=2), start],
        HierarchicalCheckpointIO(None, manager(tmp_path), None),
        max_steps=8,
    )
    assert start.start == 6


def newest_snapshot(root: pathlib.Path) -> tuple[pathlib.Path, dict[str, Any]]:
    """The snapshot file of the highest iteration under root, with its JSON manifest."""
    found: list[tuple[int, pathlib.Path, dict[str, Any]]] = []
    for path in root.rglob("*.snap"):
        raw = path.read_bytes()
        try:
            text = raw[raw.index(b'{"') :].decode("utf-8", "replace")
            man, _ = json.JSONDecoder().raw_decode(text)
            found.append((man["iteration"], path, man))
        except (ValueError, KeyError):  # spoiled by a test
            continue
    assert found, f"no snapshot under {root}"
    _, path, man = max(found, key=lambda f: f[0])
    return path, man


class SpoiledAfterAgreement(HierarchicalCheckpointIO):
    """Breaks the agreed snapshot's manifest between find_latest and load."""

    def latest_local_iteration(self) -> int:
        iteration = super().latest_local_iteration()
        if iteration >= 0:
            path, _ = newest_snapshot(self.local_ckpt_manager.root)  # type: ignore[attr-defined]
            data = bytearray(path.read_bytes())
            at = data.index(b'{"')
            data[at : at + 16] = b"\xff" * 16
            path.write_bytes(bytes(data))
        return iteration


def test_a_snapshot_that_fails_to_load_is_not_used(tmp_path: pathlib.Path) -> None:
    io = HierarchicalCheckpointIO(None, manager(tmp_path), None)
    fit(tmp_path, [LocalCheckpointCallback(every_n_train_steps=3)], io, max_steps=6)
    start = StartStep()
    trainer, _ = fit(
        tmp_path,
        [LocalCheckpointCallback(every_n_train_steps=3), start],
        SpoiledAfterAgreement(None, manager(tmp_path), None),
        max_steps=7,
    )
    assert start.start == 0  # a fresh start, not a failed fit
    assert trainer.ckpt_path is None
    # with a global checkpoint given, the global one is loaded instead
    global_path = str(tmp_path / "step=2.ckpt")
    TorchCheckpointIO().save_checkpoint({"src": "global", "global_step": 2}, global_path)
    spoiled = SpoiledAfterAgreement(TorchCheckpointIO(), manager(tmp_path), None)
    assert spoiled.load_checkpoint(global_path)["src"] == "global"


def test_a_bad_snapshot_is_skipped(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    io = HierarchicalCheckpointIO(None, manager(tmp_path), None)
    fit(tmp_path, [LocalCheckpointCallback(every_n_train_steps=2)], io, max_steps=6)
    # flip the tensor bytes of the newest snapshot; the manifest and the preamble stay
    # intact, so only checksums can tell
    path, man = newest_snapshot(tmp_path / "local")
    assert man["iteration"] == 6
    data = bytearray(path.read_bytes())
    for _dtype, _shape, offset, nbytes, *_ in man["tensors"]:
        data[offset : offset + nbytes] = bytes(b ^ 0x5A for b in data[offset : offset + nbytes])
    path.write_bytes(bytes(data))
    start = StartStep()
    fit(
        tmp_path,
        [LocalCheckpointCallback(every_n_train_steps=2), start],
        HierarchicalCheckpointIO(None, manager(tmp_path), None),
        max_steps=8,
    )
    assert start.start == 4  # the older snapshot, not the corrupt one (nor a fresh start)
    assert any(r.levelname == "WARNING" and "local" in r.name for r in caplog.records)


# -- a real crash: SIGKILL, then a new process resumes --------------------------------


def run_script(
    procs: Procs, cfg: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 120.0
) -> tuple[int, str]:
    proc = procs.python([str(SCRIPT), json.dumps(cfg)], env=env)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"training did not finish in {timeout} s:\n{out}") from None
    return proc.returncode, out


def records(out: str, kind: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[len(kind) + 1 :])
        for line in out.splitlines()
        if line.startswith(kind + " ")
    ]


BASE = {"max_steps": 12, "every": 1, "global_every": 4}


@pytest.fixture(scope="module")
def unfaulted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The RESULT of the script's run without a fault."""
    tmp = tmp_path_factory.mktemp("unfaulted")
    procs = Procs()
    try:
        cfg = {**BASE, "manager_dir": str(tmp / "local"), "global_dir": str(tmp / "global")}
        rc, out = run_script(procs, cfg)
    finally:
        procs.cleanup()
    assert rc == 0, out
    (result,) = records(out, "RESULT")
    return result


@pytest.mark.parametrize("with_path", [False, True])
def test_sigkilled_fit_resumes_from_local_snapshot(
    tmp_path: pathlib.Path, procs: Procs, unfaulted: dict[str, Any], with_path: bool
) -> None:
    want = unfaulted
    cfg = {**BASE, "manager_dir": str(tmp_path / "b"), "global_dir": str(tmp_path / "gb")}
    rc, out = run_script(procs, {**cfg, "kill_at": 7})
    assert rc == -signal.SIGKILL, out
    assert not records(out, "RESULT")
    assert (tmp_path / "gb" / "step=4.ckpt").exists()
    resume = {**cfg, "ckpt_path": str(tmp_path / "gb" / "step=4.ckpt")} if with_path else cfg
    rc, out = run_script(procs, resume, env={"TORCHELASTIC_RESTART_COUNT": "1"})
    assert rc == 0, out
    (start,) = records(out, "START")
    assert start["global_step"] in (6, 7), out  # the newest complete snapshot, not step 4
    assert start["ckpt_path"] == f"{LOCAL_PATH_PREFIX}{start['global_step']}" or with_path
    (got,) = records(out, "RESULT")
    assert got == want  # weights, Adam moments, lr: bit for bit


def run_ranks(
    procs: Procs,
    cfg: dict[str, Any],
    launcher: list[str],
    env: dict[str, str],
    timeout: float = 200.0,
) -> tuple[int, str]:
    args = [
        *launcher,
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--monitor-interval=0.2",
        str(SCRIPT),
        json.dumps(cfg),
    ]
    proc = procs.python(args, env={"OMP_NUM_THREADS": "1", **env})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the job did not finish in {timeout} s:\n{out}") from None
    return proc.returncode, out


def test_ddp_job_restarted_by_ft_launcher_resumes_from_a_local_snapshot(
    tmp_path: pathlib.Path, procs: Procs, unfaulted: dict[str, Any]
) -> None:
    """ft_launcher's --local-ckpt-* options; the script has no path logic at all.

    Two DDP ranks (gloo) see identical data, so their weights equal the single-process
    run's; rank 1 is SIGKILLed after step 7's snapshot and ft_launcher restarts both.
    (torch's own launcher cannot restart a Lightning DDP job here: the restarted ranks
    read the dead ranks' gloo addresses from the reused store.)
    """
    base = tmp_path / "shm"
    base.mkdir()
    cfg = {"max_steps": 12, "kill_at": 7, "kill_rank": 1}
    launcher = [
        "-m",
        "nvrx.launcher",
        f"--local-ckpt-dir={base}",
        "--local-ckpt-every-n-steps=1",
        f"--ft-journal={tmp_path / 'journal.jsonl'}",
    ]
    rc, out = run_ranks(procs, cfg, launcher, {})
    assert rc == 0, out
    # The manager's restore record reached the launcher's journal: cycle 1 from own memory.
    journal = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    restored = [r for r in journal if r["event"] == "checkpoint_restored"]
    assert [(r["cycle"], r["source"]) for r in restored if r["cycle"] == 1] == [(1, "own")], (
        restored
    )
    assert restored[-1]["iteration"] in (6, 7), restored
    starts = {r["rank"]: r for r in records(out, "START")}
    results = {r["rank"]: r for r in records(out, "RESULT")}
    assert sorted(results) == [0, 1], out
    resumed = [r for r in records(out, "START") if r["global_step"] > 0]
    assert {r["rank"] for r in resumed} == {0, 1}, out
    assert all(r["global_step"] in (6, 7) for r in resumed), out
    assert starts[0]["ckpt_path"].startswith(LOCAL_PATH_PREFIX)
    for rank in (0, 1):
        got = results[rank]
        assert got["global_step"] == unfaulted["global_step"]
        assert got["params"] == unfaulted["params"], f"rank {rank}"
        assert got["opt_state"] == unfaulted["opt_state"], f"rank {rank}"
    # the launcher removed the job's snapshots when it ended successfully
    assert not [p for p in base.rglob("*") if p.is_file()], list(base.rglob("*"))


def test_codec_round_trip_of_what_a_lightning_checkpoint_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import collections
    import enum

    import numpy as np

    from nvrx.ptl._local_ckpt_codec import decode, encode

    class Stage(str, enum.Enum):
        TRAIN = "train"

    checkpoint = {
        "state_dict": collections.OrderedDict(w=torch.nn.Parameter(torch.ones(2))),
        "optimizer_states": [
            {
                "state": {0: {"step": torch.tensor(3.0)}},
                "param_groups": [{"betas": (0.9, 0.99), "params": [0]}],
            }
        ],
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"kth_value": float("inf")}},
        "paths": pathlib.Path("/x"),
        "dtype": torch.float16,
        "stage": Stage.TRAIN,
        "np": [np.float32(1.5), np.arange(3)],
        "__nvrx__": "a key that looks like our tag",
        "hyper_parameters": {"cfg": object()},
    }
    with caplog.at_level("WARNING"):
        out = decode(encode(checkpoint))
    assert torch.equal(out["state_dict"]["w"], torch.ones(2))
    assert out["optimizer_states"][0]["state"][0]["step"].item() == 3.0
    assert out["optimizer_states"][0]["param_groups"][0]["betas"] == (0.9, 0.99)
    assert out["callbacks"]["ModelCheckpoint{'monitor': None}"]["kth_value"] == float("inf")
    assert out["paths"] == pathlib.Path("/x")
    assert out["dtype"] is torch.float16
    assert out["stage"] == "train"
    assert out["np"][0] == 1.5
    assert list(out["np"][1]) == [0, 1, 2]
    assert out["__nvrx__"] == "a key that looks like our tag"
    assert out["hyper_parameters"] == {"cfg": None}
    assert "cfg" in caplog.text  # named in the warning
