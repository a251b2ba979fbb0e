"""What the run nonce's liveness challenge costs (issue 26, item 4).

Every launcher that holds the run's nonce answers challenges from a thread that reads
one counter key every second (``_nonce_liveness.POLL_S``); a launcher that joins a run
waits for one answer. Real TCPStore, its server in a process of its own:

- ``nonce_answer_store_cpu``: the store server's CPU (per cent of a core) while N
  answering threads (one store connection each, as N nodes) run in steady state,
  N = 1000 (100 with ``--quick``);
- ``nonce_join``: how long a launcher joining a live run takes to adopt its nonce
  (holders past their fast start: up to one poll, 1 s, plus the store round trips);
- ``nonce_fresh``: creating the nonce on a fresh store (no challenge).

    .venv-dev/bin/python benchmarks/bench_run_nonce.py [--quick]

Measured on the shared 2-core dev box: 1000 answerers cost the store server 3.5% of a
core (and their own process 9.2%); 100: 0.4%.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import time

from _common import Metric

AREA = "run_nonce"
KEY = b"k" * 32
_TIMEOUT = datetime.timedelta(seconds=30)
_SERVER = """
import datetime, time
from torch._C._distributed_c10d import TCPStore
s = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
             timeout=datetime.timedelta(seconds=30))
print(s.port, flush=True)
time.sleep(900)
"""


def run(quick: bool) -> list[Metric]:
    import psutil
    from torch._C._distributed_c10d import TCPStore

    from nvrx.launcher._nonce_liveness import BURST_S, Answerer, Names
    from nvrx.launcher._run_nonce import NonceKeeper, _connection, _signed, signed_run
    from nvrx.launcher._signed_store import Rejections

    answerers_n = 100 if quick else 1000
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    keepers: list[NonceKeeper] = []
    answerers: list[Answerer] = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())

        def client() -> TCPStore:
            return TCPStore("127.0.0.1", port, is_master=False, timeout=_TIMEOUT)

        fresh = []
        for run_id in ("fresh-0", "fresh-1", "fresh-2"):
            keepers.append(NonceKeeper())
            started = time.monotonic()
            keepers[-1].nonce(client(), KEY, run_id, 0)
            fresh.append(time.monotonic() - started)

        base = client()
        keepers.append(NonceKeeper())
        nonce = keepers[-1].nonce(base, KEY, "job", 0)
        assert nonce is not None
        rejections = Rejections()
        for _ in range(answerers_n):
            connection = _connection(base)
            answerers.append(
                Answerer(
                    _signed(connection, KEY, "job", "job", rejections),
                    _signed(connection, KEY, "job", signed_run("job", nonce), rejections),
                    Names("run_nonce/0"),
                    nonce,
                    0,
                )
            )
        time.sleep(BURST_S + 2)  # past the creator's fast start: steady state
        proc = psutil.Process(server.pid)
        before, started = proc.cpu_times(), time.monotonic()
        time.sleep(5 if quick else 20)
        after, elapsed = proc.cpu_times(), time.monotonic() - started
        cpu = 100 * ((after.user + after.system) - (before.user + before.system)) / elapsed

        joins = []
        for _ in range(3 if quick else 7):
            keepers.append(NonceKeeper())
            started = time.monotonic()
            assert keepers[-1].nonce(client(), KEY, "job", 0) == nonce
            joins.append(time.monotonic() - started)
    finally:
        for answerer in answerers:
            answerer.stop()
        for answerer in answerers:
            answerer.join()
        for keeper in keepers:
            keeper.close()
        server.kill()
        server.wait(10)
    return [
        Metric(
            AREA,
            "nonce_answer_store_cpu",
            cpu,
            "% core",
            1,
            detail={"answerers": answerers_n},
        ),
        Metric(AREA, "nonce_join", statistics.median(joins), "s", len(joins)),
        Metric(AREA, "nonce_fresh", statistics.median(fresh), "s", len(fresh)),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    for metric in run(parser.parse_args().quick):
        print(f"{metric.name}: {metric.value:.3g} {metric.unit} {metric.detail or ''}")
