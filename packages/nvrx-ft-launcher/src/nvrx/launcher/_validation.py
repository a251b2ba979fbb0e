"""Checks of torchrun's options and the launcher's files, before anything starts.

torch checks some of these with asserts (a bare AssertionError, exit 5) and some not at
all (NaN and inf pass ``value < 0``); here each is a usage error, exit 2, naming the
option and the value, raised before a monitor, a runtime directory or a rank exists.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys

from nvrx.ft import MAX_DURATION_S

__all__ = ["MAX_DAYS", "max_local_ranks", "validate_launcher_files", "validate_torchrun_options"]

#: The longest duration any option accepts, in words (the same bound as nvrx.ft's).
MAX_DAYS = f"{MAX_DURATION_S / 86400:g} days"


def max_local_ranks() -> int:
    """The most ranks (and so monitors) one launcher starts on this machine.

    Oversubscribing CPUs is normal (CPU tests, GPU jobs with few cores), so the bound is
    generous; it only stops a typo or a hostile value from forking until the process limit.
    """
    return max(64, 8 * (os.cpu_count() or 1))


def _check(parser: argparse.ArgumentParser, ok: bool, option: str, value: object, why: str) -> None:
    if not ok:
        parser.error(f"argument {option}: invalid value {value!r}: {why}")


def _finite_in(value: object, low: float, high: float, *, above: bool = False) -> bool:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and (number > low if above else number >= low) and number <= high


def _validate_nproc(parser: argparse.ArgumentParser, text: str) -> None:
    if text in ("cpu", "gpu", "auto"):
        return
    limit = max_local_ranks()
    try:
        count = int(text)
    except ValueError:
        count = 0
        parser.error(
            f"argument --nproc-per-node: invalid value {text!r}: expected an integer, "
            "cpu, gpu or auto"
        )
    _check(
        parser,
        1 <= count <= limit,
        "--nproc-per-node",
        text,
        f"expected 1 to {limit} local ranks on this machine",
    )


def _validate_signals(parser: argparse.ArgumentParser, names: str) -> None:
    for name in names.split(","):
        name = name.strip()
        if not name:
            continue
        sig = signal.Signals.__members__.get(name)
        _check(
            parser,
            sig is not None and sig not in (signal.SIGKILL, signal.SIGSTOP),
            "--signals-to-handle",
            name,
            "expected signal names that can be caught, e.g. SIGTERM,SIGINT",
        )


def _validate_rdzv_conf(parser: argparse.ArgumentParser, text: str) -> None:
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    try:
        conf = _parse_rendezvous_config(text)
    except ValueError as exc:
        parser.error(f"argument --rdzv-conf: invalid value {text!r}: {exc}")
    for key, value in conf.items():
        if key.endswith(("timeout", "interval")):
            _check(
                parser,
                _finite_in(value, 0.0, MAX_DURATION_S, above=True),
                "--rdzv-conf",
                f"{key}={value}",
                f"expected a number of seconds above 0, at most {MAX_DAYS}",
            )


def validate_torchrun_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """What torch checks with asserts (or not at all) becomes a usage error naming the value."""
    from torch.distributed.run import parse_min_max_nnodes

    try:
        min_nodes, max_nodes = parse_min_max_nnodes(args.nnodes)
    except (ValueError, RuntimeError):
        min_nodes = max_nodes = 0
    _check(
        parser,
        0 < min_nodes <= max_nodes,
        "--nnodes",
        args.nnodes,
        "expected N or MIN:MAX with 0 < MIN <= MAX",
    )
    _validate_nproc(parser, args.nproc_per_node)
    _check(parser, args.max_restarts >= 0, "--max-restarts", args.max_restarts, "expected >= 0")
    _check(
        parser,
        _finite_in(args.monitor_interval, 0.0, MAX_DURATION_S, above=True),
        "--monitor-interval",
        args.monitor_interval,
        f"expected a number of seconds above 0, at most {MAX_DAYS}",
    )
    shutdown_timeout = getattr(args, "shutdown_timeout", None)
    if shutdown_timeout is not None:
        _check(
            parser,
            _finite_in(shutdown_timeout, 0.0, MAX_DURATION_S),
            "--shutdown-timeout",
            shutdown_timeout,
            f"expected a number of seconds from 0 to {MAX_DAYS}",
        )
    _check(parser, args.node_rank >= 0, "--node-rank", args.node_rank, "expected >= 0")
    if args.master_port is not None:
        _check(
            parser,
            0 <= args.master_port <= 65535,
            "--master-port",
            args.master_port,
            "expected a TCP port 0 to 65535",
        )
    _validate_signals(parser, getattr(args, "signals_to_handle", "SIGTERM,SIGINT"))
    _validate_rdzv_conf(parser, args.rdzv_conf)
    if args.run_path:
        parser.error(
            "argument --run-path: not supported: torchrun runs the script inside its own "
            "interpreter, but ft_launcher supervises every rank as a process of its own "
            "(to stop, restart and monitor it). Drop --run-path: the script then runs as "
            f"'{sys.executable} {args.training_script}' (or pass --no-python for a program)"
        )


def validate_launcher_files(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The progress file and the job key file (or value) are usable."""
    from ._job_key import load_job_key
    from ._progress import check_progress_file

    try:
        load_job_key(os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    if args.ft_progress_file:
        try:
            check_progress_file(args.ft_progress_file)
        except ValueError as exc:
            parser.error(f"argument --ft-progress-file: {args.ft_progress_file!r}: {exc}")
