"""ft_launcher: a node's SIGKILL to the first step, with a standby node and without.

Three ``ft_launcher`` processes act as three nodes over one c10d rendezvous on 127.0.0.1,
one realistic rank each (``scripts/realistic_rank.py``: env:// init, DDP, optimizer,
checkpointing). Once the job trains, the launcher of an active node other than the
store's host is SIGKILLed (its rank dies with it); the survivor's rank then fails in its
next collective and the job restarts:

- ``standby_node_replacement``: ``--nnodes=2:3 --ft-standby-nodes``: two nodes train,
  the third waits with no ranks and takes the killed node's place (world 2 -> 2);
- ``standby_none_restart_on_remaining``: ``--nnodes=2:3`` (torchrun's elastic meaning):
  three nodes train and the job restarts on the two that remain (world 3 -> 2).

Both use ``keep_alive_interval=1,keep_alive_max_attempt=3``: torch's rendezvous drops a
dead node after that many missed keep-alives (3 s here; torch's default is 5 s x 3), and
a new round cannot form before, with or without a standby.

Phases (median over samples), from the survivor's journal and the ranks' stamps:
``detect_s`` kill -> the survivor noticing its rank failed; ``stop_s``; ``rendezvous_s``
ranks stopped -> the new round done (mostly the dead node's keep-alive expiry);
``spawn_s``; ``rank_setup_s`` ranks started -> the slowest rank's first step (imports,
process group, DDP, optimizer: their own stamps in ``detail``); ``total_s`` kill -> the
slowest rank's first step of the new cycle.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import statistics
import sys
import tempfile
import time
from functools import partial
from typing import Any

from _common import Metric
from _launcher_runs import Launched, bench_env, read_jsonl, reap, start_launcher, wait_for

__all__ = ["run"]

HERE = pathlib.Path(__file__).resolve().parent
RANK = HERE / "scripts" / "realistic_rank.py"
AREA = "launcher"
RDZV_CONF = "last_call_timeout=1,join_timeout=300,keep_alive_interval=1,keep_alive_max_attempt=3"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _events(out: pathlib.Path, kind: str, cycle: int) -> list[dict[str, Any]]:
    return [
        e
        for e in read_jsonl(out / "events.jsonl")
        if e.get("event") == kind and e["cycle"] == cycle
    ]


def _journal(path: pathlib.Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(path) if r.get("event") == kind]


def _first_steps(out: pathlib.Path, cycle: int, ranks: int) -> list[dict[str, Any]] | None:
    found = _events(out, "phases", cycle)
    return found if len(found) == ranks else None


def _sample(work: pathlib.Path, standby: bool) -> dict[str, float]:
    """One job of three launchers, one node killed, measured to the new cycle's first step."""
    out = work / "out"
    out.mkdir(parents=True)
    port = _free_port()
    journals = [work / f"journal-{i}.jsonl" for i in range(3)]
    launched: list[Launched] = []
    active = 2 if standby else 3
    try:
        for i in range(3):
            cmd = [
                sys.executable, "-m", "nvrx.launcher",
                "--nnodes", "2:3", "--nproc-per-node", "1",
                *(["--ft-standby-nodes"] if standby else []),
                "--max-restarts", "1", "--workers-stop-timeout", "5",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", f"standby-{standby}", "--local-addr", "127.0.0.1",
                "--rdzv-conf", RDZV_CONF,
                "--ft-initial-rank-heartbeat-timeout", "300",
                "--ft-rank-heartbeat-timeout", "60",
                "--ft-journal", str(journals[i]),
                str(RANK), "--out", str(out),
            ]  # fmt: skip
            launched.append(start_launcher(cmd, work / f"launcher-{i}.log", env=bench_env()))
            if i == 0:  # the store's host stays in the job (its leaving ends the rendezvous)
                wait_for(partial(_port_open, port), 120, "the rendezvous store")
        # torchrun's meaning may first form a round of two and restart for the third
        # (nodes waiting): the kill comes in the first cycle where every node trains.
        (cycle,) = wait_for(partial(_full_cycle, out, active), 600, "the job's first steps")
        time.sleep(1.0)
        victim = next(
            i
            for i in (1, 2)
            if any(r["cycle"] == cycle for r in _journal(journals[i], "workers_started"))
        )
        for item in launched:
            item.remember_children()
        fault = time.time()
        os.kill(launched[victim].pid, signal.SIGKILL)
        firsts = wait_for(partial(_first_steps, out, cycle + 1, 2), 600, "the next first steps")
        wait_for(partial(_restart_of, journals[0], cycle), 60, "the survivor's restart record")
    finally:
        reap(launched)
    (decision,) = [r for r in _journal(journals[0], "decision") if r["cycle"] == cycle]
    (stopped,) = [r for r in _journal(journals[0], "workers_stopped") if r["cycle"] == cycle]
    restart = _restart_of(journals[0], cycle)
    assert restart is not None
    replaced = _journal(journals[0], "node_replaced")
    if standby and len(replaced) != 1:
        raise RuntimeError(f"expected one node_replaced record, got {replaced}")
    started = float(restart["workers_started"])
    slowest = max(firsts, key=lambda e: float(e["t_first_step"]))
    return {
        "detect_s": float(decision["failure_noticed"]) - fault,
        "stop_s": float(stopped["workers_stopped"]) - float(decision["failure_noticed"]),
        "rendezvous_s": float(restart["rendezvous_done"]) - float(stopped["workers_stopped"]),
        "spawn_s": started - float(restart["rendezvous_done"]),
        "rank_setup_s": float(slowest["t_first_step"]) - started,
        "rank_imports_s": float(slowest["t_imports"]) - float(slowest["t_exec"]),
        "rank_pg_s": float(slowest["t_pg"]) - float(slowest["t_client"]),
        "rank_ddp_s": float(slowest["t_ddp"]) - float(slowest["t_pg"]),
        "total_s": float(slowest["t_first_step"]) - fault,
    }


def _full_cycle(out: pathlib.Path, ranks: int) -> list[int]:
    """``[c]``: the first cycle in which ``ranks`` ranks made their first step ([]: none yet)."""
    cycles = sorted({int(e["cycle"]) for e in read_jsonl(out / "events.jsonl")})
    return [c for c in cycles if _first_steps(out, c, ranks)][:1]


def _restart_of(journal: pathlib.Path, cycle: int) -> dict[str, Any] | None:
    return next((r for r in _journal(journal, "restart") if r["from_cycle"] == cycle), None)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def run(quick: bool) -> list[Metric]:
    """Both scenarios, ``samples`` jobs each, alternating so load drifts hit both alike."""
    samples = 2 if quick else 3
    measured: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-standby-") as tmp:
        for n in range(samples):
            for standby in (True, False):
                work = pathlib.Path(tmp) / f"{'standby' if standby else 'none'}-{n}"
                measured[standby].append(_sample(work, standby))
    metrics = []
    for standby, name in (
        (True, "standby_node_replacement"),
        (False, "standby_none_restart_on_remaining"),
    ):
        rows = measured[standby]
        figures = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        totals = [r["total_s"] for r in rows]
        detail: dict[str, object] = dict(figures)
        detail["total_spread_s"] = max(totals) - min(totals)
        detail["samples_s"] = [round(t, 3) for t in totals]
        detail["rdzv_conf"] = RDZV_CONF
        metrics.append(Metric(AREA, name, figures["total_s"], "s", len(rows), None, detail))
    for m in metrics:
        extra = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.detail.items()
        )
        print(f"  {m.name}: {m.value:.3f} {m.unit} ({extra})", flush=True)
    return metrics
