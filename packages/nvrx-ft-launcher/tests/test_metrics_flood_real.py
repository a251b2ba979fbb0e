"""The metrics endpoint flooded with connections while a real job hangs and restarts.

A local user (uid 65534 when the tests run as root) opens far more connections than the
launcher may have file descriptors (its limit is lowered to 256 here) and sends nothing
or half a request. The launcher still detects the hang, restarts the ranks and
finishes; it never runs out of descriptors; once the flood ends a scrape answers.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator

import psutil
import pytest
from launcher_testkit import Launcher, read_events, wait_for  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode
from nvrx.launcher._metrics_http import MAX_CONNECTIONS

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
pytest.importorskip("prometheus_client")

Start = Callable[..., Launcher]
LAUNCHER_FD_LIMIT = 256
FLOOD = 800

_FLOODER = r"""
import os, resource, selectors, socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (count + 64, count + 64))
if os.getuid() == 0:
    os.setgid(65534); os.setuid(65534)  # another local user
sel = selectors.DefaultSelector()
sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
live = {}  # socket -> connected?
def dial():
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect((host, port))
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:
        s.close()
        return
    live[s] = False
    sel.register(s, selectors.EVENT_WRITE, "sock")
def drop(s):
    sel.unregister(s); s.close(); live.pop(s, None)
most = 0
reported = False
started = time.monotonic()
while True:
    while len(live) < count:
        dial()
    for key, mask in sel.select(0.2):
        if key.data == "stdin":
            print(f"most_connected={most}", flush=True)
            sys.exit(0)  # the test ended the flood
        s = key.fileobj
        if not live[s]:  # the connect finished
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                drop(s); continue
            live[s] = True
            try:  # every other one starts a request and stalls
                if s.fileno() % 2:
                    s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            except OSError:
                drop(s); continue
            sel.modify(s, selectors.EVENT_READ, "sock")
        else:
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:  # the server closed it: dial again
                drop(s)
    most = max(most, sum(live.values()))
    if not reported and time.monotonic() - started > 3:
        reported = True
        print(f"flooding uid={os.getuid()} connected={most} sockets={len(live)}", flush=True)
"""


def _records(journal: pathlib.Path, event: str) -> list[dict[str, object]]:
    if not journal.exists():
        return []
    lines = journal.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


@pytest.fixture
def flooders() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for proc in started:  # by pid, even when the test failed
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


@pytest.mark.timeout(240)
def test_hang_detection_and_restart_hold_while_the_endpoint_is_flooded(
    start_launcher: Start, tmp_path: pathlib.Path, flooders: list[subprocess.Popen[str]]
) -> None:
    journal = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        [
            "--nproc-per-node", "2", "--max-restarts", "1", "--ft-journal", str(journal),
            "--ft-metrics-port", "0", "--ft-rank-heartbeat-timeout", "4",
        ],
        ["--steps", "220", "--step-time", "0.1", "--fault", "sleep:1:40"],
    )  # fmt: skip
    wait_for(lambda: bool(_records(journal, "run_start")), what="run_start")
    url = str(_records(journal, "run_start")[0]["metrics_url"])
    host, port = re.fullmatch(r"http://([\d.]+):(\d+)/metrics", url).groups()  # type: ignore[union-attr]
    psutil.Process(launcher.pid).rlimit(
        psutil.RLIMIT_NOFILE, (LAUNCHER_FD_LIMIT, LAUNCHER_FD_LIMIT)
    )

    flooder = subprocess.Popen(
        [sys.executable, "-c", _FLOODER, host, port, str(FLOOD)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    flooders.append(flooder)
    assert flooder.stdout is not None
    ready = flooder.stdout.readline()
    assert "flooding" in ready, ready
    sockets = int(ready.rsplit("=", 1)[1])
    assert sockets > LAUNCHER_FD_LIMIT, ready  # connecting or connected, all the time
    # The flood is on before the rank hangs (its fault comes at step 40).
    assert not any(e["event"] == "fault" for e in read_events(launcher.out))

    most_fds = 0

    def restarted() -> bool:
        nonlocal most_fds
        most_fds = max(most_fds, psutil.Process(launcher.pid).num_fds())
        return bool(_records(journal, "restart"))

    wait_for(restarted, timeout=150, what="the restart while flooded")
    assert _records(journal, "rank_terminated_by_monitor"), launcher.log()
    assert any("hang" in str(r["reason"]) for r in _records(journal, "decision"))
    assert most_fds < LAUNCHER_FD_LIMIT // 2, most_fds  # the flood holds a few of them

    assert flooder.stdin is not None
    flooder.stdin.write("end\n")  # the flood ends
    flooder.stdin.close()
    print(flooder.stdout.read())
    flooder.wait(timeout=30)
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        text = response.read().decode()
    assert launcher.proc.poll() is None, "the run ended before the scrape"
    assert re.search(r'^nvrx_restarts_total\{cause="hang"\} 1\.0$', text, re.M), text

    assert launcher.wait(150) == ExitCode.SUCCESS, launcher.log()
    log = launcher.log()
    assert "Too many open files" not in log
    assert "EMFILE" not in log
    cycle1 = [e for e in read_events(launcher.out) if e["event"] == "done" and e["cycle"] == 1]
    assert len(cycle1) == 2, log
    assert MAX_CONNECTIONS < LAUNCHER_FD_LIMIT // 4
