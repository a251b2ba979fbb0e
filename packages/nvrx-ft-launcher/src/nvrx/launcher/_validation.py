"""Checks of torchrun's options, the launcher's files and environment, before anything starts.

torch checks some of these with asserts (a bare AssertionError, exit 5) and some not at
all (NaN and inf pass ``value < 0``); here each is a usage error, exit 2, naming the
option and the value, raised before a monitor, a runtime directory or a rank exists.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import math
import os
import re
import signal
import stat
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NoReturn

from nvrx.ft import MAX_DURATION_S

__all__ = [
    "MAX_DAYS",
    "check_option_names",
    "checked_parser",
    "max_local_ranks",
    "unsafe_output_path",
    "validate_environment",
    "validate_launcher_files",
    "validate_torchrun_options",
    "validate_training_script",
]

#: The longest duration any option accepts, in words (the same bound as nvrx.ft's).
MAX_DAYS = f"{MAX_DURATION_S / 86400:g} days"


def max_local_ranks() -> int:
    """The most ranks (and so monitors) one launcher starts on this machine.

    Oversubscribing CPUs is normal (CPU tests, GPU jobs with few cores), so the bound is
    generous; it only stops a typo or a hostile value from forking until the process limit.
    """
    return max(64, 8 * (os.cpu_count() or 1))


# Where checked_parser() keeps, on the parser, which options took their value from a
# PET_* variable (option string -> variable), so an error names the variable.
_FROM_ENV_ATTR = "_nvrx_options_from_environment"


def _source(parser: argparse.ArgumentParser, option: str) -> str:
    """'argument --opt', or 'environment variable PET_OPT' when the value came from it."""
    variable: str | None = getattr(parser, _FROM_ENV_ATTR, {}).get(option)
    return f"argument {option}" if variable is None else f"environment variable {variable}"


def _check(parser: argparse.ArgumentParser, ok: bool, option: str, value: object, why: str) -> None:
    if not ok:
        parser.error(f"{_source(parser, option)}: invalid value {value!r}: {why}")


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
            f"{_source(parser, '--nproc-per-node')}: invalid value {text!r}: expected an "
            "integer, cpu, gpu or auto"
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
    """The progress file, the job key file (or value) and the output paths are usable."""
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
    for option, dest, is_dir in _OUTPUTS:
        path = getattr(args, dest, None)
        if path:
            why = unsafe_output_path(path, is_dir=is_dir)
            if why is not None:
                parser.error(f"argument {option}: {path!r}: {why}")


def validate_training_script(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The training script exists and can be read, unless it is a program or a module.

    Checked after every option, so a bad option value is named first.

    Without this check a missing script fails every rank of every cycle, after the
    monitors, the rendezvous and each restart: the job spends its whole restart budget
    on a mistake that no restart can fix. With ``--no-python`` the command is a
    program found on PATH, with ``-m``/``--module`` a module name: neither is a path.
    """
    if getattr(args, "no_python", False) or getattr(args, "module", False):
        return
    script = args.training_script
    if os.path.isdir(script):
        why = "is a directory, not a Python script"
        if os.path.isfile(os.path.join(script, "__main__.py")):
            return  # python runs a directory with a __main__.py
    elif not os.path.exists(script):
        why = "no such file"
    elif not os.access(script, os.R_OK):
        why = "not readable by this user"
    else:
        return
    parser.error(
        f"training script {script!r}: {why} (looked in {os.getcwd()!r}; pass --no-python "
        "to run a program or -m to run a module)"
    )


#: What argparse reads as a negative number (a value, never an option).
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")


def check_option_names(parser: argparse.ArgumentParser, launcher_part: Sequence[str]) -> None:
    """Every option before the training script is one the parser knows, else a usage error.

    argparse would report a misspelt option only as "unrecognized arguments", and, as
    its value then reads as the training script, often name the wrong word. The error
    here names the option and the closest known spelling ("did you mean"). Options
    are matched whole (the parser has ``allow_abbrev=False``); words after the script
    belong to the script and are never looked at.
    """
    known = parser._option_string_actions
    words = list(launcher_part)
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":
            return
        if not word.startswith("-") or word == "-" or _NEGATIVE_NUMBER.fullmatch(word):
            continue
        name, has_value, _ = word.partition("=")
        action = known.get(name)
        if action is not None:
            if not has_value and action.nargs is None:
                index += 1  # its value, whatever it looks like
            elif not has_value and action.nargs == "?" and index < len(words):
                index += 0 if words[index].startswith("-") else 1
            continue
        if not word.startswith("--") and word[:2] in known:
            continue  # a short option with its value attached (-r3)
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        parser.error(f"unrecognized option {name}{hint}")


#: Options naming files (or a directory of files) the launcher writes: option, dest, dir.
_OUTPUTS = (
    ("--ft-journal", "ft_journal", False),
    ("--ft-cycle-log", "ft_cycle_log", False),
    ("--ft-metrics-textfile", "ft_metrics_textfile", False),
    ("--ft-per-cycle-applog-prefix", "ft_per_cycle_applog_prefix", False),
    ("--ft-cycle-info-dir", "ft_cycle_info_dir", True),
    ("--log-dir", "log_dir", True),  # the default journal's directory, and torch's logs
)


def unsafe_output_path(path: str | os.PathLike[str], *, is_dir: bool = False) -> str | None:
    """Why the launcher must not write ``path`` (or files in directory ``path``), or None.

    Refused: a final component that is a symlink (files are opened without following
    one), and a directory, the file's parent or ``path`` itself when ``is_dir``, that
    every user may write to without the sticky bit: there anybody could replace the
    file, or plant a symlink before it exists. Group-writable directories (a project's
    shared log directory) are fine; so is a sticky world-writable one such as /tmp,
    where a file of ours cannot be replaced by others.
    """
    where = os.fspath(path)
    if not is_dir:
        try:
            if stat.S_ISLNK(os.lstat(where).st_mode):
                return "is a symlink; name the file itself (the launcher does not follow links)"
        except OSError:
            pass  # not there yet: the launcher creates it
    directory = where if is_dir else (os.path.dirname(os.path.abspath(where)) or "/")
    try:
        st = os.stat(directory)
    except OSError:
        return None  # reported by the option's own check, or created later
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return (
            f"the directory {directory!r} is writable by every user and not sticky, so "
            "another user could replace the file or plant a symlink there; use a "
            "directory others cannot write to (or a sticky one, such as /tmp)"
        )
    return None


# -- the environment ------------------------------------------------------------------

#: Level names NVRX_LAUNCHER_LOGLEVEL and FT_LAUNCHER_LOGLEVEL accept, in any case.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL", "NOTSET")
_JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,128}\Z")
_MAX_INDEX = 1 << 31


def _env_error(variable: str, value: str, why: str) -> NoReturn:
    """A usage error (exit 2) naming the variable and its value; no parser needed."""
    sys.stderr.write(
        f"ft_launcher: error: environment variable {variable}: invalid value {value!r}: {why}\n"
    )
    raise SystemExit(2)


def _is_index(text: str) -> bool:
    value = text.strip()
    return value.isascii() and value.isdigit() and int(value) < _MAX_INDEX


def _check_log_level(env: Mapping[str, str]) -> None:
    for variable in ("NVRX_LAUNCHER_LOGLEVEL", "FT_LAUNCHER_LOGLEVEL"):
        text = env.get(variable)
        if not text:
            continue  # unset or empty: the other variable, or INFO
        if text.upper() not in LOG_LEVELS:
            _env_error(
                variable, text, "expected a log level: DEBUG, INFO, WARNING, ERROR or CRITICAL"
            )


def validate_environment(env: Mapping[str, str]) -> None:
    """Every documented variable the launcher reads, checked before anything starts.

    Exit 2 naming the variable and the value. Values torchrun and NVRx accept stay
    accepted (log level names, in any case). PET_* variables of options are
    checked with the options (:func:`checked_parser`); ``XDG_RUNTIME_DIR`` falls back to
    the temp dir when unusable (documented), and torch's own TORCHELASTIC_* variables
    are torch's to read.
    """
    from ._numa import GPUS_PER_NUMA_ENV, parse_gpus_per_numa
    from ._segment_id import SEGMENT_ID_ENV, parse_segment_id

    _check_log_level(env)
    for variable in ("SLURM_PROCID", "GROUP_RANK"):
        text = env.get(variable)
        if text is not None and not _is_index(text):
            _env_error(variable, text, "expected this node's rank, an integer >= 0")
    text = env.get("SLURM_RESTART_CNT")
    if text is not None and text.strip() and not _is_index(text):
        _env_error("SLURM_RESTART_CNT", text, "expected the requeue count, an integer >= 0")
    for variable in ("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID"):
        text = env.get(variable)
        if text and not _JOB_ID.match(text):
            _env_error(variable, text, "expected a job id: 1-128 of A-Z a-z 0-9 . _ -")
    for variable, parse in (
        (SEGMENT_ID_ENV, parse_segment_id),
        (GPUS_PER_NUMA_ENV, parse_gpus_per_numa),
    ):
        text = env.get(variable)
        if text is not None and (text or variable == SEGMENT_ID_ENV):
            try:
                parse(text)
            except ValueError as exc:
                _env_error(variable, text, str(exc).split(": ", 1)[-1])
    text = env.get("OMP_NUM_THREADS")
    if text and not all(_is_index(part) and int(part) > 0 for part in text.split(",")):
        _env_error(
            "OMP_NUM_THREADS", text, "expected a thread count >= 1 (or a comma-separated list)"
        )


@contextlib.contextmanager
def _without_pet_variables() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith("PET_")}
    for name in saved:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(saved)


def _given(action: argparse.Action, argv: Sequence[str]) -> bool:
    """Whether the command line (the launcher's part of it) gives ``action``'s option."""
    for word in argv:
        if word == "--":
            return False
        for option in action.option_strings:
            short = not option.startswith("--")
            if word == option or word.startswith(option + "=") or (short and word[:2] == option):
                return True
    return False


def checked_parser(
    build: Callable[[], argparse.ArgumentParser],
    launcher_part: Callable[[argparse.ArgumentParser], Sequence[str]],
) -> argparse.ArgumentParser:
    """``build()``, with the PET_* variables of torchrun's own options checked.

    torch reads them itself: a flag's (``PET_STANDALONE``) with ``int()`` while it builds
    its parser (a traceback for ``true``), a value's with the option's type at the end of
    the parse (an error naming the option). Here each is checked first, and an error
    names the variable and the value; torchrun's accepted values stay accepted. The
    parser remembers which options take their value from a variable, so the later
    checks of :func:`validate_torchrun_options` name the variable too.
    ``launcher_part(parser)`` is the launcher's part of the command line: an option
    given there wins over its variable.
    """
    from torch.distributed.argparse_util import check_env
    from torch.distributed.run import get_args_parser

    with _without_pet_variables():
        torchrun = get_args_parser()
    valued: list[tuple[argparse.Action, str, str]] = []
    for action in torchrun._actions:
        variable = f"PET_{action.dest.upper()}"
        text = os.environ.get(variable)
        if not action.option_strings or text is None:
            continue
        if isinstance(action, check_env):
            try:
                int(text)
            except ValueError:
                _env_error(variable, text, "expected 0 or 1 (torchrun reads an integer)")
        else:
            valued.append((action, variable, text))
    parser = build()
    argv = launcher_part(parser)
    from_env: dict[str, str] = {}
    for action, variable, text in valued:
        if _given(action, argv):
            continue
        value: object = text
        if callable(action.type):
            try:
                value = action.type(text)
            except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
                option = action.option_strings[0]
                _env_error(variable, text, f"not a value of {option}: {exc}")
        if action.choices is not None and value not in action.choices:
            _env_error(variable, text, f"expected one of {', '.join(map(str, action.choices))}")
        for option in action.option_strings:
            from_env[option] = variable
    setattr(parser, _FROM_ENV_ATTR, from_env)
    check_option_names(parser, argv)
    return parser
