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
        import logging, torch, pytorch_lightning as pl
        logging.basicConfig(level=logging.INFO)
        from torch.utils.data import DataLoader, TensorDataset
        from nvrx.ptl import FaultToleranceCallback, StragglerDetectionCallback

        class Tiny(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)
            def training_step(self, batch, batch_idx):
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
