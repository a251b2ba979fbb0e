"""Two launchers as two nodes over a real etcd server (etcd-v2 and the legacy etcd backend).

Needs the ``etcd`` server binary and the python-etcd client (in the test group). The
nox session installs the server where it can and then sets NVRX_REQUIRE_ETCD=1, so
these tests fail, rather than skip, when it should be there and is not.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
from launcher_testkit import Launcher, free_port, read_events  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]


def _etcd_missing() -> str | None:
    if shutil.which("etcd") is None:
        return "the etcd server binary is not on PATH (Debian: etcd-server)"
    if importlib.util.find_spec("etcd") is None:
        return "python-etcd is not installed"
    return None


@pytest.fixture
def etcd_endpoint(tmp_path: pathlib.Path) -> Iterator[str]:
    """A private etcd server on loopback with the v2 API; stopped after the test."""
    missing = _etcd_missing()
    if missing:
        if os.environ.get("NVRX_REQUIRE_ETCD") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    etcd = importlib.import_module("etcd")

    client_port, peer_port = free_port(), free_port()
    client_url = f"http://127.0.0.1:{client_port}"
    log = (tmp_path / "etcd.log").open("wb")
    proc = subprocess.Popen(
        [
            "etcd",
            "--name", "nvrx-test",
            "--data-dir", str(tmp_path / "etcd-data"),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"nvrx-test=http://127.0.0.1:{peer_port}",
            "--enable-v2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        client = etcd.Client(host="127.0.0.1", port=client_port, protocol="http")
        deadline = time.monotonic() + 30
        while True:
            try:
                client.write("/nvrx-ready", "1")
                break
            except etcd.EtcdException:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(
                        "etcd did not come up:\n" + (tmp_path / "etcd.log").read_text()
                    ) from None
                time.sleep(0.1)
        yield f"127.0.0.1:{client_port}"
    finally:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        log.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["etcd-v2", "etcd"])
def test_two_nodes_restart_together_over_etcd(
    start_launcher: Start, etcd_endpoint: str, backend: str
) -> None:
    common = [
        "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "2",
        "--rdzv-backend", backend, "--rdzv-endpoint", etcd_endpoint,
        "--rdzv-id", f"etcd-{backend}", "--local-addr", "127.0.0.1",
    ]  # fmt: skip
    script = ["--steps", "8", "--fault", "sigkill:1:3"]
    first = start_launcher(common, script, name="node0")
    second = start_launcher(common, script, name="node1")
    assert first.wait(200) == ExitCode.SUCCESS, first.log() + second.log()
    assert second.wait(60) == ExitCode.SUCCESS, first.log() + second.log()
    events = read_events(first.out)
    for rank in (0, 1):
        steps = {e["step"] for e in events if e["event"] == "step" and e["rank"] == rank}
        assert steps == set(range(1, 9))
        assert [e for e in events if e["event"] == "done" and e["rank"] == rank and e["cycle"] == 1]
    # One node decided the restart in the etcd store; the other followed it.
    logs = first.log() + second.log()
    assert logs.count("restart 1/2, cycle 0 -> 1") == 2
    assert "decided here" in logs
    assert "decided by" in logs
