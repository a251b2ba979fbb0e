"""Every private name of torch.distributed.elastic the launcher relies on, in one place.

torch's elastic agent has no public hooks for what ft_launcher changes, so it reaches
into a few internals. Each touch point below says what it relies on and since which
torch it has held; ``tests/test_torch_compat.py`` has one contract test per touch point
that fails naming it if a torch release renames or reshapes it. The launcher is tested
on :data:`TESTED_TORCH`; on another torch it warns once (:func:`warn_if_untested`).

Touch points (what each relies on; all of them were read in torch 2.4 and every later
release up to the tested range):

- ``replace_rendezvous_delay``: ``dynamic_rendezvous._delay(seconds)``, a module global
  torch calls with the literals ``seconds=1`` (sync poll) and ``seconds=(0, 0.3)`` (join
  jitter);
- ``replace_method_name``: ``dynamic_rendezvous.get_method_name()``, a module global
  looked up for every rendezvous event;
- ``set_state_cache_duration``: ``DynamicRendezvousHandler._state_holder``, a
  ``_BackendRendezvousStateHolder`` with ``_cache_duration``;
- ``forget_worker_store``: ``DynamicRendezvousHandler._shared_tcp_store_server`` and
  ``_bootstrap_store_info``, recreated by the next rendezvous when None;
- ``leave_rendezvous``: ``DynamicRendezvousHandler._stop_heartbeats()``,
  ``_op_executor.run(op, deadline)`` and ``_RendezvousExitOp``;
- ``join_deadline``: ``DynamicRendezvousHandler._settings``, a frozen
  ``RendezvousSettings`` whose ``timeout.join`` ``next_rendezvous`` reads for its join
  deadline when called (``RendezvousTimeout(join, last_call, close, heartbeat)``);
- ``rendezvous_store``: ``DynamicRendezvousHandler._store``, the rendezvous' base store
  (c10d: the TCPStore every node reaches; the rounds' stores are prefixes of it);
- ``rendezvous_nodes``: ``DynamicRendezvousHandler._state_holder.sync()``, ``.state``
  with ``participants``, ``wait_list`` and ``redundancy_list`` (node descriptors), and
  ``_this_node``;
- ``subprocess_handler_factory``: ``multiprocessing.api.get_subprocess_handler``, a
  module global ``SubprocessContext`` calls per rank, and ``SubprocessHandler._popen``;
- ``worker_processes``: ``LocalElasticAgent._pcontext``, a ``SubprocessContext`` with
  ``subprocess_handlers``, ``error_files`` and ``stderrs``;
- ``set_remaining_restarts``: ``SimpleElasticAgent._remaining_restarts``, from which
  torch derives ``TORCHELASTIC_RESTART_COUNT``;
- ``pid_mismatch``: the check ``LocalElasticAgent._monitor_workers`` makes first, the
  workers' ``Worker.id`` against ``_pcontext.pids()`` (UNKNOWN on a mismatch), made here
  as torch makes it (it is inline there, not a method);
- ``uninterruptible_state``: ``LocalElasticAgent._check_uninterruptible_state_timeout(
  worker_group, timeout)`` with ``_uninterruptible_state_timeout`` (torch 2.13: UNHEALTHY
  for a rank in D-state past ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``, off unless
  set; absent before 2.13). torch's ``_monitor_workers`` itself is not called: its
  ``_pcontext.wait(0)`` closes every rank (SIGTERM, then up to 30 s) once one has failed,
  inside our tick, before ``--workers-stop-timeout`` and the decision;
- ``Store``, ``PrefixStore``: ``torch.distributed``'s classes, imported from
  ``torch._C._distributed_c10d`` for the type checker;
- the agent's overrides (in ``agent.py``, as a subclass must): ``_rendezvous``,
  ``_start_workers``, ``_stop_workers``, ``_monitor_workers``, ``_shutdown(death_sig,
  timeout)``, ``_invoke_run(role)``, and its use of ``_initialize_workers`` and
  ``_worker_group``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

# torch.distributed exports these very classes at run time, but its type stubs do not
# re-export them, so mypy sees them only here (the contract test checks they are one).
from torch._C._distributed_c10d import PrefixStore, Store
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import api as mp_api
from torch.distributed.elastic.multiprocessing.api import SubprocessContext
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler
from torch.distributed.elastic.rendezvous import RendezvousHandler, dynamic_rendezvous
from torch.torch_version import TorchVersion

__all__ = ["PrefixStore", "Store"]

logger = logging.getLogger("nvrx.launcher")

#: The (major, minor) releases of torch the launcher is tested on, inclusive.
TESTED_TORCH = ((2, 13), (2, 13))
#: The literal torch passes to ``_delay`` for its one-second sync poll.
TORCH_SYNC_DELAY_S = 1
_FACTORY = "get_subprocess_handler"
_warned = False


def untested_torch(version: str) -> str | None:
    """Why ``version`` is outside :data:`TESTED_TORCH`, or None when it is inside.

    Compared as torch compares its own versions (:class:`torch.torch_version.TorchVersion`):
    a pre-release of the next minor (``2.14.0.dev...``, ``2.14.0a0``) is outside.
    """
    low, high = TESTED_TORCH
    parsed = TorchVersion(version)
    try:
        inside = f"{low[0]}.{low[1]}" <= parsed < f"{high[0]}.{high[1] + 1}.dev0"
    except (TypeError, ValueError):  # packaging's InvalidVersion is a ValueError
        return f"torch {version!r} has no major.minor version"
    if inside:
        return None
    return (
        f"ft_launcher is tested on torch {low[0]}.{low[1]} to {high[0]}.{high[1]}, "
        f"not {version}: the torch internals it extends may have changed"
    )


def warn_if_untested(version: str = torch.__version__) -> None:
    """Log once per process when torch is outside the tested range."""
    global _warned
    why = untested_torch(version)
    if why is not None and not _warned:
        _warned = True
        logger.warning("%s", why)


def original_rendezvous_delay() -> Callable[..., None]:
    """torch's own ``dynamic_rendezvous._delay``."""
    delay: Callable[..., None] = dynamic_rendezvous._delay  # type: ignore[attr-defined]
    return delay


def replace_rendezvous_delay(delay: Callable[[float | tuple[float, float]], None]) -> None:
    """Make the dynamic rendezvous sleep through ``delay`` (this process only)."""
    dynamic_rendezvous._delay = delay  # type: ignore[attr-defined,assignment]


def replace_method_name(method_name: Callable[..., str]) -> None:
    """Name the rendezvous' events with ``method_name`` instead of ``inspect.stack()``."""
    dynamic_rendezvous.get_method_name = method_name


def set_state_cache_duration(handler: RendezvousHandler, seconds: float) -> None:
    """Serve the rendezvous state from cache for at most ``seconds`` (default: 1 s)."""
    if isinstance(handler, dynamic_rendezvous.DynamicRendezvousHandler):
        holder = handler._state_holder
        if isinstance(holder, dynamic_rendezvous._BackendRendezvousStateHolder):
            holder._cache_duration = seconds  # type: ignore[assignment]


def forget_worker_store(handler: RendezvousHandler) -> None:
    """Make the next rendezvous create a new, empty store for the ranks."""
    if isinstance(handler, dynamic_rendezvous.DynamicRendezvousHandler):
        handler._shared_tcp_store_server = None
        handler._bootstrap_store_info = None


def leave_rendezvous(handler: RendezvousHandler, timeout_s: float) -> None:
    """Take this node out of the rendezvous now (torch only leaves at the next round)."""
    if not isinstance(handler, dynamic_rendezvous.DynamicRendezvousHandler):
        return
    handler._stop_heartbeats()
    handler._op_executor.run(dynamic_rendezvous._RendezvousExitOp(), time.monotonic() + timeout_s)


@contextlib.contextmanager
def join_deadline(handler: RendezvousHandler, seconds: float) -> Iterator[None]:
    """Torch's join timeout of ``handler`` is ``seconds`` for the joins made inside.

    Its own join timeout (``--rdzv-conf join_timeout``) stays for every other join, and
    for the rest of a join once the node leaves torch's redundancy list (torch's op
    executor then takes a new deadline from its own copy of the settings).
    """
    if not isinstance(handler, dynamic_rendezvous.DynamicRendezvousHandler):
        yield
        return
    settings = handler._settings
    timeout = settings.timeout
    handler._settings = dataclasses.replace(
        settings,
        timeout=dynamic_rendezvous.RendezvousTimeout(
            join=datetime.timedelta(seconds=seconds),
            last_call=timeout.last_call,
            close=timeout.close,
            heartbeat=timeout.heartbeat,
        ),
    )
    try:
        yield
    finally:
        handler._settings = settings


def rendezvous_store(handler: RendezvousHandler) -> Store | None:
    """The dynamic rendezvous' base store (shared by every round), or None."""
    if not isinstance(handler, dynamic_rendezvous.DynamicRendezvousHandler):
        return None
    store = getattr(handler, "_store", None)
    return store if isinstance(store, Store) else None


def rendezvous_nodes(handler: RendezvousHandler) -> tuple[int, bool] | None:
    """(nodes the rendezvous knows: in the round, waiting or redundant; this one of them).

    None for another handler. Dead nodes count until torch's keep-alive drops them.
    """
    if not isinstance(handler, dynamic_rendezvous.DynamicRendezvousHandler):
        return None
    with handler._heartbeat_lock:
        handler._state_holder.sync()
        state = handler._state_holder.state
        nodes = {*state.participants, *state.wait_list, *state.redundancy_list}
    return len(nodes), handler._this_node in nodes


@contextlib.contextmanager
def subprocess_handler_factory(
    factory: Callable[..., SubprocessHandler],
) -> Iterator[bool]:
    """While open, torch creates each rank's handler with ``factory``.

    Yields False (and changes nothing) if this torch has no such factory.
    """
    original = getattr(mp_api, _FACTORY, None)
    if original is None:
        yield False
        return
    setattr(mp_api, _FACTORY, factory)
    try:
        yield True
    finally:
        setattr(mp_api, _FACTORY, original)


def worker_processes(agent: LocalElasticAgent) -> SubprocessContext | None:
    """The agent's running workers, if they run as subprocesses."""
    pc: Any = agent._pcontext
    return pc if isinstance(pc, SubprocessContext) else None


def set_remaining_restarts(agent: LocalElasticAgent, remaining: int) -> None:
    """Set what torch derives ``TORCHELASTIC_RESTART_COUNT`` from (max_restarts - this)."""
    agent._remaining_restarts = remaining


def pid_mismatch(agent: LocalElasticAgent, worker_group: WorkerGroup) -> RunResult | None:
    """torch's first check in ``_monitor_workers``: UNKNOWN when the workers' pids are not
    the process context's (logged as torch logs it), else None."""
    pc: Any = agent._pcontext
    if pc is None:
        return None
    worker_pids = {w.id for w in worker_group.workers}
    pc_pids = set(pc.pids().values())
    if worker_pids == pc_pids:
        return None
    logger.error(
        "[%s] worker pids do not match process_context pids. Expected: %s, actual: %s",
        worker_group.spec.role,
        worker_pids,
        pc_pids,
    )
    return RunResult(state=WorkerState.UNKNOWN)


def uninterruptible_state(agent: LocalElasticAgent, worker_group: WorkerGroup) -> RunResult | None:
    """torch's D-state check (torch 2.13; None before it, or when its timeout is unset):
    UNHEALTHY, with restarts disabled as torch does, for a rank in D-state too long."""
    timeout = getattr(agent, "_uninterruptible_state_timeout", 0)
    check = getattr(agent, "_check_uninterruptible_state_timeout", None)
    if check is None or not timeout or timeout <= 0:
        return None
    result: RunResult | None = check(worker_group, timeout)
    return result
