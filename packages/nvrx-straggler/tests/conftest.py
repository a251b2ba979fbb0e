"""Shared fixtures: start gloo ranks as real subprocesses and always reap them.

Nothing here imports torch at collection: test_hotpath_parity.py runs without it.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

WORKER = pathlib.Path(__file__).with_name("dist_worker.py")

RunRanks = Callable[..., list[dict[str, Any]]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    scenario: str, world: int, out: pathlib.Path, timeout: float = 120.0, **params: Any
) -> list[dict[str, Any]]:
    """Run ``dist_worker.py SCENARIO`` on ``world`` gloo ranks; return each rank's JSON.

    Every process is killed and reaped before this returns, whatever happens.
    """
    procs: list[subprocess.Popen[bytes]] = []
    port = _free_port()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    try:
        for rank in range(world):
            with open(out / f"rank{rank}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(WORKER),
                            scenario,
                            str(rank),
                            str(world),
                            str(port),
                            str(out),
                            json.dumps(params),
                        ],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        text = "\n".join(
            f"--- rank {i} (rc={procs[i].returncode})\n"
            + (out / f"rank{i}.log").read_text()[-3000:]
            for i in failed
        )
        raise AssertionError(f"ranks {failed} failed:\n{text}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture
def run_ranks(tmp_path: pathlib.Path) -> RunRanks:
    """``run_ranks(scenario, world, **params)``: see :func:`launch`."""

    def run(scenario: str, world: int, **params: Any) -> list[dict[str, Any]]:
        return launch(scenario, world, tmp_path / scenario, **params)

    return run


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The ``two_ranks`` scenario on two gloo ranks, run once per test module."""
    return launch("two_ranks", 2, tmp_path_factory.mktemp("two_ranks"))


@pytest.fixture(autouse=True)
def _detector_shut_down() -> Iterator[None]:
    """Every test starts and ends with no process-wide Detector (if torch is here)."""
    try:
        from nvrx.straggler import Detector
    except ImportError:  # no torch: no Detector either
        yield
        return

    Detector.shutdown()
    yield
    Detector.shutdown()
