"""Stale runtime-dir cleanup: the owner's flock() decides, never a pid.

Real processes own the directories (create_runtime_dir in a child interpreter), are
SIGKILLed, live in another pid namespace, or are named by pids that do not exist.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from nvrx.ft import create_runtime_dir
from nvrx.ft._runtime import OWNER_LOCK_NAME, release_runtime_dir, remove_stale_runtime_dirs

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

_OWNER = (
    "import os, sys, time\n"
    "from nvrx.ft import create_runtime_dir\n"
    "path = create_runtime_dir()\n"
    "print(path, flush=True)\n"
    "sys.stdin.read()\n"  # lives until the test closes stdin or kills it
)


class _Owner:
    """A child interpreter that made a runtime dir under ``base`` and keeps living."""

    def __init__(self, base: pathlib.Path, argv_prefix: tuple[str, ...] = ()) -> None:
        env = dict(os.environ, XDG_RUNTIME_DIR=str(base))
        self.wrapped = bool(argv_prefix)
        self.popen = subprocess.Popen(
            [*argv_prefix, sys.executable, "-c", _OWNER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline().strip()
        if not line:
            self.kill()
            raise RuntimeError("the owner process made no runtime dir")
        self.path = pathlib.Path(line)

    def kill(self) -> None:
        """SIGKILL; a wrapped owner (unshare) is ended through stdin, waiting for both."""
        if self.popen.poll() is None:
            if self.wrapped:
                assert self.popen.stdin is not None
                self.popen.stdin.close()
            else:
                self.popen.send_signal(signal.SIGKILL)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=30)


@pytest.fixture
def base() -> Iterator[pathlib.Path]:
    """A short private directory (socket paths must fit), removed afterwards."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="nvrx-rt-test-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def owners() -> Iterator[list[_Owner]]:
    made: list[_Owner] = []
    try:
        yield made
    finally:
        for owner in made:  # every child by pid, even when the test failed
            owner.kill()


def _dead_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


def test_dir_of_a_sigkilled_owner_is_removed_and_a_live_one_kept(
    base: pathlib.Path, owners: list[_Owner]
) -> None:
    live = _Owner(base)
    owners.append(live)
    doomed = _Owner(base)
    owners.append(doomed)
    assert (doomed.path / OWNER_LOCK_NAME).is_file()
    assert remove_stale_runtime_dirs(base) == []  # both owners live
    doomed.kill()
    assert remove_stale_runtime_dirs(base) == [str(doomed.path)]
    assert not doomed.path.exists()
    assert live.path.is_dir()


def test_live_dir_whose_owner_pid_is_not_visible_is_kept(
    base: pathlib.Path, owners: list[_Owner]
) -> None:
    """As a launcher in another pid namespace looks from here: its pid names nobody."""
    owner = _Owner(base)
    owners.append(owner)
    renamed = base / f"nvrx-{_dead_pid()}-elsewhere"
    owner.path.rename(renamed)  # same directory and lock file, a pid that does not exist
    assert remove_stale_runtime_dirs(base) == []
    assert renamed.is_dir()
    owner.kill()  # the lock goes with the process: now it is provably stale
    assert remove_stale_runtime_dirs(base) == [str(renamed)]


def _unshare_pid_ns() -> tuple[str, ...]:
    unshare = shutil.which("unshare")
    if os.getuid() != 0 or unshare is None:
        return ()
    probe = subprocess.run(
        [unshare, "--pid", "--fork", "true"], capture_output=True, timeout=30, check=False
    )
    return (unshare, "--pid", "--fork", "--kill-child") if probe.returncode == 0 else ()


def test_owner_in_another_pid_namespace_is_kept(base: pathlib.Path, owners: list[_Owner]) -> None:
    prefix = _unshare_pid_ns()
    if not prefix:
        pytest.skip("needs root and unshare(1) allowed to make a pid namespace here")
    owner = _Owner(base, prefix)
    owners.append(owner)
    # Its name holds its pid in its own namespace (2: unshare's fork is 1), a pid that
    # here is some unrelated process or none.
    assert owner.path.name.split("-")[1] in {"1", "2"}
    assert remove_stale_runtime_dirs(base) == []
    assert owner.path.is_dir()
    owner.kill()
    assert remove_stale_runtime_dirs(base) == [str(owner.path)]


def test_old_format_dir_without_lock_is_kept_even_if_its_pid_is_dead(
    base: pathlib.Path,
) -> None:
    old = base / f"nvrx-{_dead_pid()}-abc123"
    old.mkdir(mode=0o700)
    (old / "monitor-0.sock").write_text("")
    assert remove_stale_runtime_dirs(base) == []
    assert old.is_dir()


@pytest.mark.parametrize(
    "pid_text",
    ["99999999999999999999999", "2147483648", "4194305", "0", "00000000000000000001"],
)
def test_names_that_are_not_a_valid_pid_are_skipped(
    base: pathlib.Path, monkeypatch: pytest.MonkeyPatch, pid_text: str
) -> None:
    odd = base / f"nvrx-{pid_text}-abc123"
    odd.mkdir(mode=0o700)
    (odd / OWNER_LOCK_NAME).write_text("")  # unlocked: only the name keeps it
    assert remove_stale_runtime_dirs(base) == []
    assert odd.is_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    made = create_runtime_dir()  # a later start is not stopped by it
    try:
        assert made.parent == base
    finally:
        release_runtime_dir(made)
    assert not made.exists()


def test_symlink_and_foreign_mode_dirs_are_kept(base: pathlib.Path, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (target / OWNER_LOCK_NAME).write_text("")
    link = base / f"nvrx-{_dead_pid()}-link00"
    link.symlink_to(target)
    open_dir = base / f"nvrx-{_dead_pid()}-open00"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    (open_dir / OWNER_LOCK_NAME).write_text("")
    assert remove_stale_runtime_dirs(base) == []
    assert link.is_symlink()
    assert target.is_dir()
    assert open_dir.is_dir()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run an owner as another user")
def test_dir_of_another_user_is_kept_even_when_its_lock_is_free(base: pathlib.Path) -> None:
    base.chmod(0o1777)  # a shared sticky directory, as /tmp
    code = (
        "import os, sys\n"
        "from nvrx.ft import create_runtime_dir\n"  # imported while the files are readable
        "os.setgid(65534); os.setuid(65534)\n"
        "print(create_runtime_dir(), flush=True)\n"  # exits: its lock is free
    )
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["TMPDIR"] = str(base)  # not ours, so not usable as XDG_RUNTIME_DIR for uid 65534
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    if done.returncode != 0:
        pytest.skip(f"uid 65534 cannot run the interpreter here: {done.stderr[-300:]}")
    theirs = pathlib.Path(done.stdout.strip())
    assert theirs.stat().st_uid == 65534
    assert remove_stale_runtime_dirs(base) == []
    assert theirs.is_dir()


def test_release_drops_the_lock_and_the_dir(
    base: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    made = create_runtime_dir()
    fds_before = len(os.listdir("/proc/self/fd"))
    release_runtime_dir(made)
    assert not made.exists()
    assert len(os.listdir("/proc/self/fd")) == fds_before - 1
    release_runtime_dir(made)  # twice is fine
