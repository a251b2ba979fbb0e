"""Node health checks before the rendezvous: each check on real files and processes."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import sys
import time
import types
from typing import Any

import pytest

from nvrx.launcher._node_health import (
    HealthFailure,
    HealthSettings,
    NicCheck,
    NodeHealthChecker,
    check_command,
    check_gpus,
    check_storage,
)
from nvrx.launcher._reaper import Reaper


def _fake_ib(root: pathlib.Path, ports: dict[str, tuple[str, int]]) -> tuple[str, str]:
    for nic, (state, downed) in ports.items():
        port = root / nic / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "counters" / "link_downed").write_text(f"{downed}\n")
    return (
        str(root / "{nic}" / "ports" / "1" / "state"),
        str(root / "{nic}" / "ports" / "1" / "counters" / "link_downed"),
    )


def test_nic_ports_active_and_steady_are_healthy(tmp_path: pathlib.Path) -> None:
    state, down = _fake_ib(tmp_path, {"mlx5_0": ("4: ACTIVE", 0), "mlx5_1": ("4: ACTIVE", 3)})
    check = NicCheck(state, down)
    assert check.check() == ([], None)
    assert check.check() == ([], None)


def test_a_port_down_at_the_first_check_is_logged_once_not_a_failure(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """NVRx's outcome: a port that was never ACTIVE (say, not cabled) is no failure."""
    state, down = _fake_ib(tmp_path, {"mlx5_0": ("4: ACTIVE", 0), "mlx5_1": ("1: DOWN", 0)})
    check = NicCheck(state, down)
    with caplog.at_level("INFO", logger="nvrx.launcher"):
        assert check.check() == ([], None)
        assert check.check() == ([], None)
    said = [r.getMessage() for r in caplog.records if "mlx5_1" in r.getMessage()]
    assert len(said) == 1
    assert "1: DOWN at this launcher's first check" in said[0]
    # Once it came up, going down again is a failure.
    (tmp_path / "mlx5_1/ports/1/state").write_text("4: ACTIVE\n")
    assert check.check() == ([], None)
    (tmp_path / "mlx5_1/ports/1/state").write_text("2: INIT\n")
    assert check.check() == (
        [HealthFailure("nic", "mlx5_1 port went from ACTIVE to 2: INIT")],
        None,
    )


def test_a_port_that_goes_from_active_to_down_fails_naming_it(tmp_path: pathlib.Path) -> None:
    state, down = _fake_ib(tmp_path, {"mlx5_0": ("4: ACTIVE", 0), "mlx5_1": ("4: ACTIVE", 0)})
    check = NicCheck(state, down)
    assert check.check() == ([], None)
    (tmp_path / "mlx5_1/ports/1/state").write_text("1: DOWN\n")
    failures, skipped = check.check()
    assert skipped is None
    assert failures == [HealthFailure("nic", "mlx5_1 port went from ACTIVE to 1: DOWN")]
    # Still down at the next check: the change was reported; the node left already.
    (tmp_path / "mlx5_1/ports/1/state").unlink()
    assert check.check() == ([], None)


def test_a_grown_link_downed_counter_fails_at_the_next_check(tmp_path: pathlib.Path) -> None:
    state, down = _fake_ib(tmp_path, {"mlx5_0": ("4: ACTIVE", 2)})
    check = NicCheck(state, down)
    assert check.check() == ([], None)  # the first check only takes the baseline
    (tmp_path / "mlx5_0/ports/1/counters/link_downed").write_text("5\n")
    failures, _ = check.check()
    assert failures == [HealthFailure("nic", "mlx5_0 link went down 3 time(s)")]


def test_no_nic_is_a_skip_not_a_failure(tmp_path: pathlib.Path) -> None:
    failures, skipped = NicCheck(str(tmp_path / "{nic}/ports/1/state"), None).check()
    assert failures == []
    assert skipped is not None
    assert "no NIC matches" in skipped


def test_storage_writable_passes_and_leaves_nothing(tmp_path: pathlib.Path) -> None:
    assert check_storage([str(tmp_path)]) == []
    assert list(tmp_path.iterdir()) == []


def test_storage_missing_or_read_only_fails(tmp_path: pathlib.Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        failures = check_storage([str(tmp_path / "absent"), str(ro)])
    finally:
        ro.chmod(0o755)
    assert failures[0] == HealthFailure("storage", f"{tmp_path / 'absent'} does not exist")
    if os.geteuid() != 0:  # root writes anywhere
        assert failures[1].check == "storage"
        assert "not writable" in failures[1].reason
    else:
        assert len(failures) == 1


def test_storage_that_hangs_fails_within_the_timeout(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # A FIFO's directory is writable; make the probe hang instead: opening a FIFO
    # for writing blocks until a reader comes, as a hung mount would.
    import nvrx.launcher._node_health as health

    original = health._probe_storage

    def hanging(path: str) -> str | None:
        with open(fifo, "wb"):
            return original(path)

    health._probe_storage = hanging
    try:
        failures = check_storage([str(tmp_path)], timeout=0.3)
    finally:
        health._probe_storage = original
        with open(fifo, "rb"):  # release the probe thread
            pass
    assert failures == [HealthFailure("storage", f"{tmp_path} did not answer within 0.3 s")]


def test_user_command_exit_code_and_last_line_are_the_reason() -> None:
    assert check_command(f"{sys.executable} -c pass") == []
    script = "import sys; print('checking'); print('ECC errors: 12'); sys.exit(4)"
    (failure,) = check_command(f'{sys.executable} -c "{script}"')
    assert failure.check == "command"
    assert "exited 4: ECC errors: 12" in failure.reason


def test_user_command_timeout_and_missing_program() -> None:
    (slow,) = check_command(f"{sys.executable} -c 'import time; time.sleep(30)'", timeout=0.5)
    assert "did not finish within 0.5 s" in slow.reason
    (missing,) = check_command("/nonexistent/health-check --all")
    assert "could not start" in missing.reason


def _gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (absent, or a zombie waiting for init)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ending", ["exit 0", "exit 3", "sleep 30"])
def test_user_command_leaves_nothing_behind_and_its_child_does_not_hold_it(
    ending: str, tmp_path: pathlib.Path
) -> None:
    # A check that starts a background child and exits 0 is healthy at once (the child
    # keeps the output open: reading a pipe to its end would wait for it), and whatever
    # the command leaves running is killed, whether it passed, failed or timed out.
    pid_file = tmp_path / "child.pid"
    command = f"sh -c 'sleep 60 & echo $! > {pid_file}; echo checked; {ending}'"
    started = time.monotonic()
    failures = check_command(command, timeout=1.0)
    took = time.monotonic() - started
    child = int(pid_file.read_text())
    try:
        assert _wait_gone(child), f"the command's child {child} outlived the check"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    if ending == "exit 0":
        assert failures == []
        assert took < 1.0
    elif ending == "exit 3":
        assert [f.reason for f in failures] == [f"{command!r} exited 3: checked"]
    else:
        assert [f.reason for f in failures] == [f"{command!r} did not finish within 1 s"]


class _FakeNvml(types.SimpleNamespace):
    """NVML's API shape with two GPUs; GPU 1 asks for a reset."""

    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 1
    NVML_SUCCESS = 0
    NVML_GPU_RECOVERY_ACTION_NONE = 0
    NVML_GPU_RECOVERY_ACTION_GPU_RESET = 1

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetFieldValues(self, handle: int, fields: list[int]) -> list[Any]:
        value = types.SimpleNamespace(uiVal=handle)
        return [types.SimpleNamespace(nvmlReturn=0, value=value)]


def test_gpu_check_names_the_gpu_and_its_recovery_action() -> None:
    nvml = _FakeNvml()
    failures, skipped = check_gpus(lambda: nvml)
    assert skipped is None
    assert nvml.shut
    assert failures == [HealthFailure("gpu", "GPU 1 needs recovery action GPU_RESET")]


def test_gpu_check_is_skipped_once_without_nvml(caplog: pytest.LogCaptureFixture) -> None:
    def no_nvml() -> Any:
        raise ImportError("No module named 'pynvml'")

    checker = NodeHealthChecker(HealthSettings(gpu=True), load_nvml=no_nvml)
    with caplog.at_level("INFO", logger="nvrx.launcher"):
        first, second = checker.check(), checker.check()
    assert first.healthy
    assert second.healthy
    assert first.skipped == ("gpu: NVML is not available (No module named 'pynvml')",)
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert said == ["health check skipped: gpu: NVML is not available (No module named 'pynvml')"]


def test_all_failures_are_gathered_with_their_reasons(tmp_path: pathlib.Path) -> None:
    state, down = _fake_ib(tmp_path / "ib", {"mlx5_0": ("4: ACTIVE", 0)})
    settings = HealthSettings(
        gpu=False,
        nic=True,
        link_state_path_template=state,
        link_down_path_template=down,
        storage_paths=(str(tmp_path / "absent"),),
        command=f"{sys.executable} -c 'exit(1)'",
    )
    checker = NodeHealthChecker(settings)
    assert [f.check for f in checker.check().failures] == ["storage", "command"]
    (tmp_path / "ib/mlx5_0/ports/1/state").write_text("1: DOWN\n")
    health = checker.check()
    assert not health.healthy
    assert [f.check for f in health.failures] == ["nic", "storage", "command"]
    assert health.reason.startswith("nic: mlx5_0 port went from ACTIVE to 1: DOWN; storage: ")


@pytest.mark.gpu
def test_gpu_check_on_a_real_gpu_passes_without_skipping() -> None:
    failures, skipped = check_gpus()
    assert skipped is None
    assert failures == []


@pytest.mark.timeout(30)
def test_user_command_that_daemonises_leaves_nothing_behind(tmp_path: pathlib.Path) -> None:
    # setsid takes the child out of the check's session; under a subreaper launcher it
    # comes back as the launcher's child, marked, and the check kills it.
    reaper = Reaper()
    pid_file = tmp_path / "daemon.pid"
    command = f"sh -c 'setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {pid_file}'"
    try:
        assert reaper.active
        assert check_command(command, timeout=5.0) == []
        daemon = int(pid_file.read_text())
        try:
            assert _wait_gone(daemon), f"the command's daemon {daemon} outlived the check"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon, signal.SIGKILL)
    finally:
        assert reaper.close() == [], "nothing was left for the launcher's end"
