"""Node health checks before a node joins a rendezvous (first start and every restart).

A node that would only crash its ranks again (a lost GPU, a NIC port down, a scratch
file system that hangs) should leave the job before it joins, so the other nodes'
rendezvous goes on without it (a standby node takes its place where there is one).
Each check returns its failures with the reason; :class:`NodeHealth` gathers them (and
the checks that could not run here, said once at INFO): never a bare bool, so the
journal and the exit message say what was wrong.

The checks and what they read:

- ``gpu``: NVML (``pynvml``): every GPU must be reachable and ask for no recovery
  action; skipped without NVML or GPUs (a CPU machine);
- ``nic``: a NIC port (state file ``link_state_path_template``, NVRx's default
  ``/sys/class/infiniband/{nic}/ports/1/state``) fails the node when it went from ACTIVE
  to anything else since the previous check of this launcher, or when its
  ``link_downed`` counter (``link_down_path_template``) grew; a port that is not ACTIVE
  at its first check (an unused port) is logged once and is no failure: NVRx's outcome;
- ``storage``: each path must exist and take a file written, synced and removed within
  :data:`STORAGE_TIMEOUT_S` (a hung mount fails instead of hanging the launcher);
- ``command``: ``--ft-node-health-check-cmd`` must exit 0 within
  :data:`COMMAND_TIMEOUT_S`; its last output line is the reason when it does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ._reaper import sweep

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

DEFAULT_LINK_STATE_PATH_TEMPLATE = "/sys/class/infiniband/{nic}/ports/1/state"
DEFAULT_LINK_DOWN_PATH_TEMPLATE = "/sys/class/infiniband/{nic}/ports/1/counters/link_downed"
#: How long a storage path may take to take a small file (a hung NFS/Lustre mount fails).
STORAGE_TIMEOUT_S = 30.0
#: How long the user's health check command may run.
COMMAND_TIMEOUT_S = 60.0
#: Marks what a health-check command starts, so that what leaves its session is found.
HEALTH_CHECK_ENV = "NVRX_HEALTH_CHECK"
_REASON_CHARS = 500


@dataclasses.dataclass(frozen=True)
class HealthFailure:
    """One failed check: which (``gpu``, ``nic``, ``storage``, ``command``) and why."""

    check: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"check": self.check, "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class NodeHealth:
    """What the checks found: failures (none: healthy) and checks that could not run."""

    failures: tuple[HealthFailure, ...] = ()
    skipped: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.failures

    @property
    def reason(self) -> str:
        """The failures in one line, for the exit message."""
        return "; ".join(f"{f.check}: {f.reason}" for f in self.failures)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


# --- GPU ---------------------------------------------------------------------------


def _load_nvml() -> Any:
    import pynvml

    return pynvml


def check_gpus(load_nvml: Callable[[], Any] = _load_nvml) -> tuple[list[HealthFailure], str | None]:
    """NVML's view of every GPU; (failures, why skipped or None)."""
    try:
        nvml = load_nvml()
        nvml.nvmlInit()
    except Exception as exc:
        return [], f"gpu: NVML is not available ({_short(str(exc)) or type(exc).__name__})"
    failures: list[HealthFailure] = []
    try:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            return [], "gpu: NVML sees no GPU"
        for index in range(count):
            reason = _gpu_problem(nvml, index)
            if reason is not None:
                failures.append(HealthFailure("gpu", reason))
    except Exception as exc:
        failures.append(HealthFailure("gpu", f"NVML failed: {_short(str(exc))}"))
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return failures, None


def _gpu_problem(nvml: Any, index: int) -> str | None:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        return f"GPU {index} is not reachable: {_short(str(exc))}"
    action_field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if action_field is None:  # bindings older than driver r570's recovery actions
        return None
    try:
        value = nvml.nvmlDeviceGetFieldValues(handle, [action_field])[0]
    except Exception as exc:
        lost = getattr(nvml, "NVMLError_GpuIsLost", None)
        if lost is not None and isinstance(exc, lost):
            return f"GPU {index} is lost: {exc}"
        return None  # not supported by this driver
    if getattr(value, "nvmlReturn", 0) != getattr(nvml, "NVML_SUCCESS", 0):
        return None
    action = int(value.value.uiVal)
    if action == getattr(nvml, "NVML_GPU_RECOVERY_ACTION_NONE", 0):
        return None
    names = {
        getattr(nvml, n): n.removeprefix("NVML_GPU_RECOVERY_ACTION_")
        for n in dir(nvml)
        if n.startswith("NVML_GPU_RECOVERY_ACTION_")
    }
    return f"GPU {index} needs recovery action {names.get(action, action)}"


# --- NIC ---------------------------------------------------------------------------


def _nics(template: str) -> list[str]:
    """The NIC names the template's ``{nic}`` matches on this machine, sorted."""
    head, _, tail = template.partition("{nic}")
    found = []
    for path in glob.glob(glob.escape(head) + "*" + glob.escape(tail)):
        name = path[len(head) : len(path) - len(tail) if tail else None]
        if name and "/" not in name:
            found.append(name)
    return sorted(found)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as stream:
            return stream.read(256).strip()
    except OSError:
        return None


class NicCheck:
    """Port states and link_downed counters, each compared with this launcher's last check.

    A failure is a change for the worse (ACTIVE to not ACTIVE, a grown counter), so a
    port that was never up, e.g. one not cabled, does not keep every node out of the job.
    """

    def __init__(self, state_template: str | None, down_template: str | None) -> None:
        self._state_template = state_template or DEFAULT_LINK_STATE_PATH_TEMPLATE
        self._down_template = down_template or DEFAULT_LINK_DOWN_PATH_TEMPLATE
        self._active: dict[str, bool] = {}
        self._downed: dict[str, int] = {}

    def check(self) -> tuple[list[HealthFailure], str | None]:
        nics = _nics(self._state_template)
        if not nics:
            return [], f"nic: no NIC matches {self._state_template}"
        failures = []
        for nic in nics:
            failure = self._state_change(nic)
            if failure is not None:
                failures.append(failure)
            text = _read(self._down_template.format(nic=nic))
            if text is None or not text.isdigit():
                continue
            downed, before = int(text), self._downed.get(nic)
            self._downed[nic] = downed
            if before is not None and downed > before:
                failures.append(
                    HealthFailure("nic", f"{nic} link went down {downed - before} time(s)")
                )
        return failures, None

    def _state_change(self, nic: str) -> HealthFailure | None:
        state = _read(self._state_template.format(nic=nic))
        active = state is not None and "ACTIVE" in state.upper()
        before = self._active.get(nic)
        self._active[nic] = active
        if active:
            return None
        said = state or "unreadable"
        if before is None:
            logger.warning(
                "NIC %s port state is %s at this launcher's first check: not a failure; "
                "the node leaves the job if a port goes from ACTIVE to not ACTIVE",
                nic,
                said,
            )
            return None
        if before:
            return HealthFailure("nic", f"{nic} port went from ACTIVE to {said}")
        return None


# --- storage -----------------------------------------------------------------------


def _probe_storage(path: str) -> str | None:
    """Why ``path`` cannot take a small file, or None when it can."""
    if not os.path.exists(path):
        return f"{path} does not exist"
    directory = path if os.path.isdir(path) else os.path.dirname(path) or "."
    probe = os.path.join(directory, f".nvrx-health-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"nvrx")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{directory} is not writable: {exc.strerror or exc}"
    return None


def check_storage(paths: Sequence[str], timeout: float = STORAGE_TIMEOUT_S) -> list[HealthFailure]:
    """Each path in a thread of its own, so a hung mount costs ``timeout``, not forever."""
    results: dict[str, str | None] = {}
    threads = []
    for path in paths:

        def probe(path: str = path) -> None:
            results[path] = _probe_storage(path)

        thread = threading.Thread(target=probe, name=f"nvrx-storage-check {path}", daemon=True)
        thread.start()
        threads.append((path, thread))
    failures = []
    for path, thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            failures.append(HealthFailure("storage", f"{path} did not answer within {timeout:g} s"))
        elif results.get(path) is not None:
            failures.append(HealthFailure("storage", str(results[path])))
    return failures


# --- the user's command ------------------------------------------------------------


def check_command(command: str, timeout: float = COMMAND_TIMEOUT_S) -> list[HealthFailure]:
    """Run ``command`` (split like a shell would, not run by one); non-zero is a failure.

    It runs in a session of its own, and whatever it leaves behind in that session
    (a background child) is killed when it ends or times out: nothing outlives the check,
    and a child still holding its output cannot make a healthy node look hung. What it
    started in another session carries ``NVRX_HEALTH_CHECK`` and is killed too, where the
    launcher is a subreaper (:mod:`._reaper`).
    """
    argv = shlex.split(command)
    # What leaves the session (setsid) is marked and comes to the launcher (a subreaper).
    mark = uuid.uuid4().hex
    with tempfile.TemporaryFile() as output:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, HEALTH_CHECK_ENV: mark},
            )
        except OSError as exc:
            return [HealthFailure("command", f"{command!r} could not start: {exc}")]
        try:
            code = _wait_unreaped(proc.pid, timeout)
        finally:
            # The group is killed while its leader is unreaped, so its id cannot be reused.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            sweep(lambda env: env.get(HEALTH_CHECK_ENV) == mark)
        if code is None:
            return [HealthFailure("command", f"{command!r} did not finish within {timeout:g} s")]
        if code == 0:
            return []
        output.seek(0, os.SEEK_END)
        output.seek(max(output.tell() - 4096, 0))
        lines = output.read().decode(errors="replace").strip().splitlines()
    said = f": {_short(lines[-1])}" if lines else ""
    return [HealthFailure("command", f"{command!r} exited {code}{said}")]


def _wait_unreaped(pid: int, timeout: float) -> int | None:
    """Wait up to ``timeout`` for ``pid`` to exit, leaving it a zombie; its exit code."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None:
            if info.si_code == os.CLD_EXITED:
                return info.si_status
            return -info.si_status  # killed by that signal
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)


# --- all of them -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HealthSettings:
    """Which checks run, from the launcher's options and the FT config."""

    gpu: bool = True
    nic: bool = False
    link_state_path_template: str | None = None
    link_down_path_template: str | None = None
    storage_paths: tuple[str, ...] = ()
    command: str | None = None

    @property
    def any(self) -> bool:
        return self.gpu or self.nic or bool(self.storage_paths) or self.command is not None


class NodeHealthChecker:
    """Runs the configured checks; says once which could not run here and why."""

    def __init__(self, settings: HealthSettings, load_nvml: Callable[[], Any] = _load_nvml) -> None:
        self.settings = settings
        self._load_nvml = load_nvml
        self._nic = (
            NicCheck(settings.link_state_path_template, settings.link_down_path_template)
            if settings.nic
            else None
        )
        self._said: set[str] = set()

    def check(self) -> NodeHealth:
        failures: list[HealthFailure] = []
        skipped: list[str] = []
        s = self.settings
        if s.gpu:
            found, skip = check_gpus(self._load_nvml)
            failures += found
            if skip is not None:
                skipped.append(skip)
        if self._nic is not None:
            found, skip = self._nic.check()
            failures += found
            if skip is not None:
                skipped.append(skip)
        if s.storage_paths:
            failures += check_storage(s.storage_paths)
        if s.command is not None:
            failures += check_command(s.command)
        for why in skipped:
            if why not in self._said:
                self._said.add(why)
                logger.info("health check skipped: %s", why)
        return NodeHealth(tuple(failures), tuple(skipped))
