"""One contract test per private torch name the launcher relies on (see _torch_compat).

Each fails naming its touch point when a torch release renames or reshapes it, instead
of the launcher silently getting slower or reading stale state.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import logging
import os
import re
import signal
import sys
import time
from typing import Any

import pytest
import torch
import torch.distributed
from torch.distributed.elastic.agent.server import api as agent_api
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
from torch.distributed.elastic.multiprocessing import api as _mp_api
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler
from torch.distributed.elastic.rendezvous import RendezvousTimeoutError, dynamic_rendezvous
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from nvrx.launcher import _torch_compat as compat

mp_api: Any = _mp_api  # get_subprocess_handler is not in its __all__
dist: Any = torch.distributed  # its stubs do not re-export the store classes


def _source(obj: object) -> str:
    return inspect.getsource(obj)  # type: ignore[arg-type]


def _handler() -> dynamic_rendezvous.DynamicRendezvousHandler:
    tcp = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=5),
    )
    backend = C10dRendezvousBackend(tcp, "contract")
    handler: dynamic_rendezvous.DynamicRendezvousHandler
    handler = dynamic_rendezvous.DynamicRendezvousHandler.from_backend(
        "contract", tcp, backend, min_nodes=1, max_nodes=1
    )
    return handler


def test_tested_torch_range_and_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert compat.untested_torch(torch.__version__) is None, "this torch is outside TESTED_TORCH"
    assert compat.untested_torch("2.13.0+cpu") is None
    assert "tested on torch 2.13 to 2.13, not 2.14.0" in str(compat.untested_torch("2.14.0"))
    assert compat.untested_torch("2.11.1") is not None
    assert compat.untested_torch("2.13.0") is None
    assert compat.untested_torch("2.12.1") is not None
    assert compat.untested_torch("2.13.1+cu130") is None
    assert compat.untested_torch("2.14.0a0+git1234") is not None  # a nightly of the next one
    assert compat.untested_torch("2.13.0rc1") is not None
    assert compat.untested_torch("garbage") is not None
    compat._warned = False
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        compat.warn_if_untested("3.0.0")
        compat.warn_if_untested("3.0.0")
    assert [r.message for r in caplog.records].count(str(compat.untested_torch("3.0.0"))) == 1


def test_public_store_classes_are_the_ones_compat_names() -> None:
    assert dist.Store is compat.Store, "Store: torch.distributed.Store moved"
    assert dist.PrefixStore is compat.PrefixStore, "PrefixStore moved"


def test_replace_rendezvous_delay() -> None:
    delay = dynamic_rendezvous._delay  # type: ignore[attr-defined]
    assert list(inspect.signature(delay).parameters) == ["seconds"], "_delay(seconds) changed"
    source = _source(dynamic_rendezvous)
    assert "_delay(seconds=1)" in source, "_delay: the 1 s sync poll literal changed"
    assert "_delay(seconds=(0, 0.3))" in source, "_delay: the join jitter literal changed"
    assert compat.TORCH_SYNC_DELAY_S == 1


def test_replace_method_name() -> None:
    assert callable(dynamic_rendezvous.get_method_name), "get_method_name is gone"
    # Looked up as a module global at each event, so replacing the global takes effect.
    assert "get_method_name()" in _source(dynamic_rendezvous.DynamicRendezvousHandler)


def test_set_state_cache_duration() -> None:
    handler = _handler()
    holder = handler._state_holder
    assert isinstance(holder, dynamic_rendezvous._BackendRendezvousStateHolder), (
        "_state_holder is no longer a _BackendRendezvousStateHolder"
    )
    assert hasattr(holder, "_cache_duration"), "_BackendRendezvousStateHolder._cache_duration"
    compat.set_state_cache_duration(handler, 0.1)
    assert holder._cache_duration == 0.1
    assert "self._cache_duration" in _source(dynamic_rendezvous._BackendRendezvousStateHolder.sync)


def test_forget_worker_store() -> None:
    handler = _handler()
    for name in ("_shared_tcp_store_server", "_bootstrap_store_info"):
        assert hasattr(handler, name), f"DynamicRendezvousHandler.{name} is gone"
    source = _source(dynamic_rendezvous.DynamicRendezvousHandler)
    assert "self._shared_tcp_store_server is None" in source, (
        "forget_worker_store: the next rendezvous no longer recreates a None worker store"
    )
    compat.forget_worker_store(handler)
    assert handler._shared_tcp_store_server is None
    assert handler._bootstrap_store_info is None


def test_leave_rendezvous() -> None:
    handler = _handler()
    assert callable(handler._stop_heartbeats), "DynamicRendezvousHandler._stop_heartbeats"
    run = handler._op_executor.run
    assert list(inspect.signature(run).parameters)[:2] == ["state_handler", "deadline"], (
        "_op_executor.run(op, deadline) changed"
    )
    assert callable(dynamic_rendezvous._RendezvousExitOp), "_RendezvousExitOp is gone"
    compat.leave_rendezvous(handler, timeout_s=5.0)  # leaving a round never joined is fine


@pytest.mark.timeout(60)
def test_join_deadline() -> None:
    """A join that cannot complete (MIN 2, one node) ends at the deadline given, not at
    the handler's own join timeout (60 s here), which comes back afterwards."""
    tcp = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=5),
    )  # fmt: skip
    handler = dynamic_rendezvous.DynamicRendezvousHandler.from_backend(
        "deadline", tcp, C10dRendezvousBackend(tcp, "deadline"), min_nodes=2, max_nodes=2,
        timeout=dynamic_rendezvous.RendezvousTimeout(join=datetime.timedelta(seconds=60)),
    )  # fmt: skip
    settings = handler._settings
    assert isinstance(settings, dynamic_rendezvous.RendezvousSettings)
    assert "self._settings.timeout.join" in _source(handler.next_rendezvous), (
        "next_rendezvous no longer takes its join deadline from _settings.timeout.join"
    )
    started = time.monotonic()
    with compat.join_deadline(handler, 1.0):
        assert handler._settings.timeout.join == datetime.timedelta(seconds=1)
        with pytest.raises(RendezvousTimeoutError):
            handler.next_rendezvous()
    assert time.monotonic() - started < 30
    assert handler._settings is settings
    assert compat.rendezvous_nodes(handler) == (0, False), "it left the round it joined"


def test_rendezvous_store() -> None:
    handler = _handler()
    store = compat.rendezvous_store(handler)
    assert store is not None, "DynamicRendezvousHandler._store is gone or not a Store"
    store.set("contract/key", "v")  # the base store: no round prefix
    assert handler._store.get("contract/key") == b"v"


def test_rendezvous_nodes() -> None:
    handler = _handler()
    assert compat.rendezvous_nodes(handler) == (0, False), "_state_holder.state's node lists"
    state = handler._state_holder.state
    for name in ("participants", "wait_list", "redundancy_list"):
        assert hasattr(state, name), f"_RendezvousState.{name} is gone"
    assert isinstance(handler._this_node, dynamic_rendezvous._NodeDesc)


def test_subprocess_handler_factory() -> None:
    assert callable(getattr(mp_api, "get_subprocess_handler", None)), (
        "multiprocessing.api.get_subprocess_handler is gone"
    )
    assert "get_subprocess_handler(" in _source(mp_api.SubprocessContext), (
        "SubprocessContext no longer creates handlers through the module global"
    )
    assert list(inspect.signature(SubprocessHandler._popen).parameters) == ["self", "args", "env"]
    original = mp_api.get_subprocess_handler

    def factory(**kwargs: object) -> SubprocessHandler:
        raise AssertionError

    with compat.subprocess_handler_factory(factory) as installed:
        assert installed
        assert mp_api.get_subprocess_handler is factory
    assert mp_api.get_subprocess_handler is original


def test_worker_processes_and_remaining_restarts() -> None:
    assert "self._pcontext" in _source(LocalElasticAgent.__init__), "LocalElasticAgent._pcontext"
    simple = _source(agent_api.SimpleElasticAgent)
    assert "spec.max_restarts - self._remaining_restarts" in simple, (
        "TORCHELASTIC_RESTART_COUNT is no longer derived from _remaining_restarts"
    )
    ctx = _source(mp_api.PContext.__init__)
    for name in ("self.error_files", "self.stderrs"):
        assert name in ctx, f"PContext: {name} is gone"
    assert "self.subprocess_handlers" in _source(mp_api.SubprocessContext)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("_rendezvous", ["self", "worker_group"]),
        ("_start_workers", ["self", "worker_group"]),
        ("_stop_workers", ["self", "worker_group"]),
        ("_monitor_workers", ["self", "worker_group"]),
        ("_shutdown", ["self", "death_sig", "timeout"]),
        ("_invoke_run", ["self", "role"]),
        ("_initialize_workers", ["self", "worker_group"]),
    ],
)
def test_agent_overrides(name: str, params: list[str]) -> None:
    method = getattr(LocalElasticAgent, name, None)
    assert method is not None, f"LocalElasticAgent.{name} is gone"
    got = list(inspect.signature(method).parameters)[: len(params)]
    assert got == params, f"LocalElasticAgent.{name}{got} changed"


# What torch's _monitor_workers touches on the agent: the checks _torch_compat repeats
# (pid_mismatch, uninterruptible_state) and the poll it must not make (wait(0)).
_MONITOR_TOUCHES = {"_pcontext", "_uninterruptible_state_timeout"}
_MONITOR_TOUCHES_213 = {"_check_uninterruptible_state_timeout"}


def _torch_213() -> bool:
    return tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 13)


def test_monitor_workers_checks() -> None:
    """torch's _monitor_workers makes no check that pid_mismatch/uninterruptible_state miss."""
    source = _source(LocalElasticAgent._monitor_workers)
    touched = set(re.findall(r"self\.(\w+)", source))
    expected = _MONITOR_TOUCHES | (_MONITOR_TOUCHES_213 if _torch_213() else set())
    if not _torch_213():
        expected.discard("_uninterruptible_state_timeout")
    assert touched == expected, (
        f"_monitor_workers: torch's checks changed (touches {sorted(touched)}): "
        "repeat each new one in _torch_compat.pid_mismatch/uninterruptible_state"
    )
    assert "worker_pids = {w.id for w in worker_group.workers}" in source, (
        "_monitor_workers: the pid check (Worker.id) changed"
    )
    assert "set(self._pcontext.pids().values())" in source, (
        "_monitor_workers: the pid check (_pcontext.pids) changed"
    )
    assert "self._pcontext.wait(0)" in source, "_monitor_workers: the process poll changed"


def _sleepers(logs: DefaultLogsSpecs, n: int) -> Any:
    return start_processes(
        name="contract",
        entrypoint="sleep",
        args={i: ("30",) for i in range(n)},
        envs={i: {} for i in range(n)},
        logs_specs=logs,
    )


def test_pid_mismatch(tmp_path: Any) -> None:
    """torch's pid check on real processes; a dead rank does not stop its siblings."""
    spec = agent_api.WorkerSpec(
        role="contract", local_world_size=2, rdzv_handler=_handler(), entrypoint="sleep"
    )
    logs = DefaultLogsSpecs(log_dir=str(tmp_path))
    agent = LocalElasticAgent(spec, logs)
    pc = _sleepers(logs, 2)
    try:
        agent._pcontext = pc
        workers = agent._worker_group.workers
        got = compat.pid_mismatch(agent, agent._worker_group)
        assert got is not None, "the pid mismatch is not reported"
        assert got.state == agent_api.WorkerState.UNKNOWN, got
        for w in workers:
            w.id = pc.pids()[w.local_rank]
        assert compat.pid_mismatch(agent, agent._worker_group) is None
        os.kill(pc.pids()[0], signal.SIGKILL)
        pc.subprocess_handlers[0].proc.wait(10)
        assert compat.pid_mismatch(agent, agent._worker_group) is None
        assert compat.uninterruptible_state(agent, agent._worker_group) is None
        assert pc.subprocess_handlers[1].proc.poll() is None, "the sibling was stopped"
    finally:
        pc.close()


_VFORK = """
import ctypes
libc = ctypes.CDLL(None)
if libc.vfork() == 0:
    libc.sleep(30)
    libc._exit(0)
"""


def test_uninterruptible_state(tmp_path: Any) -> None:
    """torch 2.13's D-state check, on a real process in D-state (a vfork parent)."""
    if not _torch_213():
        pytest.skip("torch's D-state check is from torch 2.13")
    method = getattr(LocalElasticAgent, "_check_uninterruptible_state_timeout", None)
    assert method is not None, "LocalElasticAgent._check_uninterruptible_state_timeout is gone"
    params = list(inspect.signature(method).parameters)
    assert params == ["self", "worker_group", "timeout"], (
        f"_check_uninterruptible_state_timeout{params} changed"
    )
    spec = agent_api.WorkerSpec(
        role="contract", local_world_size=1, rdzv_handler=_handler(), entrypoint=sys.executable
    )
    logs = DefaultLogsSpecs(log_dir=str(tmp_path))
    agent = LocalElasticAgent(spec, logs)
    assert isinstance(getattr(agent, "_uninterruptible_state_timeout", None), float), (
        "LocalElasticAgent._uninterruptible_state_timeout is gone"
    )
    pc = start_processes(
        name="contract",
        entrypoint=sys.executable,
        args={0: ("-c", _VFORK)},
        envs={0: {}},
        logs_specs=logs,
    )
    pid = pc.pids()[0]
    try:
        agent._pcontext = pc
        agent._worker_group.workers[0].id = pid
        agent._uninterruptible_state_timeout = 0.0
        assert compat.uninterruptible_state(agent, agent._worker_group) is None, "off when unset"
        agent._uninterruptible_state_timeout = 0.3
        got = None
        deadline = time.monotonic() + 20
        while got is None and time.monotonic() < deadline:
            got = compat.uninterruptible_state(agent, agent._worker_group)
            time.sleep(0.1)
        assert got is not None, "a rank in D-state is not reported"
        assert got.state == agent_api.WorkerState.UNHEALTHY, got
        assert agent._remaining_restarts == 0, "torch no longer disables restarts"
    finally:
        children = f"/proc/{pid}/task/{pid}/children"
        with contextlib.suppress(OSError), open(children) as f:
            for child in f.read().split():
                os.kill(int(child), signal.SIGKILL)
        pc.close()
