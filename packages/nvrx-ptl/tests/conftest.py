"""Shared helpers for the nvrx-ptl tests: free ports and processes that are always reaped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

PACKAGE_TESTS = Path(__file__).resolve().parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Procs:
    """Starts subprocesses and kills any that are still running at the end of the test."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def python(
        self, args: list[str], env: dict[str, str] | None = None, **kwargs: object
    ) -> subprocess.Popen[str]:
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        proc = subprocess.Popen(  # type: ignore[call-overload]
            [sys.executable, *args],
            env=full_env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kwargs,
        )
        self.started.append(proc)
        return proc  # type: ignore[no-any-return]

    def cleanup(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)


@pytest.fixture
def procs() -> Iterator[Procs]:
    """Subprocess starter; every process it started is killed and reaped afterwards."""
    p = Procs()
    try:
        yield p
    finally:
        p.cleanup()


TRAIN_SCRIPT = PACKAGE_TESTS / "ptl_train.py"


class Monitor:
    """A real rank monitor (``RankMonitorServer``) for a single-process training."""

    def __init__(self, cfg_kwargs: dict[str, object]) -> None:
        from nvrx.ft import FaultToleranceConfig, RankMonitorServer, create_runtime_dir

        self.runtime_dir = create_runtime_dir("nvrx-ptl-test-")
        self.socket_path = self.runtime_dir / "monitor-0.sock"
        self.events_path = self.runtime_dir / "events.sock"
        self.events = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.events.bind(str(self.events_path))
        self.cfg = FaultToleranceConfig.from_kwargs(False, **cfg_kwargs)
        self.process = RankMonitorServer.run_in_subprocess(
            self.cfg, self.socket_path, events_socket=self.events_path
        )
        self.process.wait_ready(timeout=60.0)

    @property
    def env(self) -> dict[str, str]:
        """What a rank needs to find this monitor."""
        from nvrx.ft import MONITOR_SOCKET_ENV

        return {MONITOR_SOCKET_ENV: str(self.socket_path)}

    def events_seen(self) -> list[dict[str, object]]:
        """The JSON events the monitor sent so far."""
        import json

        out = []
        self.events.setblocking(False)
        try:
            while True:
                out.append(json.loads(self.events.recv(65536)))
        except BlockingIOError:
            pass
        return out

    def close(self) -> None:
        import shutil

        self.process.stop(timeout=10.0)
        self.events.close()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


@pytest.fixture
def make_monitor() -> Iterator[Callable[..., Monitor]]:
    """Start real monitors; each is stopped and its runtime dir removed afterwards."""
    started: list[Monitor] = []

    def make(**cfg_kwargs: object) -> Monitor:
        monitor = Monitor(cfg_kwargs)
        started.append(monitor)
        return monitor

    try:
        yield make
    finally:
        for monitor in started:
            monitor.close()


def run_training(
    procs: Procs, cfg: dict[str, object], env: dict[str, str], timeout: float = 150.0
) -> tuple[int, str]:
    """Run ptl_train.py once in a single process; return (exit code, output)."""
    import json

    proc = procs.python([str(TRAIN_SCRIPT), json.dumps(cfg)], env=env)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"training did not finish in {timeout} s:\n{out}") from None
    return proc.returncode, out


def probes(out: str, what: str) -> list[dict[str, object]]:
    """The PROBE records of one kind printed by ptl_train.py."""
    import json

    found = []
    for line in out.splitlines():
        if line.startswith("PROBE "):
            record = json.loads(line[len("PROBE ") :])
            if record["what"] == what:
                found.append(record)
    return found


def run_torchrun(
    procs: Procs, cfg: dict[str, object], nproc: int = 2, timeout: float = 240.0
) -> tuple[int, str]:
    """Run ptl_train.py as ``nproc`` DDP ranks (gloo) under torch's own launcher."""
    import json

    args = [
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--monitor-interval=0.2",
        str(TRAIN_SCRIPT),
        json.dumps(cfg),
    ]
    proc = procs.python(args, env={"OMP_NUM_THREADS": "1"})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"torchrun did not finish in {timeout} s:\n{out}") from None
    return proc.returncode, out


def results(out: str) -> dict[int, dict[str, object]]:
    """The RESULT record of each rank, by rank."""
    import json

    found = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            record = json.loads(line[len("RESULT ") :])
            found[int(record["rank"])] = record
    return found


def run_ft_launcher(
    procs: Procs,
    cfg: dict[str, object],
    launcher_args: list[str],
    env: dict[str, str] | None = None,
    nproc: int = 2,
    timeout: float = 240.0,
) -> tuple[int, str]:
    """Run ptl_train.py as ``nproc`` DDP ranks (gloo) under ft_launcher."""
    import json

    args = [
        "-m",
        "nvrx.launcher",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--monitor-interval=0.2",
        *launcher_args,
        str(TRAIN_SCRIPT),
        json.dumps(cfg),
    ]
    proc = procs.python(args, env={"OMP_NUM_THREADS": "1", **(env or {})})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"ft_launcher did not finish in {timeout} s:\n{out}") from None
    return proc.returncode, out


def tiny_fit(
    root: Path,
    callbacks: list[object],
    max_steps: int = 4,
    ckpt_path: str | None = None,
    logger: object = False,
    ckpt_dir: Path | None = None,
    ckpt_every: int = 2,
    model: object = None,
    step_s: float = 0.0,
) -> object:
    """Fit a tiny model in this process (Lightning is imported already: fast).

    ``step_s``: each step lasts at least that long (a sleep after the batch), so a fit
    of N steps outlasts a report interval however fast the machine; unpaced, a step of
    this model takes 0.3-2 ms.
    """
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Pace(pl.Callback):
        def on_train_batch_end(self, *args: object) -> None:
            time.sleep(step_s)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.layer(batch[0]).pow(2).mean()
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    from lightning.pytorch.callbacks import ModelCheckpoint

    if ckpt_dir is not None:
        callbacks = [
            *callbacks,
            ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=ckpt_every),
        ]
    if step_s > 0:
        callbacks = [*callbacks, Pace()]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        callbacks=callbacks,  # type: ignore[arg-type]
        default_root_dir=root,
        logger=logger,  # type: ignore[arg-type]
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = DataLoader(TensorDataset(torch.randn(32, 2)), batch_size=4)
    trainer.fit(model or Tiny(), train_dataloaders=data, ckpt_path=ckpt_path)  # type: ignore[arg-type]
    return trainer


def run_ddp(procs: Procs, cfg: dict[str, object], nproc: int = 2) -> tuple[int, str]:
    """Run ptl_train.py on ``nproc`` DDP ranks under ft_launcher, or torchrun without it."""
    import importlib.util

    if importlib.util.find_spec("nvrx.launcher") is not None:
        return run_ft_launcher(procs, cfg, ["--max-restarts=0"], nproc=nproc)
    return run_torchrun(procs, cfg, nproc=nproc)
