"""ft_launcher: how one crash-and-restart costs with 2, 4, 8, 16 nodes (launchers) on one host.

N ``ft_launcher`` processes act as N nodes over one c10d rendezvous on 127.0.0.1, one tiny
rank each (``scripts/tiny_rank.py``: standard library only, so the ranks' start-up does
not hide the launchers'). The last node's rank is SIGKILLed; each restart is timed from
every node's journal (``--ft-journal``):

- ``detect_s``: the kill to the failing node noticing it (its ``decision.failure_noticed``);
- ``decide_s``: noticing to its decision being recorded (claimed and published in the store);
- ``propagation_s``: the failing node's decision to each other node's ranks stopped
  (median over the other nodes; ``propagation_max_s`` is the last of them);
- ``rendezvous_s``: the last node's ranks stopped to the last node's rendezvous done
  (the rendezvous' own cost once everyone has joined);
- ``spawn_s``: rendezvous done to ranks started, per node (median);
- ``launcher_s``: the kill to the last node's ranks started (everything above);
- ``rank_start_s``: the last node's ranks started to the last rank running (a Python
  with the standard library only, through the exec shim);
- ``total_s``: the kill to the last node's rank running again.

Every launcher runs through ``scripts/store_counting_launcher.py``, which counts the
Python calls on ``torch.distributed.Store`` in that process; ``store_ops_per_restart`` is
every node's calls between the kill and the last rank's start, ``store_ops_per_node_s``
the background rate per node while the job trains (the agents' decision polling and the
rendezvous' keep-alive), measured over the second before each kill.
``store_calls_by_caller_restart`` and ``..._training_s`` (all nodes, over the quiet second)
say which code made them (method, file:function).
Each figure is a median over restarts; ``total_spread_s`` is max minus min over them.

Rows: ``restart_<N>_nodes`` (``total_s``, phases in ``detail``), and
``restart_cost_per_added_node``: the slope of ``launcher_s`` per added node, with each
phase's slope, its value projected to 1,024 nodes, and the store traffic projected the
same way (the model is in its ``detail``). ``rank_start_s`` grows here only because N
Pythons start on the same 2 cores; on real nodes each starts on its own.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from typing import Any

from _common import Metric
from _launcher_runs import Launched, bench_env, read_jsonl, reap, start_launcher, wait_for
from torch._C._distributed_c10d import TCPStore

__all__ = ["run"]

HERE = pathlib.Path(__file__).resolve().parent
TINY = HERE / "scripts" / "tiny_rank.py"
COUNTING = HERE / "scripts" / "store_counting_launcher.py"
AREA = "launcher"
WRITES = {"set", "compare_set", "add", "append", "multi_set", "delete_key", "queue_push"}
QUIET_S = 1.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _starts(out: pathlib.Path, cycle: int) -> dict[int, dict[str, Any]]:
    return {
        int(e["rank"]): e
        for e in read_jsonl(out / "events.jsonl")
        if e.get("event") == "start" and e.get("cycle") == cycle
    }


def _all_started(out: pathlib.Path, cycle: int, nodes: int) -> bool:
    return len(_starts(out, cycle)) == nodes


def _journals_of(journals: list[pathlib.Path], cycle: int) -> list[dict[str, Any]] | None:
    """Every node's record of the restart that ends ``cycle``, once all are complete."""
    rows = [_journal_of(path, cycle) for path in journals]
    complete = [row for row in rows if row is not None]
    return complete if len(complete) == len(rows) else None


def _journal_of(path: pathlib.Path, cycle: int) -> dict[str, Any] | None:
    """One node's record of the restart that ends ``cycle``, once it is complete."""
    decision = stopped = restart = None
    for row in read_jsonl(path):
        kind = row.get("event")
        if kind == "decision" and row.get("cycle") == cycle:
            decision = row
        elif kind == "workers_stopped" and row.get("cycle") == cycle:
            stopped = row
        elif kind == "restart" and row.get("from_cycle") == cycle:
            restart = row
    if decision is None or stopped is None or restart is None:
        return None
    return {
        "node": decision.get("node"),
        "decided_by": decision["decided_by"],
        "noticed": float(decision["failure_noticed"]),
        "decision_t": float(decision["t"]),
        "stopped": float(stopped["workers_stopped"]),
        "rendezvous_done": float(restart["rendezvous_done"]),
        "started": float(restart["workers_started"]),
    }


def _job(work: pathlib.Path, nodes: int, restarts: int) -> tuple[list[dict[str, Any]], str]:
    """Start ``nodes`` launchers, kill the last node's rank ``restarts`` times, measure."""
    out = work / "out"
    out.mkdir(parents=True)
    port = _free_port()
    launched: list[Launched] = []
    journals = [work / f"journal-{i}.jsonl" for i in range(nodes)]
    counts = [work / f"store-{i}.json" for i in range(nodes)]
    samples: list[dict[str, Any]] = []
    try:
        for i in range(nodes):
            cmd = [
                sys.executable, str(COUNTING), str(counts[i]),
                "--nnodes", str(nodes), "--nproc-per-node", "1",
                "--max-restarts", str(restarts), "--workers-stop-timeout", "5",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", f"scale-{nodes}", "--local-addr", "127.0.0.1",
                "--rdzv-conf", f"is_host={1 if i == 0 else 0},join_timeout=600",
                "--ft-initial-rank-heartbeat-timeout", "900",
                "--ft-rank-heartbeat-timeout", "900",
                "--ft-journal", str(journals[i]),
                str(TINY), str(out),
            ]  # fmt: skip
            launched.append(start_launcher(cmd, work / f"launcher-{i}.log", env=bench_env()))
        for cycle in range(restarts):
            wait_for(partial(_all_started, out, cycle, nodes), 600, f"{nodes} ranks in {cycle}")
            time.sleep(QUIET_S + 0.2)
            for item in launched:
                item.remember_children()
            victim = _starts(out, cycle)[nodes - 1]
            fault = time.time()
            os.kill(int(victim["pid"]), signal.SIGKILL)
            wait_for(partial(_all_started, out, cycle + 1, nodes), 600, f"restart {cycle}")
            nodes_seen = wait_for(partial(_journals_of, journals, cycle), 60, "the journals")
            samples.append(
                {
                    "fault": fault,
                    "back": max(float(e["t"]) for e in _starts(out, cycle + 1).values()),
                    "nodes": nodes_seen,
                }
            )
        (out / "stop").write_text("")
        for item in launched:
            try:
                item.proc.wait(120)
            except subprocess.TimeoutExpired:
                break  # reaped below
    finally:
        reap(launched)
    calls = [_store_calls(path) for path in counts]
    for sample in samples:
        sample["calls"] = calls
        sample["methods"] = {}
        sample["quiet"] = {}
    log = "".join((work / f"launcher-{i}.log").read_text(errors="replace") for i in range(nodes))
    return samples, log


def _store_calls(path: pathlib.Path) -> list[list[Any]]:
    """One launcher's counted store calls ([t, method, keys, caller]); empty if none."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    calls: list[list[Any]] = data["calls"]
    return calls


def _measure(sample: dict[str, Any]) -> dict[str, float]:
    rows: list[dict[str, Any]] = sample["nodes"]
    decider = next(r for r in rows if r["decided_by"] == r["node"])
    others = [r for r in rows if r is not decider]
    fault, back = sample["fault"], sample["back"]
    propagation = [r["stopped"] - decider["decision_t"] for r in others]
    ops = reads = writes = keys = 0
    quiet = 0
    for node_calls in sample["calls"]:
        for t, method, n, caller in node_calls:
            if fault <= t <= back:
                ops += 1
                keys += n
                if method in WRITES:
                    writes += 1
                else:
                    reads += 1
                where = f"{method} {caller}"
                sample["methods"][where] = sample["methods"].get(where, 0) + 1
            elif fault - QUIET_S <= t < fault:
                quiet += 1
                where = f"{method} {caller}"
                sample["quiet"][where] = sample["quiet"].get(where, 0) + 1
    nodes = len(rows)
    return {
        "detect_s": decider["noticed"] - fault,
        "decide_s": decider["decision_t"] - decider["noticed"],
        "propagation_s": statistics.median(propagation) if propagation else 0.0,
        "propagation_max_s": max(propagation) if propagation else 0.0,
        "stop_s": decider["stopped"] - decider["decision_t"],
        "rendezvous_s": max(r["rendezvous_done"] for r in rows) - max(r["stopped"] for r in rows),
        "spawn_s": statistics.median(r["started"] - r["rendezvous_done"] for r in rows),
        "launcher_s": max(r["started"] for r in rows) - fault,
        "rank_start_s": back - max(r["started"] for r in rows),
        "total_s": back - fault,
        "store_ops_per_restart": float(ops),
        "store_writes_per_restart": float(writes),
        "store_reads_per_restart": float(reads),
        "store_keys_per_restart": float(keys),
        "store_ops_per_node_per_restart": ops / nodes,
        "store_ops_per_node_s": quiet / QUIET_S / nodes,
    }


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line ``y = a + b x``: (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def _store_round_trip_s(calls: int = 2000) -> float:
    """Median seconds of one ``get`` on a TCPStore on 127.0.0.1 here (client and server)."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = TCPStore("127.0.0.1", server.port, is_master=False)
    client.set("k", "v")
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            client.get("k")
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def _slope_metric(per_count: dict[int, dict[str, float]], round_trip_s: float) -> Metric:
    """Slopes per added node and the projection to 1,024 nodes (the model in ``model``)."""
    xs = [float(n) for n in per_count]
    detail: dict[str, object] = {}
    keys = ("total_s", "launcher_s", "propagation_max_s", "rendezvous_s", "spawn_s", "rank_start_s")
    for key in keys:
        a, b = _fit(xs, [per_count[n][key] for n in per_count])
        detail[f"{key}_per_node"] = b
        detail[f"{key}_at_1024"] = a + b * 1024
    # Store operations: each node's own count per restart, as a line in N; the job's is
    # N times that, so a per-node count that grows with N is a quadratic total.
    p, q = _fit(xs, [per_count[n]["store_ops_per_node_per_restart"] for n in per_count])
    ops_1024 = 1024 * (p + q * 1024)
    detail["store_ops_per_node_per_restart"] = {
        n: per_count[n]["store_ops_per_node_per_restart"] for n in per_count
    }
    detail["store_ops_per_node_growth_per_node"] = q
    detail["store_ops_at_1024"] = ops_1024
    detail["store_round_trip_s"] = round_trip_s
    detail["store_serial_s_at_1024"] = ops_1024 * round_trip_s
    detail["model"] = (
        "phase(N) = a + b*N, least squares over the node counts run; store ops per node "
        "per restart = p + q*N, so the job's = N*(p + q*N); the one store host serves "
        "them one at a time, at most one measured 127.0.0.1 get round trip each"
    )
    return Metric(
        AREA,
        "restart_cost_per_added_node",
        float(detail["launcher_s_per_node"]),  # type: ignore[arg-type]
        "s",
        len(per_count),
        None,
        detail,
    )


def run(quick: bool) -> list[Metric]:
    """The same crash-and-restart at each node count; slope per node, projection to 1,024."""
    counts = (2, 4, 8) if quick else (2, 4, 8, 16)
    restarts = 3
    metrics: list[Metric] = []
    per_count: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for nodes in counts:
            started = time.monotonic()
            samples, _ = _job(pathlib.Path(tmp) / f"n{nodes}", nodes, restarts)
            measured = [_measure(s) for s in samples]
            figures = {k: statistics.median(m[k] for m in measured) for k in measured[0]}
            totals = [m["total_s"] for m in measured]
            detail: dict[str, object] = dict(figures)
            detail["total_spread_s"] = max(totals) - min(totals)
            detail["samples_s"] = [round(t, 3) for t in totals]
            detail["job_wall_s"] = time.monotonic() - started
            for field, name in (("methods", "restart"), ("quiet", "training_s")):
                methods = sorted({k for sample in samples for k in sample[field]})
                detail[f"store_calls_by_caller_{name}"] = {
                    k: statistics.median(sample[field].get(k, 0) for sample in samples)
                    for k in methods
                }
            per_count[nodes] = figures
            name = f"restart_{nodes}_nodes"
            metrics.append(Metric(AREA, name, figures["total_s"], "s", len(samples), None, detail))
    metrics.append(_slope_metric(per_count, _store_round_trip_s()))
    for m in metrics:
        extra = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.detail.items()
        )
        print(f"  {m.name}: {m.value:.3f} {m.unit} ({extra})", flush=True)
    return metrics
