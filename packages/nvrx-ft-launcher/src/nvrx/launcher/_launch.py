"""Run one node of a job: monitors, rendezvous, the agent, and a cleanup nothing escapes.

This is the launcher's counterpart of torch's ``launch_agent``: it builds the same
WorkerSpec from torch's LaunchConfig, but runs :class:`FtAgent`, starts the rank
monitors before the rendezvous (so they come up while it runs), maps every outcome
to an :class:`ExitCode`, and on the way out kills whatever is left.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import sys
from types import FrameType

from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.api import (
    RendezvousError,
    RendezvousHandler,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
from torch.distributed.elastic.utils.api import macros
from torch.distributed.launcher.api import LaunchConfig

from nvrx.ft import FaultToleranceConfig

from . import metrics
from ._agent import FtAgent, RestartPolicy
from ._cluster import ClusterOptions
from ._events import Finished, Recorder, RunStarted
from ._exec_shim import shim_args
from ._flight_env import enable_flight_recorder
from ._launcher_exit import LauncherExit
from ._local_ckpt import SPARE_PRELOAD, LocalCkptOptions, NodeDirectory
from ._monitors import MonitorSupervisor
from ._numa import NumaPlan, machine_plan, wrap_command
from ._reaper import RankLeftovers, Reaper
from ._rendezvous import tune_rendezvous
from ._run_nonce import stop_answering
from ._signed_store import journal_rejections
from ._spares import DEFAULT_PRELOAD, SAFE_FLAGS, SparePool, python_command
from .exit_codes import ExitCode, exit_code_for_signal
from .journal import JsonLines

__all__ = ["LaunchOptions", "launch"]

logger = logging.getLogger("nvrx.launcher")


@dataclasses.dataclass
class LaunchOptions:
    """Everything one launcher needs, parsed and validated."""

    config: LaunchConfig
    command: list[str]
    ft_config: FaultToleranceConfig
    term_timeout: float
    workers_stop_timeout: float
    monitor_ready_timeout: float
    rdzv_poll_interval: float
    max_no_progress_restarts: int
    min_progress_iterations: int
    progress_file: str | None = None
    #: What the launcher exits with when the progress rule stops the job (NVRx's option).
    no_restart_exit_code: int = int(ExitCode.NO_PROGRESS)
    #: Stop (exit 6) on a failure repeated before the first step (--ft-stop-on-repeated-error).
    stop_on_repeated_error: bool = True
    cycle_log: str | None = None
    journal: str | None = None
    #: The Prometheus endpoint's port (None: off; 0: any free port) and bind address.
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    #: Where the final metrics go as the launcher exits (None: nowhere): a textfile for
    #: node_exporter, a Pushgateway.
    metrics_textfile: str | None = None
    metrics_pushgateway: str | None = None
    warm_spares: bool = False
    warm_spare_preload: tuple[str, ...] = DEFAULT_PRELOAD
    #: Health checks, GPU memory wait, NUMA, cycle info, per-cycle logs (issue 17).
    cluster: ClusterOptions = dataclasses.field(default_factory=ClusterOptions)
    #: --local-ckpt-*: where the node's local snapshots live and how the ranks save them.
    local_ckpt: LocalCkptOptions = dataclasses.field(
        default_factory=lambda: LocalCkptOptions(base=None)
    )


def _raise_signal(signum: int, frame: FrameType | None) -> None:
    sig = signal.Signals(signum)
    raise SignalException(f"ft_launcher {os.getpid()} got {sig.name}", sigval=sig)


def _install_signal_handlers(names: str) -> list[signal.Signals]:
    handled = []
    for name in names.split(","):
        name = name.strip()
        if not name:
            continue
        sig = signal.Signals[name]
        signal.signal(sig, _raise_signal)
        handled.append(sig)
    return handled


def _static_master(params: RendezvousParameters) -> tuple[str | None, int | None]:
    """MASTER_ADDR/PORT for the static backend, as torchrun derives them."""
    if params.backend != "static":
        return None, None
    addr, port = parse_rendezvous_endpoint(params.endpoint, default_port=-1)
    if port == -1:
        raise ValueError(f"the static rendezvous needs a port: {params.endpoint!r}")
    return addr, port


def _spec(
    options: LaunchOptions,
    handler: RendezvousHandler,
    params: RendezvousParameters,
    monitors: MonitorSupervisor,
    numa: NumaPlan | None = None,
) -> WorkerSpec:
    config = options.config
    master_addr, master_port = _static_master(params)
    socket_template = os.fspath(monitors.socket_path(macros.local_rank))
    extra = {
        name: getattr(config, name)
        for name in (
            "event_log_handler",
            "numa_options",
            "duplicate_stdout_filters",
            "duplicate_stderr_filters",
            "virtual_local_rank",
        )
        if name in {f.name for f in dataclasses.fields(WorkerSpec)} and hasattr(config, name)
    }
    return WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=sys.executable,
        args=shim_args(
            socket_template,
            options.command if numa is None else wrap_command(numa, options.command),
        ),
        rdzv_handler=handler,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        master_addr=master_addr,
        master_port=master_port,
        local_addr=config.local_addr,
        **extra,
    )


def _metrics_server(options: LaunchOptions) -> metrics.MetricsServer | None:
    """The metrics endpoint when --ft-metrics-port is given; failing to start is a usage error."""
    if options.metrics_port is None:
        return None
    try:
        return metrics.start_metrics_server(options.metrics_port, options.metrics_addr)
    except (RuntimeError, OSError, ValueError) as exc:
        raise LauncherExit(
            int(ExitCode.USAGE_ERROR),
            f"--ft-metrics-port {options.metrics_port} (--ft-metrics-addr "
            f"{options.metrics_addr}): {exc}",
        ) from None


def _metrics_recorder(
    options: LaunchOptions, server: metrics.MetricsServer | None
) -> metrics.NullRecorder:
    """The endpoint's recorder, one without an endpoint when only the final values are
    kept (--ft-metrics-textfile, --ft-metrics-pushgateway), or the null recorder."""
    if server is not None:
        return server.recorder
    if options.metrics_textfile is None and options.metrics_pushgateway is None:
        return metrics.NULL_RECORDER
    try:
        return metrics.PrometheusRecorder()
    except RuntimeError as exc:  # no prometheus_client
        option = "--ft-metrics-textfile" if options.metrics_textfile else "--ft-metrics-pushgateway"
        value = options.metrics_textfile or options.metrics_pushgateway
        raise LauncherExit(int(ExitCode.USAGE_ERROR), f"{option} {value}: {exc}") from None


def _final_metrics(options: LaunchOptions, recorder: metrics.NullRecorder) -> None:
    """The job's final values, kept past the launcher's exit (never raises)."""
    if not isinstance(recorder, metrics.PrometheusRecorder):
        return
    if options.metrics_textfile is not None:
        recorder.write_textfile(options.metrics_textfile)
    if options.metrics_pushgateway is not None:
        grouping = {"run_id": options.config.run_id, "instance": socket.gethostname()}
        recorder.push(options.metrics_pushgateway, "nvrx_launcher", grouping)


def _numa_plan(options: LaunchOptions) -> NumaPlan | None:
    """Where each local rank runs, when NVRX_GPUS_PER_NUMA asks for NUMA binding."""
    cluster = options.cluster
    if cluster.gpus_per_numa is None:
        return None
    return machine_plan(
        options.config.nproc_per_node, cluster.gpus_per_numa, cluster.numa_bind_strict
    )


def _spare_pool(options: LaunchOptions, numa: NumaPlan | None = None) -> SparePool | None:
    if not options.warm_spares:
        return None
    if numa is not None and numa.binds:
        logger.warning(
            "--warm-spares is off while NVRX_GPUS_PER_NUMA binds ranks to NUMA nodes (each "
            "rank starts through the binding wrapper); ranks will start cold"
        )
        return None
    command = python_command(options.command)
    if command is None:
        logger.warning(
            "--warm-spares needs a Python script or -m module run by %s with no options "
            "other than %s; ranks will start cold: %s",
            sys.executable,
            " ".join(sorted(SAFE_FLAGS)),
            options.command,
        )
        return None
    preload = options.warm_spare_preload
    if options.local_ckpt.base is not None and SPARE_PRELOAD not in preload:
        preload = (*preload, SPARE_PRELOAD)  # a spare restores without importing it
    return SparePool(command, preload, options.config.nproc_per_node)


def _node_directory(options: LaunchOptions) -> NodeDirectory | None:
    """This node's local checkpoint directory for the job (None: off)."""
    try:
        return NodeDirectory.create(options.local_ckpt, options.config.run_id)
    except (OSError, ValueError) as exc:
        raise LauncherExit(
            int(ExitCode.USAGE_ERROR),
            f"--local-ckpt-dir {options.local_ckpt.base}: cannot make this node's directory: {exc}",
        ) from None


def launch(options: LaunchOptions, monitors: MonitorSupervisor | None = None) -> int:
    """Run this node's share of the job and return the launcher's exit code.

    ``monitors``, if given, were started already (before torch was imported) with
    the settings in ``options``; they are closed here either way.
    """
    config = options.config
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
    enable_flight_recorder(os.environ)  # the ranks inherit it; hang attribution reads it
    handled: list[signal.Signals] = []
    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        # Standby nodes: a round is full at MIN; the others wait in torch's redundancy
        # list (not counted as waiting nodes) until a round has room.
        max_nodes=config.min_nodes if options.cluster.standby_nodes else config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    policy = RestartPolicy(
        max_restarts=config.max_restarts,
        workers_stop_timeout=options.workers_stop_timeout,
        max_no_progress_restarts=options.max_no_progress_restarts,
        min_progress_iterations=options.min_progress_iterations,
        progress_file=options.progress_file,
        stop_on_repeated_error=options.stop_on_repeated_error,
    )
    # The one writer of the journal; the cycle log is derived from it (a launcher that
    # ends outside any cycle gets its final "stop" from the Finished event).
    recorder = Recorder(JsonLines(options.journal), JsonLines(options.cycle_log))
    agent: FtAgent | None = None
    code: int = ExitCode.LAUNCHER_ERROR
    reason = ""
    handler: RendezvousHandler | None = None
    numa = _numa_plan(options)
    spares = _spare_pool(options, numa)
    server: metrics.MetricsServer | None = None
    metrics_recorder: metrics.NullRecorder = metrics.NULL_RECORDER
    node_dir: NodeDirectory | None = None
    # Orphans of the job (a setsid'd process) come to this process; killed at the end.
    reaper = Reaper()
    if reaper.active:  # and what a cycle's ranks left is killed when the cycle ends
        recorder.subscribe(RankLeftovers(config.run_id))
    try:
        handled = _install_signal_handlers(config.signals_to_handle)
        server = _metrics_server(options)
        metrics_recorder = _metrics_recorder(options, server)
        node_dir = _node_directory(options)
        if monitors is None:
            monitors = MonitorSupervisor(
                options.ft_config,
                config.nproc_per_node,
                ready_timeout=options.monitor_ready_timeout,
            )
            monitors.start()
        handler = rdzv_registry.get_rendezvous_handler(params)
        tune_rendezvous(handler, options.rdzv_poll_interval)
        logger.debug("rendezvous handler ready")
        agent = FtAgent(
            _spec(options, handler, params, monitors, numa),
            config.logs_specs,  # type: ignore[arg-type]
            policy,
            monitors,
            term_timeout=options.term_timeout,
            start_method=config.start_method,
            log_line_prefix_template=config.log_line_prefix_template,
            recorder=recorder,
            spares=spares,
            metrics=metrics_recorder,
            cluster=options.cluster,
            numa=numa,
            local_ckpt_dir=None if node_dir is None else node_dir.path,
            multi_node=config.max_nodes > 1,
        )
        recorder.record(
            RunStarted(
                run_id=config.run_id,
                min_nodes=config.min_nodes,
                max_nodes=config.max_nodes,
                nproc_per_node=config.nproc_per_node,
                max_restarts=config.max_restarts,
                command=list(options.command),
                metrics_url=None if server is None else server.url,
            )
        )
        result = agent.run()
        code = ExitCode.SUCCESS
        if result is None:  # torch's graceful exit: the job ended while this node waited
            reason = "the job ended while this node waited as a standby"
        else:
            reason = "every rank finished successfully"
        logger.info("%s", reason)
    except LauncherExit as exc:
        code = exc.code
        reason = str(exc)
        if code == ExitCode.NO_PROGRESS and options.no_restart_exit_code != code:
            code = options.no_restart_exit_code  # --ft-no-restart-exit-code
        log = logger.info if code == ExitCode.SUCCESS else logger.error
        log("stopping with exit code %d: %s", code, exc)
    except SignalException as exc:
        code = exit_code_for_signal(exc.sigval)
        reason = f"the launcher got {exc.sigval.name}; the ranks were stopped"
        logger.warning("got %s: ranks were stopped; exit code %d", exc.sigval.name, code)
    except RendezvousError as exc:
        reason = _rendezvous_failure(exc, handler, config)
        logger.error("%s", reason)
    except Exception as exc:
        reason = f"ft_launcher failed: {type(exc).__name__}: {exc}"
        logger.exception("ft_launcher failed")
    finally:
        for sig in handled:
            signal.signal(sig, signal.SIG_IGN)
        if agent is not None:
            agent.kill_leftover_workers()
        if spares is not None:
            spares.close()
        if monitors is not None:
            monitors.close()
        stop_answering()  # the run nonce's challenges (no thread outlives the launcher)
        journal_rejections(None)
        reaper.close()
        if node_dir is not None:  # a failed job's is left (the next launcher removes it)
            node_dir.close(succeeded=code == ExitCode.SUCCESS)
        recorder.record(Finished(exit_code=int(code), reason=reason))
        _final_metrics(options, metrics_recorder)
        if server is not None:
            server.close()
        logger.debug("cleaned up")
    return int(code)


def _rendezvous_failure(
    exc: RendezvousError, handler: RendezvousHandler | None, config: LaunchConfig
) -> str:
    """Say what the rendezvous was waiting for: torch's timeout errors have no message."""
    text = f"rendezvous failed: {type(exc).__name__}"
    if str(exc):
        text += f": {exc}"
    if isinstance(exc, RendezvousTimeoutError) and not str(exc):  # torch's own: no message
        join = None
        if isinstance(handler, DynamicRendezvousHandler):
            join = handler.settings.timeout.join.total_seconds()
        nodes = (
            f"{config.min_nodes}"
            if config.min_nodes == config.max_nodes
            else f"{config.min_nodes} to {config.max_nodes}"
        )
        waited = f" after {join:g} s" if join is not None else ""
        text = f"the rendezvous timed out{waited} waiting for {nodes} node(s)"
    return text
