"""The fault-tolerant elastic agent: torch's LocalElasticAgent with monitors and job-wide restarts.

It keeps torch's rendezvous, rank assignment, worker environment, log handling and
process management, and replaces the run loop so that:

- every tick waits on the monitors' event socket, so events wake it at once;
- a failed rank, a rank killed by its monitor, or a dead monitor whose rank was
  connected ends the cycle with a job-wide decision (see :mod:`.coordination`);
- other nodes learn of the decision from the store within one monitor interval;
- restarts are charged to a job-wide budget and stop when no progress is made;
- workload control requests (exclude this node, shut the workload down) act now.

The agent is torch's glue plus calls: what ends a cycle is :func:`._cycle_end.cycle_end`,
applying the decision is :func:`._apply_decision.apply_decision`, the exit barrier
:func:`._exit_barrier.await_other_nodes`, the hang's attribution as soon as its evidence
is in and the wait for it :mod:`._hang_wait` (see docs/design/launcher-internals.md).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

from torch.distributed.elastic.agent.server.api import (
    DEFAULT_ROLE,
    RunResult,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import LogsSpecs

from nvrx.ft import STRAGGLER_SCORES_ENV

from . import _torch_compat as compat
from ._apply_decision import TorchSteps, apply_decision
from ._cluster import ClusterOptions
from ._cluster_steps import ClusterSteps
from ._coordination import Decision, JobCoordinator, JobState
from ._cycle_decisions import decider, end_trigger
from ._cycle_end import End, Seen, Workers, cycle_end
from ._cycle_start import CycleStart
from ._cycle_state import CycleState
from ._deterministic import RepeatWatch
from ._events import AllNodesFinished, Recorder, StoreValueIgnored
from ._exit_barrier import await_other_nodes
from ._failure_report import name_crashes, report_failures
from ._goodput_feed import GoodputFeed
from ._hang_wait import attribute_when_in, await_hang_evidence, tick_wait_s
from ._job_key import KEY_ENV, KEY_FILE_ENV, load_job_key
from ._launcher_exit import LauncherExit
from ._local_ckpt import RestoreWatch
from ._log_lines import log_line
from ._monitors import MonitorSupervisor
from ._numa import NumaPlan
from ._policy import RestartPolicy, Trigger
from ._progress import check_progress_file
from ._rank_reports import RankReports
from ._rendezvous import renew_worker_store
from ._rendezvous_membership import Membership
from ._signed_store import journal_rejections
from ._spares import SparePool, spare_handlers
from ._straggler_feed import SCORES_FILE_NAME
from ._straggler_reports import StragglerReports
from ._torch_compat import Store
from ._wakeup import Wakeup
from ._worker_poll import WORKERS, check_workers, kill_process_groups
from .exit_codes import ExitCode
from .metrics import NULL_RECORDER, NullRecorder

__all__ = ["FtAgent", "RestartPolicy"]

logger = logging.getLogger("nvrx.launcher")


def _job_key(multi_node: bool) -> bytes | None:
    """The job key from the environment (kept from the ranks).

    Without one a multi-node job warns (another machine can reach its store); a
    single-node job says so at INFO, with what to do on a shared machine.
    """
    try:
        key = load_job_key(os.environ)
    except ValueError as exc:
        raise LauncherExit(int(ExitCode.USAGE_ERROR), str(exc)) from None
    # The ranks and everything they start inherit the environment; they need no key.
    os.environ.pop(KEY_ENV, None)
    os.environ.pop(KEY_FILE_ENV, None)
    if key is None and multi_node:
        logger.warning(
            "no job key (%s or %s): job decisions in the rendezvous store are not "
            "authenticated, so anyone who can reach the store's port can stop or restart "
            "this job; see the launcher guide, 'Securing the rendezvous store'",
            KEY_ENV,
            KEY_FILE_ENV,
        )
    elif key is None:
        logger.info(
            "single node without a job key: on a machine shared with other users, set %s "
            "or %s so only this job's launchers can steer it (launcher guide, 'Securing "
            "the rendezvous store')",
            KEY_ENV,
            KEY_FILE_ENV,
        )
    return key


def _check_progress_file(path: str | None) -> None:
    """``--ft-progress-file`` is usable (exit 2 naming it when not)."""
    if path is None:
        return
    try:
        check_progress_file(path)
    except ValueError as exc:
        why = f"--ft-progress-file {path!r}: {exc}"
        raise LauncherExit(int(ExitCode.USAGE_ERROR), why) from None


class FtAgent(LocalElasticAgent):
    """A LocalElasticAgent whose ranks are watched by monitors and restarted job-wide."""

    def __init__(
        self,
        spec: WorkerSpec,
        logs_specs: LogsSpecs,
        policy: RestartPolicy,
        monitors: MonitorSupervisor,
        *,
        term_timeout: float,
        recorder: Recorder,
        start_method: str = "spawn",
        log_line_prefix_template: str | None = None,
        spares: SparePool | None = None,
        metrics: NullRecorder = NULL_RECORDER,
        cluster: ClusterOptions | None = None,
        numa: NumaPlan | None = None,
        local_ckpt_dir: str | os.PathLike[str] | None = None,
        multi_node: bool = True,
    ) -> None:
        super().__init__(
            spec,
            logs_specs,
            start_method=start_method,
            exit_barrier_timeout=policy.exit_barrier_timeout,
            log_line_prefix_template=log_line_prefix_template,
            shutdown_timeout=math.ceil(term_timeout),
        )
        compat.warn_if_untested()
        self._policy = policy
        self._job_key = _job_key(multi_node)
        _check_progress_file(policy.progress_file)
        self._monitors = monitors
        self._node = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        recorder.set_node(self._node)
        self._recorder = recorder
        self._metrics = metrics
        self._goodput = GoodputFeed(recorder, metrics)
        self._coord: JobCoordinator | None = None
        self._state = JobState()
        self._cycle = CycleState(number=0, started=time.time(), progress=None)  # wall clock: label
        # Signed values read without a hook of their own (the run nonce, group ranks,
        # the segment gate) are journalled too; _launch resets it at the end.
        journal_rejections(self._journal_rejected)
        #: The last failed cycle's deterministic-looking failure (see ._deterministic).
        self._repeats = RepeatWatch()
        self._stopping = False
        self._spares = spares
        # Health checks, GPU memory wait, NUMA record, cycle-info file, aligned ranks.
        self._steps = ClusterSteps(
            cluster or ClusterOptions(),
            recorder,
            self._node,
            run_id=spec.rdzv_handler.get_run_id(),
            numa=numa,
            goodput=self._goodput.cycle_goodput,
            job_key=self._job_key,
        )
        self._steps.install(spec.rdzv_handler)
        self._membership = Membership(spec.rdzv_handler, self._steps.after_close)
        # The bus' subscribers, in this order: the cycle-info file, the goodput ledger
        # (and the restart metrics), the monitors' health gauge, the log lines.
        recorder.subscribe(self._steps.on_event)
        recorder.subscribe(self._goodput.on_event)
        recorder.subscribe(metrics.on_event)
        recorder.subscribe(log_line)
        # Rank 0's straggler reports come back through a file in our private directory.
        self._straggler = StragglerReports(
            monitors.runtime_dir / SCORES_FILE_NAME,
            recorder,
            lambda: self._cycle.number,
            metrics=self._metrics,
            on_recorded=lambda: self._goodput.update_gauges(force=True),
        )
        os.environ[STRAGGLER_SCORES_ENV] = self._straggler.path  # the ranks inherit it
        # What the ranks restored from local checkpoints, journalled once per cycle.
        self._restores = None if local_ckpt_dir is None else RestoreWatch(local_ckpt_dir)
        self._reports = RankReports(
            recorder,
            lambda: self._cycle,
            lambda: self._worker_group.spec.local_world_size,
            restores=self._restores,
            progress_file=policy.progress_file,
        )
        # Each start of the ranks: monitors, the new cycle's state and records.
        self._cycle_start = CycleStart(
            monitors=monitors,
            metrics=metrics,
            steps=self._steps,
            straggler=self._straggler,
            reports=self._reports,
            recorder=recorder,
            restores=self._restores,
            progress_file=policy.progress_file,
        )
        # A rank's exit, a monitor's event or another node's decision wake the loop.
        self._wakeup = Wakeup(
            lambda: [self._monitors.fileno(), None if self._coord is None else self._coord.fileno()]
        )
        self._torch = TorchSteps(
            stop_workers=self._stop_group,
            leave_rendezvous=self._membership.leave,
            end_job=self._end_job,
            rendezvous=self._next_round,
            start_workers=self._start_group,
        )

    # -- what the launcher asks after the run ------------------------------------

    @property
    def node_id(self) -> str:
        """This launcher's name in decisions and logs."""
        return self._node

    def kill_leftover_workers(self, timeout: float = 5.0) -> None:
        """SIGKILL the process group of every worker still alive and reap it.

        The launcher's last resort on the way out (e.g. a second signal cut the
        graceful stop short): no rank may outlive it, nor a straggler-report reader.
        """
        self._straggler.close()
        kill_process_groups(compat.worker_processes(self), timeout)

    # -- torch hooks ---------------------------------------------------------------

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        # Torch derives TORCHELASTIC_RESTART_COUNT from _remaining_restarts; we make it
        # the job-wide cycle number, the same on every node.
        spec = worker_group.spec
        compat.set_remaining_restarts(self, spec.max_restarts - self._state.cycle)
        health = self._steps.check_health(self._state.cycle)
        if not health.healthy:
            if self._coord is not None:  # a restart: the others re-form without us
                self._membership.leave()
            raise LauncherExit(
                int(ExitCode.NODE_EXCLUDED), f"this node failed its health check: {health.reason}"
            )
        if self._coord is not None:  # a restart: new ranks get an empty store
            renew_worker_store(spec.rdzv_handler)
        super()._rendezvous(worker_group)
        if self._coord is None:
            # First rendezvous of this launcher (maybe joining a running job): the job
            # state comes from the store. Later ones carry the decision's state, so a
            # quick failure on another node cannot move us past a cycle.
            # WorkerGroup.store is declared as None in torch; the rendezvous set it.
            store = cast(Store, worker_group.store)
            self._coord = JobCoordinator(
                store,
                spec.rdzv_handler.get_run_id(),
                self._node,
                key=self._job_key,
                on_reject=self._journal_rejected,
            )
            self._state = self._coord.state()
        compat.set_remaining_restarts(self, spec.max_restarts - self._state.cycle)

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self._cycle = self._cycle_start.before(self._state.cycle, worker_group)
        with spare_handlers(self._spares) as handlers:
            worker_ids: dict[int, Any] = super()._start_workers(worker_group)
        self._cycle_start.after(self._cycle, worker_group, worker_ids, handlers)
        return worker_ids

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        # Re-entered while a stop was under way means a second signal cut it short (or
        # torch's run() retries after one): escalate to SIGKILL instead of waiting again.
        if self._stopping:
            death_sig, timeout = signal.SIGKILL, 5
        self._stopping = True
        super()._shutdown(death_sig, timeout)
        self._stopping = False

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self._shutdown(signal.SIGTERM, math.ceil(self._policy.workers_stop_timeout))

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        # Ours first, then torch's checks (its pid check; from torch 2.13 its D-state
        # check), those only while every rank runs, as torch runs its D-state check. Not
        # torch's _monitor_workers as a whole: its _pcontext.wait(0) closes every rank
        # (SIGTERM, then up to 30 s) once one has failed, inside this tick, before
        # --workers-stop-timeout, the hang evidence and the decision (see _worker_poll).
        pc = compat.worker_processes(self)
        if pc is None:
            raise TypeError("workers must run as subprocesses")
        result = check_workers(pc, worker_group, self._cycle.terminated)
        if result.state != WorkerState.HEALTHY:
            return result
        torch_says = compat.pid_mismatch(self, worker_group) or compat.uninterruptible_state(
            self, worker_group
        )
        return torch_says if torch_says is not None else result

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> RunResult:
        spec = self._worker_group.spec
        logger.info(
            "[%s] node %s: starting %d worker(s)", spec.role, self._node, spec.local_world_size
        )
        try:
            with self._wakeup:
                self._initialize_workers(self._worker_group)
                while True:
                    self._wakeup.wait(tick_wait_s(self._cycle, spec.monitor_interval))
                    result = self._tick()
                    if result is not None:
                        return result
        finally:
            if self._coord is not None:
                self._coord.close()

    # -- the glue apply_decision drives ----------------------------------------------

    def _stop_group(self) -> None:
        self._stop_workers(self._worker_group)
        self._worker_group.state = WorkerState.STOPPED

    def _next_round(self, state: JobState) -> None:
        self._state = state
        self._rendezvous(self._worker_group)

    def _start_group(self) -> None:
        wg = self._worker_group
        for local_rank, worker_id in self._start_workers(wg).items():
            wg.workers[local_rank].id = worker_id
        wg.state = WorkerState.HEALTHY

    def _end_job(self, *, all_finished: bool = False) -> None:
        """The job ends here for every node: a stop or shutdown decision, or every node's
        ranks finished (``all_finished``, past the exit barrier)."""
        cycle, world = self._cycle.number, self._worker_group.group_world_size or 1
        if all_finished:
            self._recorder.record(AllNodesFinished(cycle=cycle))
        # A straggler report rank 0 wrote as it ended is read first, so it counts.
        self._straggler.record_new(now=True)
        self._goodput.journal_summary(
            nodes=world, node=self._node, cycle=cycle, coordinator=self._coordinator
        )
        self._membership.close()
        if all_finished or world > 1:  # the store's host stays until every node is done
            self._coordinator().leave(cycle, world)

    # -- the loop ------------------------------------------------------------------

    def _coordinator(self) -> JobCoordinator:
        assert self._coord is not None, "no rendezvous yet"
        return self._coord

    def _drain_events(self) -> None:
        """Act on the monitors' events (:meth:`._rank_reports.RankReports.handle`)."""
        self._reports.handle(self._monitors.drain_events(), time.time())  # wall clock: label

    def _cycle_end(self, seen: Seen) -> End | None:
        """:func:`cycle_end` of what this tick saw, with the cycle's rank requests."""
        shutdown, exclude = self._cycle.shutdown_request, self._cycle.exclude_request
        return cycle_end(
            dataclasses.replace(
                seen, shutdown_requested=shutdown is not None, exclude_requested=exclude is not None
            )
        )

    def _tick(self) -> RunResult | None:
        noticed = time.time()  # wall clock: label
        self._cycle.noticed_mono = time.monotonic()
        wg = self._worker_group
        self._reports.handle(self._monitors.drain_events(), noticed)
        pc = compat.worker_processes(self)
        if pc is not None:  # the hang named now, not once its ranks have exited
            attribute_when_in(self._cycle, pc.subprocess_handlers, wg, self._recorder)
        if self._spares is not None:
            self._spares.fill_when_up(self._cycle, wg.spec.local_world_size)
        self._reports.journal_progress()
        self._reports.journal_restore()
        self._straggler.record_new()
        self._goodput.update_gauges()
        dead = self._monitors.dead()
        causes = self._reports.monitors_died(dead)
        for local_rank in sorted(dead):
            self._monitors.replace(local_rank)

        decision = self._coordinator().decided(self._cycle.number)
        result = self._monitor_workers(wg)
        seen = Seen(
            decided=decision is not None,
            workers=WORKERS.get(result.state, Workers.HEALTHY),
            watched_monitor_died=bool(causes),
            nodes_waiting=self._membership.nodes_waiting(),
        )
        end = self._cycle_end(seen)
        if end is None:
            return None
        if end is End.FOLLOW and decision is not None:
            return self._apply(decision, noticed)
        if end is End.FAILURE:
            return self._end_on_failure(result, causes, noticed)
        if end is End.SUCCESS:
            return self._finish(result)
        trigger, reason, leaves = end_trigger(end, self._cycle, self._node)
        return self._decide(trigger, reason, noticed, exclusion_requested=leaves)

    def _end_on_failure(
        self, result: RunResult, causes: list[str], noticed: float
    ) -> RunResult | None:
        """Decide on a failure: name it, wait for hang evidence, attribute it, decide."""
        repeated_error: str | None = None
        if result.state == WorkerState.FAILED:
            name_crashes(self._cycle, result)
            pc = compat.worker_processes(self)
            handlers = {} if pc is None else pc.subprocess_handlers
            wait = self._wakeup.wait
            if await_hang_evidence(self._cycle, handlers, wait=wait, drain=self._drain_events):
                result = self._monitor_workers(self._worker_group)
                # A request that came while waiting still wins over the failure.
                end = self._cycle_end(Seen(workers=Workers.FAILED))
                if end in (End.SHUTDOWN_REQUEST, End.EXCLUDE_REQUEST):
                    trigger, reason, leaves = end_trigger(end, self._cycle, self._node)
                    return self._decide(trigger, reason, noticed, exclusion_requested=leaves)
            stderrs = pc.stderrs if pc is not None else {}
            causes, outcomes = report_failures(
                self._cycle, result, self._worker_group, stderrs, self._recorder, causes=causes
            )
            first_step_seen = bool(self._cycle.first_steps)
            repeated_error = self._repeats.repeated_error(outcomes, first_step_seen=first_step_seen)
        else:
            if result.state == WorkerState.UNKNOWN:
                causes.append(
                    "torch's check found the worker pids do not match its process context"
                )
            self._repeats.forget()  # a dead monitor: not a deterministic failure
        reason = f"on node {self._node}: " + "; ".join(causes)
        return self._decide(Trigger.FAILURE, reason, noticed, repeated_error=repeated_error)

    def _journal_rejected(self, key: str, why: str) -> None:
        self._recorder.record(StoreValueIgnored(cycle=self._cycle.number, key=key, why=why))

    # -- deciding and acting on a decision --------------------------------------------

    def _decide(
        self,
        trigger: Trigger,
        reason: str,
        noticed: float,
        *,
        exclusion_requested: bool = False,
        repeated_error: str | None = None,
    ) -> RunResult | None:
        """Ask for the cycle's decision (``trigger`` if this node wins), then apply it."""
        make: Callable[[JobState], Decision] = decider(
            trigger,
            reason,
            policy=self._policy,
            node=self._node,
            progress_before=self._cycle.progress,
            repeated_error=repeated_error,
        )
        decision = self._coordinator().decide(self._cycle.number, make)
        return self._apply(decision, noticed, exclusion_requested=exclusion_requested)

    def _apply(
        self, decision: Decision, noticed: float, *, exclusion_requested: bool = False
    ) -> RunResult | None:
        """Follow ``decision`` (:func:`._apply_decision.apply_decision`); None after a restart."""
        self._reports.journal_restore(final=True)
        apply_decision(
            decision,
            self._cycle,
            self._torch,
            noticed=noticed,
            node=self._node,
            recorder=self._recorder,
            max_restarts=self._policy.max_restarts,
            exclusion_requested=exclusion_requested,
        )
        return None

    def _finish(self, result: RunResult) -> RunResult | None:
        """Local workers all succeeded: wait for the other nodes, or follow a restart."""
        coord = self._coordinator()
        cycle = self._cycle.number
        world = self._worker_group.group_world_size or 1
        logger.debug("local workers finished")
        coord.arrive(cycle)
        self._reports.journal_restore(final=True)
        decision = await_other_nodes(
            coord,
            cycle,
            world,
            timeout=self._policy.exit_barrier_timeout,
            wait=lambda: self._wakeup.wait(self._worker_group.spec.monitor_interval),
            drain=self._monitors.drain_events,
        )
        if decision is not None:
            self._cycle.noticed_mono = time.monotonic()
            return self._apply(decision, time.time())  # wall clock: label
        self._end_job(all_finished=True)
        logger.debug("left the job")
        return result
