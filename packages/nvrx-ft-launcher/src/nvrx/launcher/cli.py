"""The ``ft_launcher`` command: torchrun's command line plus the fault-tolerance options.

The parser is torch's own (``torch.distributed.run.get_args_parser``), so every
torchrun option keeps its spelling, default and ``PET_*`` variable; we add the
launcher's restart options, one ``--ft-<field>`` option per
:class:`nvrx.ft.FaultToleranceConfig` field, and NVRx's deprecated spellings.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from nvrx.ft import FaultToleranceConfig, add_config_arguments

from .exit_codes import exit_codes_table
from .monitors import MonitorSupervisor

if TYPE_CHECKING:
    from .launch import LaunchOptions

__all__ = ["get_parser", "main"]

logger = logging.getLogger("nvrx.launcher")

_DESCRIPTION = """\
Launch a PyTorch training job like torchrun, with a hang/crash monitor per rank and
in-job restarts: when a rank crashes or hangs, every node stops its ranks,
re-rendezvouses and starts them again, up to --max-restarts times for the whole job.
Every torchrun option is accepted with its meaning and its PET_* variable."""

_EPILOG = "exit codes:\n" + exit_codes_table()


def _number(kind: Callable[[str], Any], *, minimum: float, what: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected {what}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected {what}")
        return value

    convert.__name__ = what
    return convert


_TERM_TIMEOUT_DEFAULT = 1800.0
_SECONDS = _number(float, minimum=0.0, what="a number of seconds >= 0")
_COUNT = _number(int, minimum=0, what="an integer >= 0")
_POSITIVE = _number(int, minimum=1, what="an integer >= 1")


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
        logger.warning(
            "%s is deprecated and will be removed; use %s", option_string, self.replacement
        )
        setattr(namespace, self.dest, values)


def _add_deprecated_ft_aliases(parser: argparse.ArgumentParser) -> None:
    """Accept NVRx's ``--ft-param-<field>`` spellings (hidden from --help)."""
    for action in list(parser._actions):
        if not action.dest.startswith("ft_") or not action.option_strings:
            continue
        field = action.dest[len("ft_") :]
        if field not in FaultToleranceConfig.field_names():
            continue
        flags = sorted({f"--ft-param-{field}", f"--ft-param-{field.replace('_', '-')}"})
        typed: dict[str, Any] = {} if action.type is None else {"type": action.type}
        parser.add_argument(
            *flags,
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
        dest="ft_cfg_path",
        action=_DeprecatedOption,
        replacement="--ft-cfg-path",
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


def get_parser() -> argparse.ArgumentParser:
    """The ft_launcher argument parser (also used to generate the CLI reference)."""
    from torch.distributed.argparse_util import check_env, env
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "ft_launcher"
    parser.description = _DESCRIPTION
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter

    restart = parser.add_argument_group(
        "restarts and supervision",
        "How ft_launcher stops, restarts and gives up. --max-restarts counts restarts "
        "of the whole job, agreed by all nodes.",
    )
    restart.add_argument(
        "--term-timeout",
        "--term_timeout",
        action=env,
        type=_SECONDS,
        default=None,
        help="seconds between forwarding SIGTERM/SIGINT to the ranks and SIGKILL "
        f"(default: torchrun's --shutdown-timeout if given, else {_TERM_TIMEOUT_DEFAULT:g})",
    )
    restart.add_argument(
        "--workers-stop-timeout",
        "--workers_stop_timeout",
        action=env,
        type=_SECONDS,
        default=15.0,
        help="seconds between SIGTERM and SIGKILL when stopping ranks for a restart",
    )
    restart.add_argument(
        "--rdzv-poll-interval",
        "--rdzv_poll_interval",
        action=env,
        type=_SECONDS,
        default=0.1,
        help="seconds between reads of the rendezvous state while waiting for other nodes "
        "(torch polls every second)",
    )
    restart.add_argument(
        "--monitor-ready-timeout",
        "--monitor_ready_timeout",
        action=env,
        type=_SECONDS,
        default=30.0,
        help="seconds to wait for a rank monitor to come up",
    )
    restart.add_argument(
        "--warm-spares",
        "--warm_spares",
        action=check_env,
        help="keep one spare Python per local rank, with --warm-spare-preload imported, so a "
        "restart skips interpreter start-up and the imports (seconds per rank); costs one "
        "idle process per local rank. Needs a Python script or -m module (not --no-python)",
    )
    restart.add_argument(
        "--warm-spare-preload",
        "--warm_spare_preload",
        action=env,
        type=_module_list,
        default=("torch",),
        help="comma-separated modules a warm spare imports before it is needed "
        "(default: torch), e.g. torch,lightning",
    )
    restart.add_argument(
        "--ft-max-no-progress-restarts",
        "--ft-max-no-progress-cycles",
        "--ft-max_no_progress_restarts",
        dest="ft_max_no_progress_restarts",
        type=_COUNT,
        default=3,
        help="stop with exit code 93 when ranks fail again after this many consecutive "
        "restarts that made no progress (needs --ft-progress-file; 0 disables)",
    )
    restart.add_argument(
        "--ft-min-progress-iterations",
        "--ft-min_progress_iterations",
        dest="ft_min_progress_iterations",
        type=_POSITIVE,
        default=1,
        help="how far the value in --ft-progress-file must move for a cycle to count as progress",
    )
    restart.add_argument(
        "--ft-progress-file",
        "--ft-checkpoint-iteration-file",
        "--ft-progress_file",
        dest="ft_progress_file",
        default=None,
        help="file holding an integer the training advances, e.g. the iteration of its "
        "last checkpoint; read at each restart decision",
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

    ft = parser.add_argument_group(
        "fault tolerance",
        "Rank monitor settings (nvrx.ft.FaultToleranceConfig). A YAML file given with "
        "--ft-cfg-path is read first; an option overrides it only when given.",
    )
    add_config_arguments(ft, cfg_path_default=os.environ.get("PET_FT_CFG_PATH"))
    _add_deprecated_ft_aliases(parser)
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


def _options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> LaunchOptions:
    from torch.distributed.run import config_from_args, parse_min_max_nnodes

    from .launch import LaunchOptions

    try:
        parse_min_max_nnodes(args.nnodes)
    except (ValueError, RuntimeError):
        parser.error(f"argument --nnodes: invalid value {args.nnodes!r}: expected N or MIN:MAX")
    try:
        ft_cfg = FaultToleranceConfig.from_args(args)
    except (OSError, ValueError) as exc:
        parser.error(f"fault tolerance configuration: {exc}")
    if args.run_path:
        # Same program, run in its own interpreter like every other rank, so the
        # launcher can supervise it as a process.
        args.run_path = False
    _resolve_rendezvous(args)
    try:
        config, cmd, cmd_args = config_from_args(args)
    except (ValueError, RuntimeError, AssertionError) as exc:
        parser.error(str(exc))
    assert isinstance(cmd, str)
    return LaunchOptions(
        config=config,
        command=[cmd, *cmd_args],
        ft_config=ft_cfg,
        term_timeout=_term_timeout(args),
        workers_stop_timeout=args.workers_stop_timeout,
        monitor_ready_timeout=args.monitor_ready_timeout,
        rdzv_poll_interval=args.rdzv_poll_interval,
        warm_spares=args.warm_spares,
        warm_spare_preload=tuple(args.warm_spare_preload),
        max_no_progress_restarts=args.ft_max_no_progress_restarts,
        min_progress_iterations=args.ft_min_progress_iterations,
        progress_file=args.ft_progress_file,
        cycle_log=args.ft_cycle_log,
        journal=args.ft_journal
        or (os.path.join(args.log_dir, "ft_launcher_events.jsonl") if args.log_dir else None),
    )


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
    handler.setFormatter(
        logging.Formatter(
            f"[ft_launcher {os.getpid()}] %(asctime)s.%(msecs)03d %(levelname)s: %(message)s",
            datefmt="%H:%M:%S",
        )
    )
    logger.handlers[:] = [handler]
    logger.setLevel(level if isinstance(level, int) else logging.INFO)
    logger.propagate = False


class _QuietParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def _early_monitors(argv: Sequence[str]) -> MonitorSupervisor | None:
    """Start the rank monitors before torch is imported, if the command line allows.

    Importing torch takes the launcher seconds; the monitors (which never import it)
    come up meanwhile instead of delaying the first workers. This reads only the
    options the monitors need; the full parse later confirms them, and a mismatch
    (e.g. a script argument that looked like ours) just starts them again.
    """
    pre = _QuietParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    pre.add_argument(
        "--nproc-per-node", "--nproc_per_node", default=os.environ.get("PET_NPROC_PER_NODE", "1")
    )
    pre.add_argument(
        "--monitor-ready-timeout",
        "--monitor_ready_timeout",
        type=float,
        default=float(os.environ.get("PET_MONITOR_READY_TIMEOUT", "30")),
    )
    add_config_arguments(pre, cfg_path_default=os.environ.get("PET_FT_CFG_PATH"))
    try:
        known, _ = pre.parse_known_args(argv)
        nproc = int(known.nproc_per_node)
        cfg = FaultToleranceConfig.from_args(known)
    except (argparse.ArgumentError, ValueError, OSError):
        return None
    if nproc < 1:
        return None
    monitors = MonitorSupervisor(cfg, nproc, ready_timeout=known.monitor_ready_timeout)
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
    _setup_logging()
    wants_help = any(a in ("-h", "--help") for a in argv)
    monitors = None if wants_help else _early_monitors(argv)
    logger.debug("early monitors: %s", "started" if monitors is not None else "no")
    try:
        parser = get_parser()
        options = _options(parser.parse_args(argv), parser)
        if monitors is not None and not monitors.matches(
            options.ft_config, options.config.nproc_per_node, options.monitor_ready_timeout
        ):
            monitors.close()
            monitors = None
        from .launch import launch

        handed_over, monitors = monitors, None
        return launch(options, monitors=handed_over)
    finally:
        if monitors is not None:
            monitors.close()
