"""The fault-tolerant elastic agent: torch's LocalElasticAgent with monitors and job-wide restarts.

It keeps torch's rendezvous, rank assignment, worker environment, log handling and
process management, and replaces the run loop so that:

- every tick waits on the monitors' event socket, so events wake it at once;
- a failed rank, a rank killed by its monitor, or a dead monitor whose rank was
  connected ends the cycle with a job-wide decision (see :mod:`.coordination`);
- other nodes learn of the decision from the store within one monitor interval;
- restarts are charged to a job-wide budget and stop when no progress is made;
- workload control requests (exclude this node, shut the workload down) act now.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import socket
import subprocess
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
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from nvrx.ft import STRAGGLER_SCORES_ENV, MonitorEvent
from nvrx.ft._termination import STACK_DUMP_PAUSE_S

from . import _torch_compat as compat
from ._cluster import ClusterOptions
from ._cluster_steps import ClusterSteps
from ._coordination import Decision, JobCoordinator, JobState
from ._cycle_decisions import decider, decision_taken, request_trigger, restart_line
from ._cycle_end import End, Seen, Workers, cycle_end
from ._cycle_state import CycleState
from ._deterministic import FailureSignature, RankOutcome, cycle_signature, repeats
from ._events import (
    AllNodesFinished,
    MonitorDied,
    Recorder,
    Restarted,
    RestartFailed,
    StoreValueIgnored,
    WorkersStarted,
    WorkersStopped,
)
from ._failure_report import (
    attribute_hang,
    describe_failures,
    hang_evidence,
    journal_failures,
    name_crashes,
)
from ._goodput_feed import GoodputFeed
from ._job_key import KEY_ENV, KEY_FILE_ENV, load_job_key
from ._launcher_exit import LauncherExit
from ._local_ckpt import RestoreWatch
from ._log_lines import log_line
from ._monitors import MonitorSupervisor
from ._numa import NumaPlan
from ._policy import RestartPolicy, Trigger
from ._progress import check_progress_file, read_progress
from ._rank_reports import RankReports
from ._rendezvous import renew_worker_store
from ._root_cause import process_failure
from ._spares import SparePool, spare_handlers
from ._straggler_feed import SCORES_FILE_NAME
from ._straggler_reports import StragglerReports
from ._torch_compat import Store
from .exit_codes import ExitCode
from .metrics import NULL_RECORDER, NullRecorder

__all__ = ["FtAgent", "RestartPolicy"]

logger = logging.getLogger("nvrx.launcher")

_WAITING_CHECK_PERIOD_S = 1.0
# Warm spares start once every rank of the cycle connected to its monitor (its own
# start-up is over, so they do not compete with it), or after this long regardless.
_SPARES_AFTER_S = 10.0
# After a hang's first report, how long to wait for the other local ranks' reports (each
# follows its stack dump pause), so the culprit is told from its victims.
_HANG_EVIDENCE_WAIT_S = STACK_DUMP_PAUSE_S + 1.0
#: torch's worker states as :func:`._cycle_end.cycle_end` reads them (others: healthy).
_WORKERS = {
    WorkerState.SUCCEEDED: Workers.SUCCEEDED,
    WorkerState.FAILED: Workers.FAILED,
    WorkerState.UNKNOWN: Workers.PIDS_MISMATCH,
    WorkerState.UNHEALTHY: Workers.UNINTERRUPTIBLE,
}


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


def _on_sigchld(signum: int, frame: object) -> None:
    """Nothing to do here: the wakeup fd already woke the run loop."""


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
        if policy.progress_file is not None:
            try:
                check_progress_file(policy.progress_file)
            except ValueError as exc:
                raise LauncherExit(
                    int(ExitCode.USAGE_ERROR), f"--ft-progress-file {policy.progress_file!r}: {exc}"
                ) from None
        self._monitors = monitors
        self._node = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        recorder.set_node(self._node)
        self._recorder = recorder
        self._metrics = metrics
        self._goodput = GoodputFeed(recorder, metrics)
        self._coord: JobCoordinator | None = None
        self._state = JobState()
        self._cycle = CycleState(number=0, started=time.time(), progress=None)  # wall clock: label
        #: The last failed cycle's deterministic-looking failure (see ._deterministic).
        self._last_signature: FailureSignature | None = None
        self._rendezvous_closed = False
        self._stopping = False
        self._next_waiting_check = 0.0
        self._wake: socket.socket | None = None
        self._spares = spares
        self._cycle_started = False
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

    # -- goodput -------------------------------------------------------------------

    def _journal_goodput(self) -> None:
        """At the job's end: the goodput summary (a straggler report rank 0 wrote as it
        ended is read first, so it counts)."""
        self._straggler.record_new(now=True)
        self._goodput.journal_summary(
            nodes=self._worker_group.group_world_size or 1,
            node=self._node,
            cycle=self._cycle.number,
            coordinator=self._coordinator,
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
        pc = compat.worker_processes(self)
        if pc is None:
            return
        alive = [h.proc for h in pc.subprocess_handlers.values() if h.proc.poll() is None]
        for proc in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        for proc in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))

    # -- torch hooks ---------------------------------------------------------------

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        # Torch derives TORCHELASTIC_RESTART_COUNT from _remaining_restarts; we make it
        # the job-wide cycle number, the same on every node.
        spec = worker_group.spec
        compat.set_remaining_restarts(self, spec.max_restarts - self._state.cycle)
        health = self._steps.check_health(self._state.cycle)
        if not health.healthy:
            if self._coord is not None:  # a restart: the others re-form without us
                self._leave_rendezvous()
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
        for local_rank, code in sorted(self._monitors.dead().items()):
            logger.error(
                "the monitor of local rank %d died (exit code %s); starting a new one",
                local_rank,
                code,
            )
            self._monitors.replace(local_rank)
        self._monitors.wait_ready()
        logger.debug("monitors ready")
        for local_rank in range(worker_group.spec.local_world_size):
            self._metrics.monitor_health(local_rank, True)
        self._steps.before_start(self._state.cycle, restart=self._cycle_started)
        if self._cycle_started:  # a report the last cycle's rank 0 wrote just before it ended
            self._straggler.record_new(now=True)
        self._cycle = CycleState(
            number=self._state.cycle,
            started=time.time(),  # wall clock: label
            progress=read_progress(self._policy.progress_file),
        )
        # The new cycle's rank 0 (maybe on another node, in a smaller world) reports anew:
        # no gauge keeps a score of the last cycle's ranks.
        self._straggler.start_cycle(self._cycle.number, self._cycle.started)
        self._steps.cycle_started(
            self._cycle.number,
            self._state.cycle,
            worker_group.group_rank,
            worker_group.workers[0].world_size if worker_group.workers else 0,
            {w.local_rank: w.global_rank for w in worker_group.workers},
        )
        self._cycle_started = True
        if self._restores is not None:
            self._restores.start_cycle(self._cycle.number, worker_group.spec.local_world_size)
        with spare_handlers(self._spares) as handlers:
            worker_ids: dict[int, Any] = super()._start_workers(worker_group)
        self._reports.rank_pids.new_cycle(worker_ids.values())
        warm = sorted(h.local_rank_id for h in handlers if h.warm)
        if warm:
            logger.info("local ranks %s started from warm spares", warm)
        self._recorder.record(
            WorkersStarted(
                cycle=self._cycle.number,
                restart_count=self._state.cycle,
                group_rank=worker_group.group_rank,
                group_world_size=worker_group.group_world_size,
                ranks={w.local_rank: w.global_rank for w in worker_group.workers},
                pids=worker_ids,
                warm_local_ranks=warm,
            )
        )
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
        # --workers-stop-timeout, the hang evidence and the decision. Ours never stops the
        # siblings of a failed rank itself (the decision does), and a rank its monitor
        # terminated has failed whatever its exit code (a SIGTERM handler may exit 0).
        result = self._check_workers(worker_group)
        if result.state != WorkerState.HEALTHY:
            return result
        torch_says = compat.pid_mismatch(self, worker_group) or compat.uninterruptible_state(
            self, worker_group
        )
        return torch_says if torch_says is not None else result

    def _check_workers(self, worker_group: WorkerGroup) -> RunResult:
        """This node's ranks: failed (also those their monitor terminated), running or done."""
        pc = compat.worker_processes(self)
        if pc is None:
            raise TypeError("workers must run as subprocesses")
        failures: dict[int, ProcessFailure] = {}
        running = False
        for local_rank, handler in pc.subprocess_handlers.items():
            exitcode = handler.proc.poll()
            if exitcode is None:
                running = True
            elif exitcode != 0 or local_rank in self._cycle.terminated:
                worker = worker_group.workers[local_rank]
                failures[worker.global_rank] = process_failure(
                    local_rank, handler.proc.pid, exitcode, pc.error_files[local_rank]
                )
        if failures:
            return RunResult(state=WorkerState.FAILED, failures=failures)
        if running:
            return RunResult(state=WorkerState.HEALTHY)
        return RunResult(
            state=WorkerState.SUCCEEDED,
            return_values={w.global_rank: None for w in worker_group.workers},
        )

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> RunResult:
        spec = self._worker_group.spec
        logger.info(
            "[%s] node %s: starting %d worker(s)", spec.role, self._node, spec.local_world_size
        )
        # A child's exit (SIGCHLD) wakes the loop at once through the wakeup fd, so a
        # crash is seen in milliseconds, not at the next --monitor-interval tick.
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        previous_fd = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        previous_handler = signal.signal(signal.SIGCHLD, _on_sigchld)
        self._wake = wake_r
        try:
            self._initialize_workers(self._worker_group)
            while True:
                self._wait(spec.monitor_interval)
                result = self._tick()
                if result is not None:
                    return result
        finally:
            if self._coord is not None:
                self._coord.close()
            signal.signal(signal.SIGCHLD, previous_handler)
            signal.set_wakeup_fd(previous_fd)
            self._wake = None
            wake_r.close()
            wake_w.close()

    # -- the loop ------------------------------------------------------------------

    def _wait(self, timeout: float) -> None:
        """Sleep up to ``timeout``, waking early when a monitor reports or a child exits."""
        watched: list[Any] = [self._monitors.fileno()]
        if self._wake is not None:
            watched.append(self._wake)
        # A decision another node took wakes the loop at once (the next tick reads it);
        # None: no decision watcher (etcd, or its store failed).
        decisions = None if self._coord is None else self._coord.fileno()
        if decisions is not None:
            watched.append(decisions)
        ready, _, _ = select.select(watched, [], [], timeout)
        if self._wake is not None and self._wake in ready:
            with contextlib.suppress(BlockingIOError):
                while self._wake.recv(4096):
                    pass

    def _coordinator(self) -> JobCoordinator:
        assert self._coord is not None, "no rendezvous yet"
        return self._coord

    def _tick(self) -> RunResult | None:
        noticed = time.time()  # wall clock: label
        self._cycle.noticed_mono = time.monotonic()
        wg = self._worker_group
        causes: list[str] = []
        self._handle_events(self._monitors.drain_events(), noticed)
        self._maybe_start_spares(wg.spec.local_world_size)
        self._reports.journal_progress()
        self._reports.journal_restore()
        self._straggler.record_new()
        self._goodput.update_gauges()
        for local_rank, code in sorted(self._monitors.dead().items()):
            served = local_rank in self._cycle.connected
            self._recorder.record(
                MonitorDied(
                    cycle=self._cycle.number,
                    local_rank=local_rank,
                    exit_code=code,
                    rank_was_connected=served,
                )
            )
            self._monitors.replace(local_rank)
            if served:
                causes.append(f"the monitor of local rank {local_rank} died (exit code {code})")

        coord = self._coordinator()
        cycle = self._cycle.number
        decision = coord.decided(cycle)
        result = self._monitor_workers(wg)
        seen = Seen(
            decided=decision is not None,
            shutdown_requested=self._cycle.shutdown_request is not None,
            exclude_requested=self._cycle.exclude_request is not None,
            workers=_WORKERS.get(result.state, Workers.HEALTHY),
            watched_monitor_died=bool(causes),
            nodes_waiting=self._nodes_waiting(),
        )
        end = cycle_end(seen)
        if end is End.FOLLOW and decision is not None:
            return self._apply(decision, noticed)
        if end in (End.SHUTDOWN_REQUEST, End.EXCLUDE_REQUEST):
            return self._apply_request(noticed)
        if end is End.UNINTERRUPTIBLE:
            # torch's D-state check: a wedged rank holds a kernel resource (GPU, NIC) a
            # new rank on this node would conflict with, so this node leaves the job.
            reason = (
                f"a rank on node {self._node} stayed in uninterruptible sleep (D-state) "
                "past TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT (torch's check)"
            )
            decision = coord.decide(cycle, self._decider(Trigger.EXCLUDE_REQUEST, reason))
            return self._apply(decision, noticed, exclusion_requested=True)
        if end is End.FAILURE:
            return self._end_on_failure(result, causes, noticed)
        if end is End.SUCCESS:
            return self._finish(result)
        if end is End.NODES_WAITING:
            reason = "new nodes are waiting to join"
            decision = coord.decide(cycle, self._decider(Trigger.NODES_WAITING, reason))
            return self._apply(decision, noticed)
        return None

    def _apply_request(self, noticed: float) -> RunResult | None:
        """End the cycle on a rank's request (there is one: :func:`cycle_end` said so)."""
        requested = self._decide_on_request()
        if requested is None:
            raise AssertionError("no rank request to end the cycle on")
        return self._apply(requested[0], noticed, exclusion_requested=requested[1])

    def _end_on_failure(
        self, result: RunResult, causes: list[str], noticed: float
    ) -> RunResult | None:
        """Decide on a failure: name it, wait for hang evidence, attribute it, decide."""
        repeated_error: str | None = None
        if result.state == WorkerState.FAILED:
            name_crashes(self._cycle, result)
            if self._await_hang_evidence():
                result = self._monitor_workers(self._worker_group)
                # A request that came while waiting still wins over the failure.
                again = Seen(
                    shutdown_requested=self._cycle.shutdown_request is not None,
                    exclude_requested=self._cycle.exclude_request is not None,
                    workers=Workers.FAILED,
                )
                if cycle_end(again) in (End.SHUTDOWN_REQUEST, End.EXCLUDE_REQUEST):
                    return self._apply_request(noticed)
            finding = attribute_hang(self._cycle, self._worker_group, self._recorder)
            if finding is not None:
                causes.insert(0, "hang: " + finding.sentence)
            causes.extend(describe_failures(self._cycle, result))
            pc = compat.worker_processes(self)
            stderrs = pc.stderrs if pc is not None else {}
            outcomes = journal_failures(self._cycle, result, stderrs, self._recorder)
            repeated_error = self._repeated_error(outcomes)
        else:
            if result.state == WorkerState.UNKNOWN:
                causes.append(
                    "torch's check found the worker pids do not match its process context"
                )
            self._last_signature = None  # a dead monitor: not a deterministic failure
        reason = f"on node {self._node}: " + "; ".join(causes)
        cycle = self._cycle.number
        decision = self._coordinator().decide(
            cycle, self._decider(Trigger.FAILURE, reason, repeated_error)
        )
        return self._apply(decision, noticed)

    def _handle_events(self, events: list[MonitorEvent], noticed: float) -> None:
        """Act on the monitors' events (:meth:`._rank_reports.RankReports.handle`)."""
        self._reports.handle(events, noticed)

    def _await_hang_evidence(self) -> bool:
        """After a hang's first report, wait briefly for the other local ranks' reports.

        The culprit exits on its monitor's signal right after its report, while each
        victim's report follows its own stack dump pause; deciding on the culprit's alone
        would leave the victims unseen. Returns whether it waited.
        """
        if not hang_evidence(self._cycle) or self._cycle.first_report_mono is None:
            return False
        pc = compat.worker_processes(self)
        handlers = {} if pc is None else pc.subprocess_handlers
        deadline = self._cycle.first_report_mono + _HANG_EVIDENCE_WAIT_S
        while True:
            exited = {r for r, h in handlers.items() if h.proc.poll() is not None}
            if all(r in self._cycle.terminated or r in exited for r in handlers):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            self._wait(min(left, 0.05))
            self._handle_events(self._monitors.drain_events(), time.time())  # wall clock: label

    def _maybe_start_spares(self, local_world_size: int) -> None:
        if self._spares is None or self._cycle.spares_started:
            return
        up = len(self._cycle.connected) >= local_world_size
        if up or time.monotonic() - self._cycle.started_mono >= _SPARES_AFTER_S:
            self._cycle.spares_started = True
            started = self._spares.fill()
            logger.debug("warm spares started for local ranks %s", started)

    def _nodes_waiting(self) -> int:
        # Reads the whole rendezvous state from the store: once a second is plenty for
        # noticing new nodes, and keeps the store host's load flat as the job grows.
        handler = self._worker_group.spec.rdzv_handler
        now = time.monotonic()
        if not isinstance(handler, DynamicRendezvousHandler) or now < self._next_waiting_check:
            return 0
        self._next_waiting_check = now + _WAITING_CHECK_PERIOD_S
        return handler.num_nodes_waiting()

    def _journal_rejected(self, key: str, why: str) -> None:
        self._recorder.record(StoreValueIgnored(cycle=self._cycle.number, key=key, why=why))

    def _repeated_error(self, outcomes: list[RankOutcome]) -> str | None:
        """The one-line root cause when this cycle repeats the last one's deterministic
        failure (before any rank's first step), else None; remembers this cycle's."""
        signature = cycle_signature(outcomes, first_step_seen=bool(self._cycle.first_steps))
        repeated = repeats(self._last_signature, signature)
        self._last_signature = signature
        return signature.describe() if repeated and signature is not None else None

    # -- decisions (computed by the node that claims the cycle) ---------------------

    def _decider(
        self, trigger: Trigger, reason: str, repeated_error: str | None = None
    ) -> Callable[[JobState], Decision]:
        """What the coordinator calls, with the job state, if this node wins the cycle."""
        return decider(
            trigger,
            reason,
            policy=self._policy,
            node=self._node,
            progress_before=self._cycle.progress,
            repeated_error=repeated_error,
        )

    def _decide_on_request(self) -> tuple[Decision, bool] | None:
        """The cycle's decision on a rank's request, with whether this node asked to leave."""
        request = request_trigger(self._cycle, self._node)
        if request is None:
            return None
        trigger, reason, leaves = request
        return self._coordinator().decide(
            self._cycle.number, self._decider(trigger, reason)
        ), leaves

    # -- acting on a decision --------------------------------------------------------

    def _apply(
        self, decision: Decision, noticed: float, *, exclusion_requested: bool = False
    ) -> RunResult | None:
        wg = self._worker_group
        cycle = self._cycle.number
        self._reports.journal_restore(final=True)
        taken, exit_code = decision_taken(
            decision,
            self._node,
            cycle=cycle,
            noticed=noticed,
            exclusion_requested=exclusion_requested,
        )
        self._recorder.record(taken)
        action = taken.action
        t0_mono, noticed_mono = time.monotonic(), self._cycle.noticed_mono
        self._stop_workers(wg)
        wg.state = WorkerState.STOPPED
        stopped, stopped_mono = time.time(), time.monotonic()  # wall clock: label
        self._recorder.record(WorkersStopped(cycle=cycle, workers_stopped=stopped))
        if action != "restart":
            if action == "exclude":
                self._leave_rendezvous()
            else:
                self._journal_goodput()
                self._close_rendezvous()
                world = wg.group_world_size or 1
                if world > 1:  # the store's host stays until every node has its summary
                    self._coordinator().leave(cycle, world)
            raise LauncherExit(exit_code, decision.reason)

        self._state = decision.state
        logger.warning("%s", restart_line(decision, cycle, self._node, self._policy.max_restarts))
        first_mono = self._cycle.first_report_mono
        detect = None if first_mono is None else self._cycle.noticed_mono - first_mono
        try:
            self._rendezvous(wg)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self._recorder.record(RestartFailed(cycle=cycle, error=error))
            raise
        rendezvous_done, rendezvous_mono = time.time(), time.monotonic()  # wall clock: label
        worker_ids = self._start_workers(wg)
        for local_rank, worker_id in worker_ids.items():
            wg.workers[local_rank].id = worker_id
        wg.state = WorkerState.HEALTHY
        started, started_mono = time.time(), time.monotonic()  # wall clock: label
        self._recorder.record(
            Restarted(
                from_cycle=cycle,
                cycle=decision.state.cycle,
                charged=decision.charged,
                detect_s=detect,
                stop_s=stopped_mono - t0_mono,
                rendezvous_s=rendezvous_mono - stopped_mono,
                spawn_s=started_mono - rendezvous_mono,
                total_s=started_mono - noticed_mono,
                failure_noticed=noticed,
                workers_stopped=stopped,
                rendezvous_done=rendezvous_done,
                workers_started=started,
            )
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
        deadline = time.monotonic() + self._policy.exit_barrier_timeout
        logger.info("local workers finished; waiting for %d node(s) in all", world)
        while coord.arrived(cycle) < world:
            decision = coord.decided(cycle)
            if decision is not None:
                self._cycle.noticed_mono = time.monotonic()
                return self._apply(decision, time.time())  # wall clock: label
            if time.monotonic() > deadline:
                logger.error(
                    "gave up waiting for the other nodes after %.0f s",
                    self._policy.exit_barrier_timeout,
                )
                break
            self._wait(self._worker_group.spec.monitor_interval)
            self._monitors.drain_events()
        self._recorder.record(AllNodesFinished(cycle=cycle))
        self._journal_goodput()
        self._close_rendezvous()
        coord.leave(cycle, world)
        logger.debug("left the job")
        return result

    def _close_rendezvous(self) -> None:
        """The job is over for every node: close the rendezvous (idempotent, best effort).

        Never called for a local error, a signal or an exclusion, so the others (or a
        requeued job) can still use it.
        """
        if self._rendezvous_closed:
            return
        self._rendezvous_closed = True
        handler = self._worker_group.spec.rdzv_handler
        try:
            handler.shutdown()
        except Exception as exc:  # the store host may already be gone
            logger.debug("closing the rendezvous: %s", exc)
        self._steps.after_close(handler)

    def _leave_rendezvous(self) -> None:
        """Take this node out of the rendezvous now, so the others re-form without it.

        Torch has no public call for this (its handler only leaves when the next
        rendezvous starts, or after its keep-alive expires, 15 s by default).
        """
        try:
            compat.leave_rendezvous(self._worker_group.spec.rdzv_handler, timeout_s=10.0)
        except Exception as exc:  # best effort: the keep-alive expiry is the fallback
            logger.warning("could not leave the rendezvous promptly: %s", exc)
