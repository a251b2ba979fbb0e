"""The ``ft_launcher`` command: torchrun's command line plus the fault-tolerance options.

The parser starts from torch's own (``torch.distributed.run.get_args_parser``), so every
torchrun option keeps its spelling, default and ``PET_*`` variable.
:func:`add_launcher_options` adds everything nvrx adds (restart options, one
``--ft-<field>`` option per :class:`nvrx.ft.FaultToleranceConfig` field, NVRx's older
spellings and its options that have no effect here), each also settable through its
``PET_<DEST>`` variable. The early parse that starts the rank monitors before torch is
imported uses the same function, so the two parses cannot disagree.

Options are matched by their full names only, and nothing after the training script is
read by the launcher: ``train.py --nproc 4`` passes ``--nproc 4`` to the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import re
import shlex
import shutil
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, Any, NoReturn

from nvrx.ft import (
    MAX_DURATION_S,
    RANK_MONITOR_INIT_TIMEOUT,
    FaultToleranceConfig,
    add_ft_arguments,
    log_formatter,
)
from nvrx.ft.config import parse_bool

from . import _local_ckpt
from ._arg_types import number
from ._monitors import MonitorSupervisor
from ._nvrx_only import add_nvrx_only_options, warn_without_effect
from ._validation import (
    MAX_DAYS,
    checked_parser,
    max_local_ranks,
    validate_environment,
    validate_launcher_files,
    validate_torchrun_options,
    validate_training_script,
)
from .exit_codes import ExitCode, exit_codes_table

if TYPE_CHECKING:
    from torch.distributed.launcher.api import LaunchConfig

    from ._cluster import ClusterOptions
    from ._launch import LaunchOptions

__all__ = ["add_launcher_options", "get_parser", "main"]

logger = logging.getLogger("nvrx.launcher")

_USAGE = "%(prog)s [options] training_script [training_script_args ...]"

_DESCRIPTION = """\
Launch a PyTorch training job like torchrun, with a hang/crash monitor per rank and
in-job restarts: when a rank crashes or hangs, every node stops its ranks,
re-rendezvouses and starts them again, up to --max-restarts times for the whole job.
Every torchrun option is accepted with its meaning and its PET_* variable; so is every
option below (PET_<OPTION>, e.g. PET_FT_RANK_HEARTBEAT_TIMEOUT). Options are matched by
their full names; everything after training_script goes to the script untouched."""

_EPILOG = "exit codes:\n" + exit_codes_table()

#: torchrun options that take no value; every other torchrun option takes one. Only the
#: early parse needs this (it runs before torch is imported); a test holds it to torch's.
TORCHRUN_FLAGS = frozenset(
    {
        "-h",
        "--help",
        "--standalone",
        "-m",
        "--module",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
    }
)

_TERM_TIMEOUT_DEFAULT = 1800.0


class _FtParser(argparse.ArgumentParser):
    """torchrun's parser with a short usage error: the usage line, the error, a hint."""

    def error(self, message: str) -> NoReturn:
        self._short_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\nRun '{self.prog} --help' for every option.\n")

    def _short_usage(self, stream: IO[str]) -> None:
        stream.write(f"usage: {_USAGE % {'prog': self.prog}}\n")


class _QuietParser(_FtParser):
    """For the early parse: a problem means "no early monitors", never an exit."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


_SECONDS = number(
    float, minimum=0.0, maximum=MAX_DURATION_S, what=f"a number of seconds from 0 to {MAX_DAYS}"
)
_POSITIVE_SECONDS = number(
    float,
    minimum=0.0,
    maximum=MAX_DURATION_S,
    above_minimum=True,
    what=f"a number of seconds above 0, at most {MAX_DAYS}",
)
_COUNT = number(int, minimum=0, maximum=10**9, what="an integer >= 0")
_POSITIVE = number(int, minimum=1, maximum=10**9, what="an integer >= 1")
_EXIT_CODE = number(int, minimum=0, maximum=255, what="an exit code from 0 to 255")
_PORT = number(int, minimum=0, maximum=65535, what="a port from 0 to 65535 (0: any free port)")


def _bind_address(text: str) -> str:
    """An argparse type: an IP address or host name to bind the metrics endpoint to."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})", text):
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: expected an IP address or host name"
        )
    return text


_NO_PROGRESS_COUNT = number(
    int, minimum=-1, maximum=10**9, what="an integer >= 0 (0 or -1 disables the rule)"
)


def _module_list(text: str) -> tuple[str, ...]:
    """A comma-separated list of importable top-level packages or dotted modules."""
    import importlib.util

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in names:
        top = name.split(".")[0]
        if not all(part.isidentifier() for part in name.split(".")):
            raise argparse.ArgumentTypeError(f"invalid module name {name!r}")
        if importlib.util.find_spec(top) is None:
            raise argparse.ArgumentTypeError(f"module {top!r} is not installed")
    return names


class _DeprecatedOption(argparse.Action):
    """An old NVRx spelling: works like its replacement and says so once."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        self.replacement: str = kwargs.pop("replacement")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if not isinstance(parser, _QuietParser):  # the early parse: the full one says it
            logger.warning(
                "%s is deprecated and will be removed; use %s", option_string, self.replacement
            )
        setattr(namespace, self.dest, values)


def _add_deprecated_ft_aliases(parser: argparse.ArgumentParser) -> None:
    """NVRx's ``--ft-param-<field>`` and ``--ft_param_<field>`` spellings (hidden from --help)."""
    fields = set(FaultToleranceConfig.field_names())
    for action in list(parser._actions):
        if not action.dest.startswith("ft_") or not action.option_strings:
            continue
        field = action.dest[len("ft_") :]
        if field not in fields or isinstance(action, _DeprecatedOption):
            continue
        flags = {
            f"--ft-param-{field}",
            f"--ft-param-{field.replace('_', '-')}",
            f"--ft_param_{field}",
        } - set(parser._option_string_actions)
        if not flags:
            continue
        typed: dict[str, Any] = {} if action.type is None else {"type": action.type}
        parser.add_argument(
            *sorted(flags),
            dest=action.dest,
            action=_DeprecatedOption,
            replacement=action.option_strings[0],
            nargs=action.nargs,
            const=action.const,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
            **typed,
        )
    parser.add_argument(
        "--fault-tol-cfg-path",
        "--fault_tol_cfg_path",
        dest="ft_cfg_path",
        action=_DeprecatedOption,
        replacement="--ft-cfg-path",
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    # NVRx: "do not fail when no FT config is given, use the defaults". ft_launcher never
    # fails for a missing config (a missing --ft-cfg-path file is still an error, as there).
    parser.add_argument(
        "--ignore-missing-fault-tol-cfg",
        "--ignore_missing_fault_tol_cfg",
        dest="ft_ignore_missing_cfg",
        action="store_true",
        help=argparse.SUPPRESS,
    )


class _YamlDefault(int):
    """An option's default that the --ft-cfg-path YAML may replace (a given value is an int)."""


def _add_restart_options(parser: argparse.ArgumentParser) -> None:
    restart = parser.add_argument_group(
        "restarts and supervision",
        "How ft_launcher stops, restarts and gives up. --max-restarts counts restarts "
        "of the whole job, agreed by all nodes.",
    )
    restart.add_argument(
        "--term-timeout",
        "--term_timeout",
        type=_SECONDS,
        default=None,
        help="seconds between forwarding SIGTERM/SIGINT to the ranks and SIGKILL "
        f"(default: torchrun's --shutdown-timeout if given, else {_TERM_TIMEOUT_DEFAULT:g})",
    )
    restart.add_argument(
        "--workers-stop-timeout",
        "--workers_stop_timeout",
        type=_SECONDS,
        default=15.0,
        help="seconds between SIGTERM and SIGKILL when stopping ranks for a restart",
    )
    restart.add_argument(
        "--rdzv-poll-interval",
        "--rdzv_poll_interval",
        type=_POSITIVE_SECONDS,
        default=0.1,
        help="seconds between reads of the rendezvous state while waiting for other nodes "
        "(torch polls every second)",
    )
    restart.add_argument(
        "--monitor-ready-timeout",
        "--monitor_ready_timeout",
        type=_POSITIVE_SECONDS,
        default=RANK_MONITOR_INIT_TIMEOUT,
        help="seconds to wait for a rank monitor to come up (default: %(default)s, "
        "NVRx's RANK_MONITOR_INIT_TIMEOUT)",
    )
    restart.add_argument(
        "--warm-spares",
        "--warm_spares",
        action="store_true",
        help="keep one spare Python per local rank, with --warm-spare-preload imported, so a "
        "restart skips interpreter start-up and the imports (seconds per rank); costs one "
        "idle process per local rank. Needs a Python script or -m module (not --no-python)",
    )
    restart.add_argument(
        "--warm-spare-preload",
        "--warm_spare_preload",
        type=_module_list,
        default=None,  # _spares.DEFAULT_PRELOAD (that module imports torch; this one must not)
        help="comma-separated modules a warm spare imports before it is needed "
        "(default: torch,torch._dynamo: DDP's constructor imports torch._dynamo, "
        "seconds per rank at a restart), e.g. torch,torch._dynamo,lightning",
    )
    restart.add_argument(
        "--ft-max-no-progress-restarts",
        "--ft-max-no-progress-cycles",
        "--ft-max_no_progress_restarts",
        "--ft-max_no_progress_cycles",
        dest="ft_max_no_progress_restarts",
        type=_NO_PROGRESS_COUNT,
        default=_YamlDefault(3),
        help="stop with --ft-no-restart-exit-code when ranks fail again after this many "
        "consecutive restarts that made no progress (needs --ft-progress-file; 0 or -1 "
        "disables; max_no_progress_cycles in --ft-cfg-path when not given)",
    )
    restart.add_argument(
        "--ft-min-progress-iterations",
        "--ft-min_progress_iterations",
        dest="ft_min_progress_iterations",
        type=_POSITIVE,
        default=_YamlDefault(1),
        help="how far the value in --ft-progress-file must move for a cycle to count as "
        "progress (min_progress_iterations in --ft-cfg-path when not given)",
    )
    restart.add_argument(
        "--ft-progress-file",
        "--ft-checkpoint-iteration-file",
        "--ft-progress_file",
        "--ft-checkpoint_iteration_file",
        dest="ft_progress_file",
        default=None,
        help="file holding an integer the training advances, e.g. the iteration of its "
        "last checkpoint; read at each restart decision (default: "
        "checkpoint_iteration_file of --ft-cfg-path)",
    )
    restart.add_argument(  # issue 27 item 5 (ft27)
        "--ft-stop-on-repeated-error",
        "--ft-stop_on_repeated_error",
        dest="ft_stop_on_repeated_error",
        type=lambda value: parse_bool("--ft-stop-on-repeated-error", value),
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="stop with exit code 6 when two cycles in a row fail before their first step "
        "with the same exception at the same source line (false: restart anyway); "
        "communication and device errors and killed or hung ranks never count",
    )
    restart.add_argument(
        "--ft-no-restart-exit-code",
        "--ft-no_restart_exit_code",
        "--ft_no_restart_exit_code",
        dest="ft_no_restart_exit_code",
        type=_EXIT_CODE,
        default=int(ExitCode.NO_PROGRESS),
        help="exit code when the progress rule stops the job (a scheduler should not requeue it)",
    )
    restart.add_argument(
        "--ft-cycle-log",
        "--ft-cycle_log",
        dest="ft_cycle_log",
        default=None,
        help="append one JSON line per cycle end (cause, decision, timestamps) to this file",
    )
    restart.add_argument(
        "--ft-journal",
        "--ft_journal",
        dest="ft_journal",
        default=None,
        help="append one JSON line per launcher event (start, failures with causes, "
        "decisions, restarts with timings, outcome) to this file (default: "
        "<--log-dir>/ft_launcher_events.jsonl when --log-dir is given)",
    )
    restart.add_argument(
        "--ft-metrics-port",
        "--ft_metrics_port",
        dest="ft_metrics_port",
        type=_PORT,
        default=None,
        help="serve Prometheus metrics (restarts, latencies, goodput, monitor health) on "
        "http://<--ft-metrics-addr>:PORT/metrics; 0 picks a free port (logged, and in the "
        "journal's run_start); needs nvrx-ft-launcher[metrics] (default: off)",
    )
    restart.add_argument(
        "--ft-metrics-addr",
        "--ft_metrics_addr",
        dest="ft_metrics_addr",
        type=_bind_address,
        default="127.0.0.1",
        help="the address the metrics endpoint binds to (default 127.0.0.1; 0.0.0.0 lets a "
        "Prometheus on another host scrape it)",
    )
    from ._metrics_options import metrics_textfile, pushgateway_url  # issue 25 item 5

    restart.add_argument(
        "--ft-metrics-textfile",
        "--ft_metrics_textfile",
        dest="ft_metrics_textfile",
        type=metrics_textfile,
        default=None,
        metavar="PATH",
        help="as the launcher exits, write the final metrics (ETTR, restarts, goodput and "
        "badput seconds) to PATH for node_exporter's textfile collector (name it *.prom), "
        "atomically; needs nvrx-ft-launcher[metrics] (default: off)",
    )
    restart.add_argument(
        "--ft-metrics-pushgateway",
        "--ft_metrics_pushgateway",
        dest="ft_metrics_pushgateway",
        type=pushgateway_url,
        default=None,
        metavar="URL",
        help="as the launcher exits, push the final metrics to this Prometheus Pushgateway "
        "(job nvrx_launcher, grouped by run_id and instance, the host name); needs "
        "nvrx-ft-launcher[metrics] (default: off)",
    )


def _health_command(text: str) -> str:
    """An argparse type: a command line whose program exists (run without a shell)."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: {exc}") from None
    if not argv:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected a command")
    if shutil.which(argv[0]) is None:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: {argv[0]!r} is not an executable program"
        )
    return text


def _applog_prefix(text: str) -> str:
    """An argparse type: NVRx's absolute prefix of the per-cycle application logs."""
    from ._app_logs import check_prefix

    why = check_prefix(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: {why}")
    return text


def _job_id(text: str) -> str:
    """An argparse type: a job id for the cycle-info file (printable, at most 255 chars)."""
    if not text or len(text) > 255 or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: expected 1 to 255 printable characters"
        )
    return text


def _flag_value(text: str) -> bool:
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected true or false")


def _add_cluster_options(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group(
        "cluster features",
        "Checks before each rendezvous, per-cycle records and logs. The health checks "
        "also read the FT config: enable_gpu_monitor (NVML), enable_nic_healthcheck with "
        "link_state_path_template/link_down_path_template, storage_healthcheck_path; the "
        "GPU memory wait before a restart reads gpu_memory_reclaim_timeout, "
        "gpu_memory_tolerance_mb, gpu_memory_poll_interval, check_remaining_processes; "
        "NUMA binding is on when NVRX_GPUS_PER_NUMA is set (numa_bind_strict).",
    )
    cluster.add_argument(
        "--ft-node-health-check-cmd",
        "--ft-node_health_check_cmd",
        dest="ft_node_health_check_cmd",
        type=_health_command,
        default=None,
        help="a command run (without a shell) before each rendezvous; a non-zero exit, or "
        "no exit within 60 s, takes this node out of the job (exit code 3) with the "
        "command's last output line as the reason (default: none)",
    )
    cluster.add_argument(
        "--ft-per-cycle-applog-prefix",
        "--ft_per_cycle_applog_prefix",
        dest="ft_per_cycle_applog_prefix",
        type=_applog_prefix,
        default=None,
        help="absolute path, e.g. /logs/job.log: every rank's output of cycle N goes to "
        "/logs/job_cycleN_rankR_stdout.log and _stderr.log, written by the rank itself "
        "(nothing is lost when the launcher is stopped); --tee still copies them to the "
        "console (default: torchrun's --redirects)",
    )
    cluster.add_argument(
        "--ft-cycle-info-job-id",
        "--ft_cycle_info_job_id",
        dest="ft_cycle_info_job_id",
        type=_job_id,
        default=None,
        help="the job id in --ft-cycle-info-dir's files (default: SLURM_ARRAY_JOB_ID, else "
        "SLURM_JOB_ID, else none)",
    )
    cluster.add_argument(
        "--ft-standby-nodes",
        "--ft_standby_nodes",
        dest="ft_standby_nodes",
        action="store_true",
        help="with --nnodes=MIN:MAX, the first MIN nodes to join run the job and the "
        "others wait as standbys (no ranks); at the next restart a standby takes the "
        "place and group rank of a node that left (failed, excluded or unhealthy), and "
        "the journal says which (node_replaced). Without it, MIN:MAX keeps torchrun's "
        "elastic meaning: every node in the range runs ranks (default: off)",
    )
    cluster.add_argument(
        "--ft-use-infra-group-rank",
        "--ft-use_infra_group_rank",
        "--ft_use_infra_group_rank",
        dest="ft_use_infra_group_rank",
        type=_flag_value,
        nargs="?",
        const=True,
        default=None,
        help=argparse.SUPPRESS,  # NVRx 0.5's flag; always on since 0.7, as here
    )


def add_launcher_options(parser: argparse.ArgumentParser) -> None:
    """Add every option ft_launcher adds to torchrun's (needs no torch import).

    Each also reads ``PET_<DEST>`` from the environment, as torchrun's options do; a
    bad value there is a usage error naming the variable.
    """
    before = set(map(id, parser._actions))
    _add_restart_options(parser)
    _add_cluster_options(parser)
    _local_ckpt.add_options(parser)  # --local-ckpt-*
    ft = parser.add_argument_group(
        "fault tolerance",
        "Rank monitor settings (nvrx.ft.FaultToleranceConfig). A YAML file given with "
        "--ft-cfg-path is read first; an option overrides it only when given.",
    )
    add_ft_arguments(ft)
    _add_deprecated_ft_aliases(parser)
    add_nvrx_only_options(parser)
    _read_pet_environment([a for a in parser._actions if id(a) not in before])


def _from_environment(action: argparse.Action, variable: str, given: str) -> Callable[[str], Any]:
    """The option's type, naming the variable when it refuses the variable's value."""
    convert: Callable[[str], Any] = action.type if callable(action.type) else str

    def checked(text: str) -> Any:
        try:
            value = convert(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            if text != given:  # a value from the command line
                raise
            raise argparse.ArgumentTypeError(
                f"{exc} (from the environment variable {variable})"
            ) from None
        if text == given and action.choices is not None and value not in action.choices:
            raise argparse.ArgumentTypeError(
                f"invalid value {text!r} from the environment variable {variable}: "
                f"expected one of {', '.join(map(str, action.choices))}"
            )
        return value

    checked.__name__ = getattr(convert, "__name__", "value")
    return checked


def _read_pet_environment(actions: Sequence[argparse.Action]) -> None:
    """torchrun's rule for our options: ``PET_<DEST>`` gives the default.

    The value goes through the option's own type when the parse ends (argparse converts
    a string default), so it is validated exactly like the option on the command line.
    """
    for action in actions:
        if not action.option_strings or action.default is argparse.SUPPRESS:
            continue
        variable = f"PET_{action.dest.upper()}"
        text = os.environ.get(variable)
        if text is None:
            continue
        if action.nargs == 0:  # a flag: torchrun reads 0/1
            action.default = text.strip().lower() not in ("", "0", "false", "no", "off")
            continue
        action.type = _from_environment(action, variable, text)
        action.default = text


def _version() -> str:
    from importlib.metadata import version

    import torch

    return (
        f"ft_launcher {version('nvrx-ft-launcher')} (nvrx-ft-core {version('nvrx-ft-core')}, "
        f"torch {torch.__version__}, Python {sys.version.split()[0]})"
    )


def get_parser() -> argparse.ArgumentParser:
    """The ft_launcher argument parser (also used to generate the CLI reference)."""
    from torch.distributed.run import get_args_parser

    parser = _FtParser(
        prog="ft_launcher",
        usage=_USAGE,
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        add_help=False,
        parents=[get_args_parser()],
    )
    parser.add_argument(
        "--version", action="version", version=_version(), help="print the versions and exit"
    )
    add_launcher_options(parser)
    return parser


def _resolve_rendezvous(args: argparse.Namespace) -> None:
    """torchrun's defaults: --standalone, or one node without an endpoint, needs no setup."""
    from torch.distributed.run import parse_min_max_nnodes

    _, max_nodes = parse_min_max_nnodes(args.nnodes)
    single_default = (
        args.rdzv_backend == "static"
        and not args.rdzv_endpoint
        and args.master_port is None
        and max_nodes == 1
    )
    if args.standalone or single_default:
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500


def _ft_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> FaultToleranceConfig:
    try:
        return FaultToleranceConfig.from_args(args)
    except FileNotFoundError as exc:
        parser.error(f"argument --ft-cfg-path: {args.ft_cfg_path!r}: no such file ({exc.strerror})")
    except (OSError, ValueError, RecursionError) as exc:
        parser.error(f"fault tolerance configuration: {exc}")


def _options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> LaunchOptions:
    from torch.distributed.run import config_from_args

    from ._launch import LaunchOptions
    from ._spares import DEFAULT_PRELOAD

    validate_torchrun_options(args, parser)
    ft_cfg = _ft_config(args, parser)
    _progress_rule_from_config(args, ft_cfg)
    validate_launcher_files(args, parser)
    warn_without_effect(args, parser)
    _resolve_rendezvous(args)
    try:
        config, cmd, cmd_args = config_from_args(args)
    except Exception as exc:  # torch raises ValueError, RuntimeError, AssertionError, ...
        parser.error(f"{exc or type(exc).__name__}")
    assert isinstance(cmd, str)
    cluster = _cluster_settings(args, ft_cfg, parser, config)
    local_ckpt = _local_ckpt.options(args, parser)
    validate_training_script(args, parser)  # after the options: a bad value is named first
    return LaunchOptions(
        config=config,
        command=[cmd, *cmd_args],
        ft_config=ft_cfg,
        term_timeout=_term_timeout(args),
        workers_stop_timeout=args.workers_stop_timeout,
        monitor_ready_timeout=args.monitor_ready_timeout,
        rdzv_poll_interval=args.rdzv_poll_interval,
        warm_spares=args.warm_spares,
        warm_spare_preload=(
            DEFAULT_PRELOAD if args.warm_spare_preload is None else tuple(args.warm_spare_preload)
        ),
        max_no_progress_restarts=max(0, args.ft_max_no_progress_restarts),  # -1: off
        min_progress_iterations=args.ft_min_progress_iterations,
        progress_file=args.ft_progress_file,
        no_restart_exit_code=args.ft_no_restart_exit_code,
        stop_on_repeated_error=args.ft_stop_on_repeated_error,
        cycle_log=args.ft_cycle_log,
        metrics_port=args.ft_metrics_port,
        metrics_addr=args.ft_metrics_addr,
        metrics_textfile=args.ft_metrics_textfile,
        metrics_pushgateway=args.ft_metrics_pushgateway,
        cluster=cluster,
        local_ckpt=local_ckpt,
        journal=args.ft_journal
        or (os.path.join(args.log_dir, "ft_launcher_events.jsonl") if args.log_dir else None),
    )


def _cluster_settings(
    args: argparse.Namespace,
    cfg: FaultToleranceConfig,
    parser: argparse.ArgumentParser,
    config: LaunchConfig,
) -> ClusterOptions:
    """The cluster features' settings; per-cycle logs replace torch's log layout."""
    from ._cluster import cluster_options

    try:
        cluster = cluster_options(args, cfg)
    except ValueError as exc:
        parser.error(str(exc))
    if cfg.segment is not None:  # --ft-segment (an FT config field, as in NVRx)
        cluster = _with_segments(cfg.segment, cluster, config, parser)
        _warn_short_settle(float(args.workers_stop_timeout), cluster, config)
    if cluster.standby_nodes:
        _check_standby(config, parser)
        cluster = dataclasses.replace(cluster, max_nodes=config.max_nodes)
    if args.ft_use_infra_group_rank is False:
        logger.warning(
            "--ft-use-infra-group-rank false has no effect: group ranks always follow "
            "SLURM_PROCID, then GROUP_RANK, then the rendezvous order (as in NVRx 0.7)"
        )
    if cluster.applog_prefix is not None:
        from torch.distributed.elastic.multiprocessing import Std

        if str(getattr(args, "redirects", "0")) != "0":
            logger.warning(
                "--redirects %s has no effect with --ft-per-cycle-applog-prefix: every "
                "rank's stdout and stderr go to the per-cycle files (--tee still copies "
                "them to the console)",
                args.redirects,
            )

        from ._app_logs import PerCycleLogsSpecs

        filtered = getattr(args, "local_ranks_filter", "") or ""
        config.logs_specs = PerCycleLogsSpecs(
            cluster.applog_prefix,
            log_dir=args.log_dir,
            tee=Std.from_str(args.tee),
            local_ranks_filter={int(r) for r in filtered.split(",")} if filtered else None,
        )
    return cluster


def _with_segments(
    size: int, cluster: ClusterOptions, config: LaunchConfig, parser: argparse.ArgumentParser
) -> ClusterOptions:
    """--ft-segment checked at start-up: c10d, MIN a multiple of N, this node's segment id."""
    from ._segment_id import node_segment_id
    from ._segments import SegmentSettings

    if config.rdzv_backend != "c10d":
        parser.error(
            f"argument --ft-segment: needs --rdzv-backend c10d (the segment gate uses its "
            f"store), not {config.rdzv_backend!r}"
        )
    if config.min_nodes % size != 0:
        parser.error(
            f"argument --ft-segment: {size} does not divide the --nnodes minimum "
            f"{config.min_nodes} (a job runs on whole segments only)"
        )
    try:
        segment_id, source = node_segment_id(os.environ)
    except ValueError as exc:
        parser.error(f"argument --ft-segment={size}: {exc}")
    logger.info("segment id %s (from %s), segments of %d nodes", segment_id, source, size)
    return dataclasses.replace(
        cluster,
        standby_nodes=True,
        segments=SegmentSettings(size, config.min_nodes, config.max_nodes, segment_id),
    )


def _warn_short_settle(stop_timeout: float, cluster: ClusterOptions, config: LaunchConfig) -> None:
    """A settle window shorter than a node's slowest way back to the gate breaks segments.

    At a restart a node first stops its ranks (up to --workers-stop-timeout) and runs
    its health checks; an active segment whose node is not back within torch's
    last_call_timeout is broken, so a slow but healthy node would take it out.
    """
    from ._node_health import COMMAND_TIMEOUT_S, STORAGE_TIMEOUT_S

    try:
        settle = float(config.rdzv_configs.get("last_call_timeout", 30))
    except (TypeError, ValueError):
        return  # torch refuses the value itself
    slowest = stop_timeout
    parts = [f"--workers-stop-timeout {stop_timeout:g} s"]
    if cluster.health.storage_paths:
        slowest += STORAGE_TIMEOUT_S
        parts.append(f"the storage health check up to {STORAGE_TIMEOUT_S:g} s")
    if cluster.health.command:
        slowest += COMMAND_TIMEOUT_S
        parts.append(f"the health check command up to {COMMAND_TIMEOUT_S:g} s")
    if settle < slowest:
        logger.warning(
            "--ft-segment: last_call_timeout=%g s (the settle window) is shorter than a "
            "node's slowest way back to a restart (%s: %g s); a slow but healthy node's "
            "segment can be declared broken and leave the job (exit 3). Set "
            "--rdzv-conf last_call_timeout=%d or more",
            settle,
            " + ".join(parts),
            slowest,
            int(slowest) + 5,
        )


def _check_standby(config: LaunchConfig, parser: argparse.ArgumentParser) -> None:
    """Standby nodes wait in the dynamic rendezvous' redundancy list: refuse the others."""
    if config.rdzv_backend not in ("c10d", "etcd-v2"):
        parser.error(
            f"argument --ft-standby-nodes: needs --rdzv-backend c10d or etcd-v2 (the "
            f"dynamic rendezvous), not {config.rdzv_backend!r}"
        )
    if config.min_nodes == config.max_nodes:
        logger.warning(
            "--ft-standby-nodes with --nnodes=%d has no standby places; give "
            "--nnodes=MIN:MAX (MIN nodes run the job, up to MAX-MIN wait)",
            config.min_nodes,
        )


def _progress_rule_from_config(args: argparse.Namespace, cfg: FaultToleranceConfig) -> None:
    """NVRx reads the progress rule from the YAML too: an option given wins over it."""
    if isinstance(args.ft_max_no_progress_restarts, _YamlDefault):
        args.ft_max_no_progress_restarts = cfg.max_no_progress_cycles
    if isinstance(args.ft_min_progress_iterations, _YamlDefault):
        args.ft_min_progress_iterations = max(1, cfg.min_progress_iterations)
    if args.ft_progress_file is None:
        args.ft_progress_file = cfg.checkpoint_iteration_file


def _term_timeout(args: argparse.Namespace) -> float:
    if args.term_timeout is not None:
        return float(args.term_timeout)
    shutdown_timeout = getattr(args, "shutdown_timeout", None)
    if shutdown_timeout is not None:
        return float(shutdown_timeout)
    return _TERM_TIMEOUT_DEFAULT


def _setup_logging() -> None:
    level_name = os.environ.get("NVRX_LAUNCHER_LOGLEVEL") or os.environ.get(
        "FT_LAUNCHER_LOGLEVEL", "INFO"
    )
    level = logging.getLevelName(level_name.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(log_formatter(f"ft_launcher {os.getpid()}"))
    logger.handlers[:] = [handler]
    logger.setLevel(level if isinstance(level, int) else logging.INFO)
    logger.propagate = False


# --- the early start of the monitors, before torch is imported ---------------------------


def launcher_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """The part of ``argv`` before the training script: what the launcher may read.

    The real parse finds the script as its first positional argument; this finds the same
    place without torch's parser, from the options ``parser`` knows (ours) and
    :data:`TORCHRUN_FLAGS` (every other torchrun option takes one value).
    """
    args = list(argv)
    index = 0
    while index < len(args):
        word = args[index]
        if word == "--" or not word.startswith("-") or word == "-":
            return args[:index]
        name, has_value, _ = word.partition("=")
        if has_value or (not word.startswith("--") and len(word) > 2):
            index += 1  # --opt=value, or a short option with its value attached (-r3)
            continue
        action = parser._option_string_actions.get(name)
        nargs = action.nargs if action is not None else 0 if name in TORCHRUN_FLAGS else None
        index += 1
        optional_value = nargs == "?" and index < len(args) and not args[index].startswith("-")
        if nargs is None or optional_value:
            index += 1
    return args


@dataclasses.dataclass(frozen=True)
class EarlySettings:
    """What the monitors need, read from the launcher's own part of the command line."""

    ft_config: FaultToleranceConfig
    local_world_size: int
    ready_timeout: float


def early_settings(argv: Sequence[str]) -> EarlySettings | None:
    """The monitors' settings if the command line gives them plainly, else None.

    None (the monitors then start after the full parse) for --help/--version, a count
    that needs torch (cpu, gpu, auto), a count beyond :func:`max_local_ranks`, or
    anything the full parse will refuse.
    """
    pre = _QuietParser(prog="ft_launcher", add_help=False, allow_abbrev=False, exit_on_error=False)
    pre.add_argument(
        "--nproc-per-node", "--nproc_per_node", default=os.environ.get("PET_NPROC_PER_NODE", "1")
    )
    try:
        add_launcher_options(pre)
        mine = launcher_argv(argv, pre)
        if any(token in ("-h", "--help", "--version") for token in mine):
            return None
        script = argv[len(mine)] if len(mine) < len(argv) else None
        program = any(t in ("-m", "--module", "--no-python", "--no_python") for t in mine)
        if script is None or (not program and not os.access(script, os.R_OK)):
            return None  # the full parse stops with a usage error: no monitor output first
        known, _ = pre.parse_known_args(mine)
        nproc = int(known.nproc_per_node)
        cfg = FaultToleranceConfig.from_args(known)
    except (argparse.ArgumentError, ValueError, OSError, RecursionError):
        return None
    if not 1 <= nproc <= max_local_ranks():
        return None
    return EarlySettings(cfg, nproc, known.monitor_ready_timeout)


def _early_monitors(argv: Sequence[str]) -> MonitorSupervisor | None:
    """Start the rank monitors before torch is imported, if the command line allows.

    Importing torch takes the launcher seconds; the monitors (which never import it)
    come up meanwhile instead of delaying the first workers. The full parse later
    confirms their settings; a mismatch just starts them again.
    """
    settings = early_settings(argv)
    if settings is None:
        return None
    monitors = MonitorSupervisor(
        settings.ft_config, settings.local_world_size, ready_timeout=settings.ready_timeout
    )
    try:
        monitors.start()
    except BaseException:
        monitors.close()
        raise
    return monitors


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ft_launcher``; returns the exit code (see :class:`ExitCode`).

    Run as the command (``argv`` None), it ends the process as soon as every child is
    gone and the logs are flushed, skipping the interpreter's finalisation: tearing
    down the imported torch takes longer than a short job (seconds, as in torchrun).
    """
    if argv is None:
        code = _run(sys.argv[1:])
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return _run(list(argv))


def _run(argv: list[str]) -> int:
    validate_environment(os.environ)  # exit 2 naming a bad variable, before anything starts
    _setup_logging()
    monitors = _early_monitors(argv)
    logger.debug("early monitors: %s", "started" if monitors is not None else "no")
    try:
        parser = checked_parser(get_parser, lambda built: launcher_argv(argv, built))
        options = _options(parser.parse_args(argv), parser)
        if monitors is not None and not monitors.matches(
            options.ft_config, options.config.nproc_per_node, options.monitor_ready_timeout
        ):
            logger.debug("early monitors do not match the full command line; restarting them")
            monitors.close()
            monitors = None
        from ._launch import launch

        handed_over, monitors = monitors, None
        return launch(options, monitors=handed_over)
    finally:
        if monitors is not None:
            monitors.close()
