"""The D-state read the culprit tests inject: really state D, killable, always torn down."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from _dstate import proc_state, unavailable_reason, unserved_file  # type: ignore[import-not-found, unused-ignore]

pytestmark = [
    pytest.mark.skipif(unavailable_reason() is not None, reason=f"{unavailable_reason()}"),
    pytest.mark.multiprocess,
    pytest.mark.timeout(60),
]
_READER = "import sys; print('reading', flush=True); open(sys.argv[1], 'rb').read(); print('read')"


@contextlib.contextmanager
def _reader(path: pathlib.Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _READER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


def _wait_state(pid: int, want: str, timeout_s: float = 10.0) -> str | None:
    deadline = time.monotonic() + timeout_s
    state: str | None = proc_state(pid)
    while state != want and time.monotonic() < deadline:
        time.sleep(0.02)
        state = proc_state(pid)
    return state


def _kernel_stack(pid: int) -> str:
    """The task's kernel stack (root only; empty when the kernel does not show it)."""
    try:
        with open(f"/proc/{pid}/stack") as stream:
            return stream.read()
    except OSError:
        return ""


@pytest.mark.parametrize(("blocks_in", "call"), [("read", "ksys_read"), ("open", "openat")])
def test_reader_sits_in_state_d_in_the_kernel_and_sigkill_ends_it(
    blocks_in: str, call: str
) -> None:
    with unserved_file(blocks_in) as path, _reader(path) as reader:
        assert _wait_state(reader.pid, "D") == "D"
        stack = _kernel_stack(reader.pid)
        assert not stack or call in stack, stack
        os.kill(reader.pid, signal.SIGSTOP)  # a stop waits for the read to end
        os.kill(reader.pid, signal.SIGCONT)  # the monitor's first signal changes nothing
        time.sleep(0.3)
        assert proc_state(reader.pid) == "D"
        os.kill(reader.pid, signal.SIGKILL)
        assert reader.wait(timeout=5) == -signal.SIGKILL


def test_a_handled_signal_waits_for_the_read() -> None:
    """The default (``read``): the open succeeds, read(2) blocks."""
    handler = "lambda *a: print('handled', flush=True)"
    script = f"import signal; signal.signal(signal.SIGTERM, {handler}); {_READER}"
    with unserved_file() as path:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert _wait_state(proc.pid, "D") == "D"
            os.kill(proc.pid, signal.SIGTERM)
            time.sleep(0.5)
            assert proc_state(proc.pid) == "D", "the handler ran: the wait is interruptible"
        finally:
            proc.kill()
            out, _ = proc.communicate(timeout=10)
        assert "handled" not in out


def test_teardown_releases_a_blocked_reader_and_leaves_no_mount() -> None:
    with unserved_file() as path:
        mountpoint = str(path.parent).split("/root", 1)[1]
        holder = int(str(path).split("/")[2])
        reader = subprocess.Popen(
            [sys.executable, "-c", _READER, str(path)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert _wait_state(reader.pid, "D") == "D"
        except BaseException:
            reader.kill()
            reader.wait(timeout=10)
            raise
    try:
        out, _ = reader.communicate(timeout=10)  # the aborted connection ends the read
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait(timeout=10)
    assert reader.returncode != 0, out
    assert out.splitlines() == ["reading"], out  # the open failed: nothing was read
    assert proc_state(holder) is None, "the holder is still running"
    with open("/proc/self/mountinfo") as stream:
        assert "nvrx-dstate" not in stream.read(), "the mount is visible outside its namespace"
    assert not os.path.exists(mountpoint)
