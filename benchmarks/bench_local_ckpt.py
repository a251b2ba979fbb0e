"""Local (in-memory, peer-replicated) checkpoints: what a save costs the training loop.

- ``save_call_<size>``: the ``LocalCheckpoints.save`` call on the training thread at
  10 MB, 100 MB and 1 GB of CPU state (median, steady state: slots already
  allocated), against a plain ``copy_`` of the same bytes into a preallocated buffer
  (``detail.plain_copy_ms``); ``detail.background_ms`` is what the writer thread then
  spends (checksums, manifest, preamble).
- ``step_slowdown_100MB``: a training loop (an MLP whose parameters and AdamW moments
  are ~100 MB; forward + backward on a batch of 512, optimizer step) with
  ``maybe_save`` every step, against the same loop without; a save that finds the
  previous one still being written is skipped, and ``detail.saved_share`` says how
  many steps got a snapshot. On a CPU the loop pays the copy (memory bandwidth); on a
  GPU the copy is an async device-to-host transfer on a side stream.
- ``restore_own_100MB`` / ``restore_peer_100MB``: ``restore`` from this node's memory,
  and in a 2-"node" gloo job (127.0.0.1) whose node 1 lost its directory, from the
  peer's replica.

Issue 22's budget: the call costs at most the copy plus 1 ms; a save every step slows a
100 MB-state loop by at most 5 %. Figures depend on memory bandwidth and load.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from _common import Metric

from nvrx.ft.checkpointing.local import LocalCheckpoints, LocalCkptSettings

AREA = "local_ckpt"
HERE = pathlib.Path(__file__).resolve().parent
MB = 1 << 20


def _base() -> pathlib.Path:
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return pathlib.Path(tempfile.mkdtemp(prefix="nvrx-bench-lc-", dir=root))


def _settings(node_dir: pathlib.Path) -> LocalCkptSettings:
    return LocalCkptSettings(node_dir=node_dir, job_id="bench", replicas=0, max_share=0.9)


def _save_call(size_mb: int, samples: int) -> Metric:
    n = size_mb * MB // 4
    state = {"w": torch.randn(n)}
    base = _base()
    try:
        lc = LocalCheckpoints(_settings(base))
        calls, background = [], []
        for it in range(samples + 2):
            t0 = time.perf_counter()
            lc.save(it, state)
            t1 = time.perf_counter()
            lc.wait()
            t2 = time.perf_counter()
            if it >= 2:  # both slots allocated: the steady state
                calls.append((t1 - t0) * 1e3)
                background.append((t2 - t1) * 1e3)
        lc.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    dst = torch.empty(n)
    copies = []
    for _ in range(samples):
        t0 = time.perf_counter()
        dst.copy_(state["w"])
        copies.append((time.perf_counter() - t0) * 1e3)
    call, copy = statistics.median(calls), statistics.median(copies)
    return Metric(
        AREA,
        f"save_call_{size_mb}MB",
        call,
        "ms",
        len(calls),
        target=copy + 1.0,
        detail={
            "plain_copy_ms": copy,
            "overhead_ms": call - copy,
            "background_ms": statistics.median(background),
        },
    )


def _step_loop(steps: int) -> Metric:
    # An MLP whose parameters plus AdamW's two moments are ~100 MB; a step is a forward
    # and backward pass on a batch of 512 and the optimizer step.
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 2048), torch.nn.Tanh(), torch.nn.Linear(2048, 2048)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(512, 2048)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    def state(it: int) -> dict[str, object]:
        return {"model": model.state_dict(), "optim": opt.state_dict(), "step": it}

    def loop(lc: LocalCheckpoints | None) -> tuple[float, int]:
        saved = 0
        t0 = time.perf_counter()
        for it in range(steps):
            step()
            if lc is not None:
                saved += lc.maybe_save(it, state(it))
        return (time.perf_counter() - t0) / steps, saved

    step()  # optimizer state allocated
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(
        v.numel() * v.element_size()
        for s in opt.state_dict()["state"].values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )
    base = _base()
    try:
        lc = LocalCheckpoints(_settings(base))
        for it in range(3):  # allocate both slots
            lc.save(it, state(it))
            lc.wait()
        plain = min(loop(None)[0] for _ in range(2))
        with_saves, saved = min((loop(lc) for _ in range(2)), key=lambda r: r[0])
        lc.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    slowdown = (with_saves / plain - 1.0) * 100.0
    return Metric(
        AREA,
        "step_slowdown_100MB",
        slowdown,
        "%",
        steps * 2,
        target=5.0,
        detail={
            "state_mb": nbytes / MB,
            "step_ms": plain * 1e3,
            "step_with_save_ms": with_saves * 1e3,
            "saved_share": saved / steps,
        },
    )


def _restore_own(samples: int) -> Metric:
    state = {"w": torch.randn(100 * MB // 4)}
    base = _base()
    try:
        lc = LocalCheckpoints(_settings(base))
        lc.save(1, state)
        lc.close()
        times = []
        for _ in range(samples):
            lc = LocalCheckpoints(_settings(base))
            times.append(lc.restore({"w": torch.empty(0)}).seconds)
            lc.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return Metric(AREA, "restore_own_100MB", statistics.median(times), "s", len(times))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job(nodes: list[pathlib.Path], mode: str, out_dir: pathlib.Path) -> list[dict[str, object]]:
    port = _free_port()
    procs = []
    for rank, node_dir in enumerate(nodes):
        node_dir.mkdir(exist_ok=True)
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(len(nodes)),
            "LOCAL_RANK": "0",
            "GROUP_RANK": str(rank),
        }
        out = out_dir / f"{mode}-{rank}.json"
        cmd = [sys.executable, str(HERE / "scripts" / "local_ckpt_rank.py")]
        cmd += [str(node_dir), str(100 * MB // 4), mode, str(out)]
        procs.append((subprocess.Popen(cmd, env=env), out))
    results = []
    try:
        for p, out in procs:
            p.wait(timeout=300)
            results.append(json.loads(out.read_text()))
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def _restore_peer(samples: int) -> list[Metric]:
    base = _base()
    peer, own = [], []
    try:
        for i in range(samples):
            nodes = [base / f"n0-{i}", base / f"n1-{i}"]
            _job(nodes, "save", base)
            shutil.rmtree(nodes[1])
            r = _job([nodes[0], base / f"n1-new-{i}"], "restore", base)
            assert r[1]["source"] == "peer", r
            own.append(float(r[0]["seconds"]))  # type: ignore[arg-type]
            peer.append(float(r[1]["seconds"]))  # type: ignore[arg-type]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return [
        Metric(
            AREA,
            "restore_peer_100MB",
            statistics.median(peer),
            "s",
            len(peer),
            detail={"same_job_own_rank_s": statistics.median(own)},
        )
    ]


def run(quick: bool) -> list[Metric]:
    """Save-call cost at three sizes, step-loop slowdown, restore own vs peer."""
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    sizes = [(10, 15), (100, 9)] if quick else [(10, 31), (100, 15), (1024, 5)]
    metrics = [_save_call(mb, n) for mb, n in sizes]
    metrics.append(_step_loop(4 if quick else 10))
    metrics.append(_restore_own(3 if quick else 7))
    metrics.extend(_restore_peer(1 if quick else 3))
    return metrics
