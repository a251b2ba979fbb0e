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


@pytest.mark.timeout(120)
def test_lightning_is_the_default(procs: Procs) -> None:
    out = _run(
        procs,
        """
        import lightning.pytorch
        from nvrx.ptl import FaultToleranceSectionsCallback
        print("L", issubclass(FaultToleranceSectionsCallback, lightning.pytorch.Callback))
        """,
    )
    assert "L True" in out


@pytest.mark.timeout(120)
def test_bad_env_var_names_itself(procs: Procs) -> None:
    out = _run(
        procs,
        """
        import nvrx.ptl
        try:
            nvrx.ptl.FaultToleranceCallback
        except ValueError as exc:
            print("ERROR:", exc)
        """,
        env={"NVRX_PTL_LIGHTNING": "keras"},
    )
    assert "NVRX_PTL_LIGHTNING='keras'" in out


def test_unknown_attribute() -> None:
    import nvrx.ptl

    with pytest.raises(AttributeError, match="NoSuchCallback"):
        nvrx.ptl.NoSuchCallback  # noqa: B018
