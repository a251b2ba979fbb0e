"""The fault tolerance configuration, and how it is read from kwargs, YAML and the CLI.

One coercion function per field is the single source of truth: kwargs, YAML and the
``--ft-<field>`` command-line options all go through it, so they cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import math
import os
import pathlib
import signal
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "CLI_NONE",
    "FaultToleranceConfig",
    "add_config_arguments",
    "add_ft_arguments",
    "parse_bool",
    "parse_log_level",
    "parse_section_timeouts",
    "parse_signal",
]

#: What an ``--ft-<timeout>`` option stores in the namespace when given ``none``/``null``;
#: ``None`` in the namespace means "option not given".
CLI_NONE = "none"

_NONE_WORDS = frozenset({"none", "null", "~", ""})
_TRUE_WORDS = frozenset({"true", "1", "yes", "y", "on"})
_FALSE_WORDS = frozenset({"false", "0", "no", "n", "off"})
_LOG_LEVELS = {
    "DEBUG": logging.DEBUG,
    "DBG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}


def _bad(field: str, value: object, why: str) -> ValueError:
    return ValueError(f"FaultToleranceConfig.{field}: invalid value {value!r}: {why}")


def _positive_float(field: str, value: object) -> float:
    if isinstance(value, bool):
        raise _bad(field, value, "expected a number of seconds, got a bool")
    number: object = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise _bad(field, value, "expected a number") from None
    if not isinstance(number, (int, float)):
        raise _bad(field, value, "expected a number")
    result = float(number)
    if not math.isfinite(result) or result <= 0:
        raise _bad(field, value, "must be a finite number greater than 0")
    return result


def _optional_timeout(field: str, value: object) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
        return None
    return _positive_float(field, value)


def _safety_factor(field: str, value: object) -> float:
    result = _positive_float(field, value)
    if result < 1.0:
        raise _bad(field, value, "must be at least 1.0 (a timeout below the observed maximum)")
    return result


def parse_bool(field: str, value: object) -> bool:
    """Read a boolean from a bool, 0/1, or words such as true/false/yes/no/on/off."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise _bad(field, value, "expected true/false")


def parse_signal(field: str, value: object) -> signal.Signals:
    """Read a signal from a Signals, an int, or a name such as ``SIGTERM`` or ``term``."""
    if isinstance(value, signal.Signals):
        return value
    if isinstance(value, bool):
        raise _bad(field, value, "expected a signal name or number")
    if isinstance(value, int):
        try:
            return signal.Signals(value)
        except ValueError:
            raise _bad(field, value, "not a signal number") from None
    if isinstance(value, str):
        name = value.strip().upper()
        if name.isdigit():
            return parse_signal(field, int(name))
        if not name.startswith("SIG"):
            name = "SIG" + name
        try:
            return signal.Signals[name]
        except KeyError:
            raise _bad(field, value, "not a signal name") from None
    raise _bad(field, value, "expected a signal name or number")


def _optional_signal(field: str, value: object) -> signal.Signals | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
        return None
    result = parse_signal(field, value)
    if result in (signal.SIGKILL, signal.SIGSTOP):
        raise _bad(field, value, "a stack dump needs a signal that can be caught")
    return result


def parse_log_level(field: str, value: object) -> int:
    """Read a logging level from an int in DEBUG..CRITICAL or a level name."""
    if isinstance(value, bool):
        raise _bad(field, value, "expected a log level")
    if isinstance(value, int):
        if logging.DEBUG <= value <= logging.CRITICAL:
            return value
        raise _bad(field, value, "must be between DEBUG (10) and CRITICAL (50)")
    if isinstance(value, str):
        word = value.strip().upper()
        if word.isdigit():
            return parse_log_level(field, int(word))
        if word in _LOG_LEVELS:
            return _LOG_LEVELS[word]
        raise _bad(field, value, f"expected one of {', '.join(_LOG_LEVELS)}")
    raise _bad(field, value, "expected a log level")


def parse_section_timeouts(field: str, value: object) -> dict[str, float | None]:
    """Read section timeouts from a mapping or from ``"name:seconds,name2:none"``."""
    if value is None:
        return {}
    if isinstance(value, str):
        items: dict[str, object] = {}
        for part in value.split(","):
            if not part.strip():
                continue
            name, sep, seconds = part.partition(":")
            if not sep:
                raise _bad(field, value, f"entry {part!r} is not name:seconds")
            if name.strip() in items:
                raise _bad(field, value, f"section {name.strip()!r} is given twice")
            items[name.strip()] = seconds
        value = items
    if not isinstance(value, Mapping):
        raise _bad(field, value, "expected a mapping of section name to seconds")
    result: dict[str, float | None] = {}
    for name, seconds in value.items():
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise _bad(field, value, f"section name {name!r} must be a non-empty string")
        result[name] = _optional_timeout(f"{field}[{name!r}]", seconds)
    return result


def _optional_str(field: str, value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise _bad(field, value, "expected a string")
    return value or None


def _link_down_template(field: str, value: object) -> str | None:
    result = _optional_str(field, value)
    if result is not None and "{nic}" not in result:
        raise _bad(field, value, "must contain the placeholder {nic}")
    return result


_Coerce = Callable[[str, object], Any]

_COERCE: dict[str, _Coerce] = {
    "workload_check_interval": _positive_float,
    "initial_rank_heartbeat_timeout": _optional_timeout,
    "rank_heartbeat_timeout": _optional_timeout,
    "rank_section_timeouts": parse_section_timeouts,
    "rank_out_of_section_timeout": _optional_timeout,
    "node_health_check_interval": _positive_float,
    "safety_factor": _safety_factor,
    "min_calculated_timeout": _optional_timeout,
    "rank_termination_signal": parse_signal,
    "rank_termination_grace_period": _positive_float,
    "stack_dump_signal": _optional_signal,
    "log_level": parse_log_level,
    "enable_gpu_monitor": parse_bool,
    "enable_nic_monitor": parse_bool,
    "pci_topo_file": _optional_str,
    "link_down_path_template": _link_down_template,
}

_HELP: dict[str, str] = {
    "workload_check_interval": "longest pause in seconds between two checks of the rank "
    "(timeouts are also checked exactly when they fall due)",
    "initial_rank_heartbeat_timeout": "seconds from init to the first heartbeat; none disables",
    "rank_heartbeat_timeout": "seconds between heartbeats; none disables",
    "rank_section_timeouts": "per-section timeouts, 'name:seconds,name2:none'",
    "rank_out_of_section_timeout": "seconds with no section open; none disables",
    "node_health_check_interval": "seconds between GPU/NIC health checks",
    "safety_factor": "calculated timeout = safety factor x longest observed interval",
    "min_calculated_timeout": "no calculated timeout is shorter than this; none: no floor",
    "rank_termination_signal": "signal sent to a hung or unhealthy rank, e.g. SIGTERM",
    "rank_termination_grace_period": "seconds between that signal and SIGKILL",
    "stack_dump_signal": "signal that asks the rank for a stack dump first; none disables",
    "log_level": "monitor log level, e.g. INFO or DEBUG",
    "enable_gpu_monitor": "check GPU health through NVML (skipped without a GPU)",
    "enable_nic_monitor": "check the InfiniBand link_downed counter",
    "pci_topo_file": "NCCL-style topology XML mapping GPUs to NICs",
    "link_down_path_template": "path of a NIC's link_downed counter, with {nic}",
}

#: NVRx settings that have no counterpart here; accepted (and ignored) for easy porting.
_NVRX_ONLY_FIELDS = frozenset(
    {
        "restart_check_interval",
        "skip_section_response",
        "enable_nic_healthcheck",
        "link_state_path_template",
        "num_warmup_iterations",
        "install_exception_hook",
    }
)
_logger = logging.getLogger("nvrx.ft.config")

#: Fields whose CLI option accepts ``none``/``null``.
_NULLABLE = frozenset(
    {
        "initial_rank_heartbeat_timeout",
        "rank_heartbeat_timeout",
        "rank_out_of_section_timeout",
        "min_calculated_timeout",
        "stack_dump_signal",
        "pci_topo_file",
        "link_down_path_template",
    }
)


@dataclasses.dataclass
class FaultToleranceConfig:
    """Everything a rank monitor needs to decide that a rank is hung or unhealthy.

    Timeouts are in seconds; ``None`` disables that check. The heartbeat timeouts only
    apply to a rank that sends heartbeats or has not opened a section yet, so a
    sections-only workload is never killed for missing heartbeats; the out-of-section
    timeout is off by default, so a heartbeats-only workload is never killed for
    having no section open.

    A hung rank gets SIGCONT, ``stack_dump_signal`` (its faulthandler dumps every
    thread's stack into its log), ``rank_termination_signal`` and, after
    ``rank_termination_grace_period``, SIGKILL. The default signal is SIGTERM rather than
    NVRx's SIGKILL so the rank can flush logs; the grace-period SIGKILL still ends it,
    and the launcher counts a rank its monitor terminated as failed even when a
    framework (Lightning) turns SIGTERM into exit status 0. Set SIGKILL to skip that step.
    """

    workload_check_interval: float = 0.1
    initial_rank_heartbeat_timeout: float | None = 3600.0
    rank_heartbeat_timeout: float | None = 2700.0
    rank_section_timeouts: dict[str, float | None] = dataclasses.field(default_factory=dict)
    rank_out_of_section_timeout: float | None = None
    node_health_check_interval: float = 5.0
    safety_factor: float = 5.0
    min_calculated_timeout: float | None = 30.0
    rank_termination_signal: signal.Signals = signal.SIGTERM
    rank_termination_grace_period: float = 5.0
    stack_dump_signal: signal.Signals | None = signal.SIGUSR2
    log_level: int = logging.INFO
    enable_gpu_monitor: bool = True
    enable_nic_monitor: bool = False
    pci_topo_file: str | None = None
    link_down_path_template: str | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, _COERCE[f.name](f.name, getattr(self, f.name)))

    @staticmethod
    def field_names() -> tuple[str, ...]:
        """The configuration fields, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(FaultToleranceConfig))

    @classmethod
    def from_kwargs(cls, ignore_not_recognized: bool = True, **kwargs: Any) -> FaultToleranceConfig:
        """Build from keyword arguments.

        A name that looks like a misspelt field (``rank_heartbeat_timout``) is always an
        error. Other unknown names are an error with ``ignore_not_recognized=False`` and
        are otherwise dropped with a warning, so a shared config section may carry
        other settings. NVRx fields nvrx does not need (``restart_check_interval``...)
        are dropped with a warning.
        """
        known = cls.field_names()
        unknown = sorted(set(kwargs) - set(known) - _NVRX_ONLY_FIELDS)
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            if close:
                raise ValueError(
                    f"Not recognized FaultToleranceConfig field {name!r} "
                    f"(did you mean {close[0]!r}?)"
                )
        if unknown and not ignore_not_recognized:
            raise ValueError(f"Not recognized FaultToleranceConfig fields: {', '.join(unknown)}")
        ignored = sorted(set(kwargs) - set(known))
        if ignored:
            _logger.warning("ignoring settings that are not nvrx.ft config fields: %s", ignored)
        return cls(**{k: v for k, v in kwargs.items() if k in known})

    @classmethod
    def from_yaml_file(
        cls, cfg_path: str | os.PathLike[str], ignore_not_recognized: bool = True
    ) -> FaultToleranceConfig:
        """Build from the first ``fault_tolerance`` mapping found at any depth of a YAML file.

        A missing file is FileNotFoundError; anything wrong inside it (YAML syntax, no
        section, a bad value, an unknown field when not ignored) is a ValueError that
        starts with the file's path.
        """
        import yaml  # only here: a monitor process never needs it

        path = pathlib.Path(cfg_path)
        try:
            with path.open(encoding="utf-8") as stream:
                document = yaml.safe_load(stream)
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not a valid YAML file: {exc}") from None
        section = _find_ft_section(document)
        if section is None:
            raise ValueError(f"{path}: no 'fault_tolerance' section found")
        if not isinstance(section, Mapping):
            raise ValueError(f"{path}: the 'fault_tolerance' section is not a mapping")
        if not all(isinstance(key, str) for key in section):
            raise ValueError(f"{path}: the 'fault_tolerance' section has non-string keys")
        try:
            return cls.from_kwargs(ignore_not_recognized=ignore_not_recognized, **dict(section))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FaultToleranceConfig:
        """Build from ``--ft-cfg-path`` (if given) overridden by every given ``ft_<field>``.

        A misspelt field in the file is an error; other unknown keys are ignored with a
        warning (see :meth:`from_kwargs`).
        """
        values: dict[str, Any] = {}
        cfg_path = getattr(args, "ft_cfg_path", None)
        if cfg_path:
            values = dataclasses.asdict(cls.from_yaml_file(cfg_path))
        for name in cls.field_names():
            given = getattr(args, f"ft_{name}", None)
            if given is not None:
                values[name] = given
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-safe values (signals and log levels as names)."""
        out = dataclasses.asdict(self)
        out["rank_termination_signal"] = self.rank_termination_signal.name
        out["stack_dump_signal"] = (
            None if self.stack_dump_signal is None else self.stack_dump_signal.name
        )
        out["log_level"] = logging.getLevelName(self.log_level)
        out["rank_section_timeouts"] = dict(self.rank_section_timeouts)
        return out

    def to_yaml_file(self, cfg_path: str | os.PathLike[str]) -> None:
        """Write ``{fault_tolerance: {...}}`` atomically; ``from_yaml_file`` reads it back."""
        import yaml

        path = pathlib.Path(cfg_path)
        text = yaml.safe_dump({"fault_tolerance": self.to_dict()}, sort_keys=False)
        fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as stream:
                stream.write(text)
            os.replace(tmp, path)
        except BaseException:
            pathlib.Path(tmp).unlink(missing_ok=True)
            raise


def _find_ft_section(node: object) -> object:
    if isinstance(node, Mapping):
        if node.get("fault_tolerance"):
            return node["fault_tolerance"]
        children: list[object] = list(node.values())
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        found = _find_ft_section(child)
        if found is not None:
            return found
    return None


def _cli_type(name: str) -> Callable[[str], Any]:
    coerce = _COERCE[name]

    def convert(text: str) -> Any:
        try:
            value = coerce(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return CLI_NONE if value is None else text

    convert.__name__ = name  # argparse names the type in its error message
    return convert


def add_ft_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    cfg_path_default: str | None = None,
) -> None:
    """Add ``--ft-cfg-path`` and one ``--ft-<field>`` option per config field.

    Each option stores into ``ft_<field>`` with default ``None`` ("not given"), so a
    YAML value is only overridden by an option the user actually gave. Values are
    validated at parse time (a bad value is a usage error naming the field) and kept
    as the given text, or ``CLI_NONE`` for ``none``/``null``;
    :meth:`FaultToleranceConfig.from_args` turns them into the config. Both the
    ``--ft-a-b`` and ``--ft-a_b`` spellings are accepted.
    """
    parser.add_argument(
        "--ft-cfg-path",
        "--ft-cfg_path",
        dest="ft_cfg_path",
        default=cfg_path_default,
        help="YAML file with a fault_tolerance section; --ft-<field> options override it",
    )
    for name in FaultToleranceConfig.field_names():
        flags = [f"--ft-{name.replace('_', '-')}"]
        if "_" in name:
            flags.append(f"--ft-{name}")
        extra: dict[str, Any] = {}
        if _COERCE[name] is parse_bool:
            extra = {"nargs": "?", "const": "true"}
        nullable = " (none/null accepted)" if name in _NULLABLE else ""
        parser.add_argument(
            *flags,
            dest=f"ft_{name}",
            default=None,
            type=_cli_type(name),
            metavar=name.upper(),
            help=f"{_HELP[name]}{nullable}",
            **extra,
        )


#: The same function under the name the issue's first draft used.
add_config_arguments = add_ft_arguments
