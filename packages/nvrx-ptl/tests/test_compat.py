"""nvrx.ptl imports without Lightning and finds whichever Lightning flavour is installed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .conftest import Procs


def _run(procs: Procs, code: str, env: dict[str, str] | None = None) -> str:
    proc = procs.python(["-c", textwrap.dedent(code)], env=env)
    out, _ = proc.communicate(timeout=100)
    assert proc.returncode == 0, out
    return out


@pytest.mark.timeout(120)
def test_import_without_lightning_then_clear_error(procs: Procs) -> None:
    out = _run(
        procs,
        """
        import sys
        sys.modules["lightning"] = None          # as if not installed
        sys.modules["pytorch_lightning"] = None
        import nvrx.ptl
        params = nvrx.ptl.SimulatedFaultParams("rank_killed", 1.0)
        try:
            nvrx.ptl.FaultToleranceCallback
        except ImportError as exc:
            print("ERROR:", exc)
        """,
    )
    message = next(line for line in out.splitlines() if line.startswith("ERROR:"))
    assert "'lightning'" in message
    assert "'pytorch_lightning'" in message


@pytest.mark.timeout(150)
def test_env_var_selects_pytorch_lightning_and_a_fit_works(procs: Procs, tmp_path: Path) -> None:
    out = _run(
        procs,
        f"""
        import logging, time, torch, pytorch_lightning as pl
        logging.basicConfig(level=logging.INFO)
        from torch.utils.data import DataLoader, TensorDataset
        from nvrx.ptl import FaultToleranceCallback, StragglerDetectionCallback

        class Tiny(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)
            def training_step(self, batch, batch_idx):
                time.sleep(0.001)  # 300 steps outlast several report intervals
                return self.layer(batch[0]).pow(2).mean()
            def validation_step(self, batch, batch_idx):
                pass
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        straggler = StragglerDetectionCallback(report_time_interval=0.05)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=300, logger=False,
                             callbacks=[straggler], default_root_dir={str(tmp_path)!r},
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        data = DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=4)
        trainer.fit(Tiny(), data)
        # FT is inert outside fit, so validate needs no monitor
        ft = FaultToleranceCallback(autoresume=False, calculate_timeouts=True)
        pl.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[ft],
                   enable_progress_bar=False, enable_model_summary=False).validate(Tiny(), data)
        print("PL", issubclass(FaultToleranceCallback, pl.Callback), trainer.global_step,
              straggler.initialized)
        """,
        env={"NVRX_PTL_LIGHTNING": "pytorch_lightning"},
    )
    assert "PL True 300 False" in out
    assert "Straggler detection started" in out
    assert "Section 'train_step' relative performance" in out


def test_lightning_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning.pytorch

    from nvrx.ptl import FaultToleranceSectionsCallback
    from nvrx.ptl._compat import lightning_module

    monkeypatch.delenv("NVRX_PTL_LIGHTNING", raising=False)
    assert lightning_module() is lightning.pytorch
    assert issubclass(FaultToleranceSectionsCallback, lightning.pytorch.Callback)


def test_bad_env_var_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from nvrx.ptl._compat import lightning_module

    monkeypatch.setenv("NVRX_PTL_LIGHTNING", "keras")
    with pytest.raises(ValueError, match="NVRX_PTL_LIGHTNING='keras'"):
        lightning_module()


def test_unknown_attribute() -> None:
    import nvrx.ptl

    with pytest.raises(AttributeError, match="NoSuchCallback"):
        nvrx.ptl.NoSuchCallback  # noqa: B018


def test_nvrx_module_paths_port_by_prefix() -> None:
    """Every NVRx import path works with nvidia_resiliency_ext.ptl_resiliency -> nvrx.ptl."""
    import importlib

    import nvrx.ptl

    for module, name in [
        ("fault_tolerance_callback", "FaultToleranceCallback"),
        ("fault_tolerance_callback", "SimulatedFaultParams"),
        ("fault_tolerance_sections_callback", "FaultToleranceSectionsCallback"),
        ("straggler_det_callback", "StragglerDetectionCallback"),
    ]:
        found = getattr(importlib.import_module(f"nvrx.ptl.{module}"), name)
        assert found is getattr(nvrx.ptl, name), (module, name)


def test_default_loggers_are_nvrx_nemo_names_and_logger_name_overrides() -> None:
    from nvrx.ptl import (
        FaultToleranceCallback,
        FaultToleranceSectionsCallback,
        StragglerDetectionCallback,
    )

    ft = FaultToleranceCallback(autoresume=False, calculate_timeouts=True)
    sections = FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=True)
    straggler = StragglerDetectionCallback(300, True, True, 5, 0.7, 0.7, True, True)
    assert ft.logger.name == "nemo_logger.FaultToleranceCallback"
    assert sections.logger.name == "nemo_logger.FaultToleranceCallback"
    assert straggler.logger.name == "nemo_logger.StragglerDetectionCallback"
    unnamed = FaultToleranceSectionsCallback(
        autoresume=False, calculate_timeouts=True, logger_name=None
    )
    assert unnamed.logger.name == "nemo_logger.FaultToleranceCallback"
    mine = FaultToleranceCallback(
        autoresume=False, calculate_timeouts=True, logger_name="nvrx.ptl.FaultToleranceCallback"
    )
    assert mine.logger.name == "nvrx.ptl.FaultToleranceCallback"
    mine_straggler = StragglerDetectionCallback(
        300,
        True,
        True,
        5,
        0.7,
        0.7,
        True,
        True,
        logger_name="my.straggler",
    )
    assert mine_straggler.logger.name == "my.straggler"


def test_nvrx_class_attributes() -> None:
    from nvrx.ptl import FaultToleranceCallback, FaultToleranceSectionsCallback

    assert FaultToleranceCallback.TIMEOUTS_FILENAME == "_ft_state.json"
    assert FaultToleranceSectionsCallback.TIMEOUTS_FILENAME == "_ft_state_.json"
    assert FaultToleranceCallback.FT_DIR_NAME == "ft_state"
    assert FaultToleranceSectionsCallback.FT_DIR_NAME == "ft_state"


def test_hooks_accept_nvrx_call_shapes() -> None:
    """NVRx defines most FT hooks as ``(*args, **kwargs)``: every shape a caller may use
    (Lightning 2's, pytorch_lightning 1.x's extra ``dataloader_idx``, keywords) is taken."""
    import lightning.pytorch as pl

    from nvrx.ptl import FaultToleranceCallback, FaultToleranceSectionsCallback

    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    module = pl.LightningModule()
    ft = FaultToleranceCallback(autoresume=False, calculate_timeouts=True)
    for hook in (
        "on_train_start",
        "on_train_end",
        "on_validation_start",
        "on_validation_end",
        "on_train_batch_end",
        "on_validation_batch_end",
        "on_save_checkpoint",
        "on_load_checkpoint",
    ):
        method = getattr(ft, hook)
        method()
        method(trainer, module)
        method(trainer, module, {"loss": 1.0}, [1], 0, 0)
        method(trainer=trainer, pl_module=module, outputs=None, batch=[1], batch_idx=0)
    sections = FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=True)
    sections.on_train_batch_start()
    sections.on_train_batch_start(trainer, module, [1], 0, 0)
    sections.on_validation_batch_start(trainer, module, [1], 0, 0)
    sections.on_load_checkpoint(trainer, module, {})
    sections.on_train_batch_end(trainer, module, None, [1], 0)
    sections.on_train_batch_end(trainer=trainer)
    sections.on_save_checkpoint(trainer, module, {})
    sections.on_save_checkpoint(trainer=trainer, checkpoint={})
    sections.on_exception(trainer, module, exc=RuntimeError("x"))
    ft.on_exception(trainer, module, exception=RuntimeError("x"))
    assert not ft.is_initialized
    assert not sections.is_initialized


@pytest.mark.timeout(120)
def test_unreachable_monitor_is_a_rank_monitor_client_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in NVRx, no reachable monitor is RankMonitorClientError (from setup)."""
    from nvrx.ft import RankMonitorClientError
    from nvrx.ptl import FaultToleranceCallback, FaultToleranceSectionsCallback

    from .conftest import tiny_fit

    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(tmp_path / "no-monitor.sock"))
    # The client waits 5 s for a (re)starting monitor before it gives up; 0.2 s does here.
    monkeypatch.setattr("nvrx.ft.client._CONNECT_RETRY_S", 0.2)
    for callback in (
        FaultToleranceCallback(autoresume=False, calculate_timeouts=True),
        FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=True),
    ):
        with pytest.raises(RankMonitorClientError, match=r"no-monitor\.sock"):
            tiny_fit(tmp_path, [callback])
        assert not callback.is_initialized


@pytest.mark.timeout(120)
@pytest.mark.parametrize("save_last", [True, False, "link"])
def test_save_last_checkpoint_uses_the_callbacks_own_last_when_it_can(
    tmp_path: Path, save_last: object
) -> None:
    """The only Lightning private names nvrx.ptl touches: ModelCheckpoint's
    ``_monitor_candidates`` and ``_save_last_checkpoint`` (with ``save_last=True``)."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from nvrx.ptl._compat import save_last_checkpoint

    from .conftest import tiny_fit

    saved: list[str | None] = []

    class SaveAtStep3(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
            if trainer.global_step == 3:
                saved.append(save_last_checkpoint(trainer, trainer.checkpoint_callback))

    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=save_last, save_top_k=0)  # type: ignore[arg-type]
    tiny_fit(tmp_path, [SaveAtStep3(), ckpt], max_steps=4)
    name = "last.ckpt" if save_last is True else "last-straggler-stop-step=3.ckpt"
    assert saved == [str(tmp_path / "ckpt" / name)]
    assert (tmp_path / "ckpt" / name).is_file()
