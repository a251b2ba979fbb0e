"""nvrx.ptl imports without Lightning and finds whichever Lightning flavour is installed."""

from __future__ import annotations

import textwrap

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


@pytest.mark.timeout(120)
def test_env_var_selects_pytorch_lightning(procs: Procs) -> None:
    out = _run(
        procs,
        """
        import pytorch_lightning, lightning.pytorch
        from nvrx.ptl import FaultToleranceCallback, StragglerDetectionCallback
        print("PL", issubclass(FaultToleranceCallback, pytorch_lightning.Callback),
              issubclass(StragglerDetectionCallback, pytorch_lightning.Callback),
              issubclass(FaultToleranceCallback, lightning.pytorch.Callback))
        """,
        env={"NVRX_PTL_LIGHTNING": "pytorch_lightning"},
    )
    assert "PL True True False" in out


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
