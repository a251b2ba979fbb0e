"""The fault tolerance configuration, and how it is read from kwargs, YAML and the CLI.

Every fact about a field (how its value is read, its help text, whether ``none`` is a
value, whether it has a command-line option, and whether it has an effect here) lives
in that field's :class:`FieldSpec`, in the field's dataclass metadata. kwargs, YAML and
the ``--ft-<field>`` options all go through it, so they cannot drift apart, and adding
a field is one edit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import logging
import math
import os
import pathlib
import signal
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from nvrx.ft._files import write_file_atomically
from nvrx.ft.data import MAX_DURATION_S

__all__ = [
    "CLI_NONE",
    "MAX_DURATION_S",
    "FaultToleranceConfig",
    "FieldSpec",
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
#: Largest YAML file read; a config section is a few hundred bytes.
_MAX_YAML_BYTES = 16 * 1024 * 1024
#: Settings NeMo keeps in its own ``fault_tolerance`` section (read by NeMo, not by nvrx.ft).
_NEMO_KEYS = frozenset(
    {
        "calculate_timeouts",
        "max_rank_restarts",
        "max_subsequent_job_failures",
        "additional_ft_launcher_args",
        "simulated_fault",
        "rank_termination_timeout",
        "initial_rank_heartbeat_timeout_s",
        "token_counter",
        "enable_ft_package",
    }
)
_logger = logging.getLogger("nvrx.ft.config")


def _bad(field: str, value: object, why: str) -> ValueError:
    return ValueError(f"FaultToleranceConfig.{field}: invalid value {value!r}: {why}")


def _number(field: str, value: object) -> float:
    if isinstance(value, bool):
        raise _bad(field, value, "expected a number, got a bool")
    number: object = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise _bad(field, value, "expected a number") from None
    if not isinstance(number, (int, float)):
        raise _bad(field, value, "expected a number")
    try:
        result = float(number)
    except OverflowError:
        raise _bad(field, value, "too large") from None
    if not math.isfinite(result):
        raise _bad(field, value, "must be a finite number")
    return result


def _positive_float(field: str, value: object) -> float:
    """A duration in seconds: finite, greater than 0 and at most MAX_DURATION_S (30 days)."""
    result = _number(field, value)
    if result <= 0:
        raise _bad(field, value, "must be a finite number greater than 0")
    if result > MAX_DURATION_S:
        raise _bad(field, value, f"must be at most {MAX_DURATION_S:.0f} s (30 days)")
    return result


def _optional_timeout(field: str, value: object) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
        return None
    return _positive_float(field, value)


def _safety_factor(field: str, value: object) -> float:
    result = _number(field, value)
    if not 1.0 <= result <= 1000.0:
        raise _bad(field, value, "must be between 1.0 and 1000")
    return result


def _non_negative_float(field: str, value: object) -> float:
    result = _number(field, value)
    if result < 0 or result > 1e12:
        raise _bad(field, value, "must be between 0 and 1e12")
    return result


def _int_in(low: int, high: int) -> Callable[[str, object], int]:
    def coerce(field: str, value: object) -> int:
        number: object = value
        if isinstance(value, str):
            try:
                number = int(value.strip())
            except ValueError:
                raise _bad(field, value, "expected an integer") from None
        if isinstance(number, bool) or not isinstance(number, int):
            raise _bad(field, value, "expected an integer")
        if not low <= number <= high:
            raise _bad(field, value, f"must be between {low} and {high}")
        return number

    return coerce


def _optional_positive_int(field: str, value: object) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
        return None
    return _int_in(1, 1_000_000)(field, value)


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


def _optional_bool(field: str, value: object) -> bool | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
        return None
    return parse_bool(field, value)


def parse_signal(field: str, value: object) -> signal.Signals:
    """Read a signal from a Signals, an int, or a name: ``SIGKILL``, ``KILL``, ``9``, ``"9"``."""
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
        if name.isdigit() and len(name) < 4:
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
        if word.isdigit() and len(word) < 4:
            return parse_log_level(field, int(word))
        if word in _LOG_LEVELS:
            return _LOG_LEVELS[word]
        raise _bad(field, value, f"expected one of {', '.join(_LOG_LEVELS)}")
    raise _bad(field, value, "expected a log level")


#: Most sections a config may name (each is a slot in the rank's shared memory block).
MAX_SECTIONS = 256


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
    if len(value) > MAX_SECTIONS:
        raise _bad(field, f"<{len(value)} sections>", f"at most {MAX_SECTIONS} sections")
    result: dict[str, float | None] = {}
    for name, seconds in value.items():
        if not isinstance(name, str) or not name.strip() or name != name.strip() or len(name) > 256:
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
    if len(value) > 4096 or "\0" in value:
        raise _bad(field, value, "must be at most 4096 characters, without NUL")
    return value or None


def _nic_template(placeholders: tuple[str, ...]) -> Callable[[str, object], str | None]:
    """A NIC path template: ``{nic}``, or NVRx's documented ``{dev_name}`` (same meaning)."""

    def coerce(field: str, value: object) -> str | None:
        result = _optional_str(field, value)
        if result is None:
            return None
        result = result.replace("{dev_name}", "{nic}")
        if "{nic}" not in result:
            raise _bad(field, value, f"must contain the placeholder {' or '.join(placeholders)}")
        try:
            result.format(nic="x")
        except (KeyError, IndexError, ValueError):
            raise _bad(field, value, "has a placeholder other than {nic}") from None
        return result

    return coerce


def _stop_action(field: str, value: object) -> str | None:
    result = _optional_str(field, value)
    if result is not None and result not in ("log", "no-restart"):
        raise _bad(field, value, "expected log or no-restart")
    return result


_Coerce = Callable[[str, object], Any]


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """What one FaultToleranceConfig field needs everywhere it is read.

    ``coerce(field, value)`` turns a kwarg, YAML or CLI value into the field's type (or
    raises ValueError naming field and value); ``help`` is the ``--ft-<field>`` help
    text; ``nullable`` says ``none``/``null`` is a value; ``cli`` says the field has
    ``--ft-<field>`` options; ``without_effect`` is None when the field acts here, else
    why it does not (a value other than the default is then logged once at WARNING).
    """

    coerce: _Coerce
    help: str
    nullable: bool = False
    cli: bool = True
    without_effect: str | None = None

    @property
    def is_flag(self) -> bool:
        """A boolean option: ``--ft-x`` alone means true."""
        return self.coerce is parse_bool

    def option_strings(self, name: str) -> list[str]:
        """``--ft-a-b`` and, for a name with underscores, ``--ft-a_b``."""
        flags = [f"--ft-{name.replace('_', '-')}"]
        if "_" in name:
            flags.append(f"--ft-{name}")
        return flags


def _field(
    default: Any,
    coerce: _Coerce,
    help: str,
    *,
    nullable: bool = False,
    cli: bool = True,
    without_effect: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    spec = FieldSpec(coerce, help, nullable=nullable, cli=cli, without_effect=without_effect)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"nvrx": spec})
    return dataclasses.field(default=default, metadata={"nvrx": spec})


_NO_STORAGE_HEALTH = (
    "ft_launcher does not query Lustre/NFS health; storage_healthcheck_path checks that "
    "paths are writable before each rendezvous"
)
_NO_SEGMENTS = "ft_launcher has no segment-aware rank assignment, so no segment health files"
_LAUNCHER_PROGRESS = (
    "ft_launcher's progress rule is set with its own options "
    "(--ft-max-no-progress-cycles, --ft-min-progress-iterations, --ft-progress-file)"
)

#: Fields whose values other than the default were already logged as without effect.
_warned_without_effect: set[str] = set()
#: Sets of unknown names already reported (each set once per process).
_warned_unknown: set[tuple[str, ...]] = set()
#: Config files already reported as having no fault_tolerance section.
_warned_no_section: set[str] = set()
_quiet_depth = 0


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Build configs without the without-effect warnings (a config received from a peer)."""
    global _quiet_depth
    _quiet_depth += 1
    try:
        yield
    finally:
        _quiet_depth -= 1


@dataclasses.dataclass
class FaultToleranceConfig:
    """Everything a rank monitor needs to decide that a rank is hung or unhealthy.

    Timeouts are in seconds (at most :data:`MAX_DURATION_S`, 30 days); ``None``
    disables that check. The heartbeat timeouts only apply to a rank that sends
    heartbeats or has not opened a section yet, so a sections-only workload is never
    killed for missing heartbeats; the out-of-section timeout is off by default, so a
    heartbeats-only workload is never killed for having no section open.

    A hung rank gets SIGCONT, ``stack_dump_signal`` (its faulthandler dumps every
    thread's stack into its log), ``rank_termination_signal`` and, after
    ``rank_termination_grace_period``, SIGKILL. The default signal is SIGTERM rather than
    NVRx's SIGKILL so the rank can flush logs; the grace-period SIGKILL still ends it,
    and the launcher counts a rank its monitor terminated as failed even when a
    framework (Lightning) turns SIGTERM into exit status 0. Set SIGKILL to skip that step.

    Every NVRx 0.4.1 and 0.7 field is accepted. Those that have no effect here say why
    in their :class:`FieldSpec` (``FaultToleranceConfig.field_spec(name)``), and a value
    other than the default is logged once at WARNING.
    """

    workload_check_interval: float = _field(
        0.1,
        _positive_float,
        "longest pause in seconds between two checks of the rank "
        "(timeouts are also checked exactly when they fall due)",
    )
    initial_rank_heartbeat_timeout: float | None = _field(
        3600.0, _optional_timeout, "seconds from init to the first heartbeat", nullable=True
    )
    rank_heartbeat_timeout: float | None = _field(
        2700.0, _optional_timeout, "seconds between heartbeats", nullable=True
    )
    rank_section_timeouts: dict[str, float | None] = _field(  # noqa: RUF009 - a field specifier
        None,
        parse_section_timeouts,
        "per-section timeouts, 'name:seconds,name2:none'; the 'warmup' entry is the "
        "'step' timeout during the first num_warmup_iterations steps",
        factory=dict,
    )
    rank_out_of_section_timeout: float | None = _field(
        None, _optional_timeout, "seconds with no section open", nullable=True
    )
    node_health_check_interval: float = _field(
        5.0, _positive_float, "seconds between GPU/NIC health checks"
    )
    safety_factor: float = _field(
        5.0, _safety_factor, "calculated timeout = safety factor x longest observed interval"
    )
    min_calculated_timeout: float | None = _field(
        None,
        _optional_timeout,
        "no calculated or learned timeout is shorter than this (logged when it raises "
        "one); none: 20 x workload_check_interval, at least 2 s. Never above the "
        "configured timeout",
        nullable=True,
    )
    learn_timeouts: bool | None = _field(
        None,
        _optional_bool,
        "tighten the heartbeat and section timeouts during the job to safety_factor x "
        "the longest interval seen (never above the configured ones); none: when "
        "timeouts are calculated (calculate_timeouts=True, calculate_and_set_*), "
        "false: NVRx's behaviour",
        nullable=True,
    )
    learn_min_steps: int = _field(
        16,
        _int_in(1, 1_000_000_000),
        "steps (heartbeats or 'step' sections) after the warmup iterations before "
        "learned timeouts become active",
    )
    rank_termination_signal: signal.Signals = _field(  # noqa: RUF009 - a field specifier
        signal.SIGTERM,
        parse_signal,
        "signal sent to a hung or unhealthy rank: a name or number (SIGTERM, KILL, 9)",
    )
    rank_termination_grace_period: float = _field(
        5.0, _positive_float, "seconds between that signal and SIGKILL"
    )
    stack_dump_signal: signal.Signals | None = _field(  # noqa: RUF009 - a field specifier
        signal.SIGUSR2,
        _optional_signal,
        "signal that asks the rank for a stack dump first",
        nullable=True,
    )
    log_level: int = _field(logging.INFO, parse_log_level, "monitor log level, e.g. INFO or DEBUG")
    enable_gpu_monitor: bool = _field(
        True, parse_bool, "check GPU health through NVML (skipped without a GPU)"
    )
    enable_nic_monitor: bool = _field(False, parse_bool, "check the InfiniBand link_downed counter")
    pci_topo_file: str | None = _field(
        None, _optional_str, "NCCL-style topology XML mapping GPUs to NICs", nullable=True
    )
    link_down_path_template: str | None = _field(
        None,
        _nic_template(("{nic}", "{dev_name}")),
        "path of a NIC's link_downed counter, with {nic} (or NVRx's {dev_name})",
        nullable=True,
    )
    num_warmup_iterations: int = _field(
        0,
        _int_in(0, 1_000_000_000),
        "the first N 'step' sections are checked against the 'warmup' section timeout "
        "(or not at all) and the out-of-section timeout is not checked before step N ends",
    )
    install_exception_hook: bool = _field(
        False,
        parse_bool,
        "the rank logs an uncaught exception's traceback and exits at once (os._exit(1))",
    )
    skip_section_response: bool = _field(
        True,
        parse_bool,
        "NVRx: do not wait for the monitor's reply to a section or heartbeat message",
        without_effect="heartbeats and sections are shared-memory stores here and never "
        "wait for the monitor, whatever this says",
    )
    restart_check_interval: float = _field(
        60.0,
        _positive_float,
        "NVRx: period of the 'restart in progress' log of its layered restart protocol",
        without_effect="the monitor learns of a restart when the rank's connection closes; "
        "nothing polls",
    )
    enable_nic_healthcheck: bool = _field(
        True,
        parse_bool,
        "ft_launcher: before each rendezvous, a NIC port that went from ACTIVE to not ACTIVE "
        "(link_state_path_template) or whose link_downed counter grew since the previous "
        "check makes the node leave the job (exit 3); a port not ACTIVE at the first check "
        "is logged once",
    )
    link_state_path_template: str | None = _field(
        None,
        _nic_template(("{nic}",)),
        "path of a NIC port's state file for enable_nic_healthcheck, with {nic} "
        "(default /sys/class/infiniband/{nic}/ports/1/state)",
        nullable=True,
    )
    enable_dist_storage_healthcheck: bool = _field(
        False,
        parse_bool,
        "NVRx: check Lustre/NFS health before the rendezvous",
        without_effect=_NO_STORAGE_HEALTH,
    )
    storage_healthcheck_path: str | None = _field(
        None,
        _optional_str,
        "ft_launcher: comma-separated paths that must exist and be writable within a "
        "timeout before each rendezvous, else the node leaves the job",
        nullable=True,
    )
    segment: int | None = _field(
        None,
        _optional_positive_int,
        "nodes per segment (NVLink domain): the job runs on whole segments only; a lost "
        "node takes its segment out and a standby segment takes its place (ft_launcher; "
        "implies --ft-standby-nodes)",
        nullable=True,
    )
    numa_bind_strict: bool = _field(
        True,
        parse_bool,
        "with NVRX_GPUS_PER_NUMA: bind memory as well as CPUs to the GPU's NUMA node "
        "(numactl --membind; false: --localalloc)",
    )
    gpu_memory_reclaim_timeout: float = _field(
        50.0,
        _positive_float,
        "seconds ft_launcher waits for the GPUs' memory to be freed before restarting "
        "workers (NVML; skipped without it)",
    )
    gpu_memory_tolerance_mb: float = _field(
        512.0,
        _non_negative_float,
        "GPU memory (MB) above the baseline still counted as freed",
    )
    gpu_memory_poll_interval: float = _field(
        2.0,
        _positive_float,
        "seconds between GPU memory polls",
    )
    check_remaining_processes: bool = _field(
        False,
        parse_bool,
        "name the processes still holding GPU memory when the GPU memory wait ends",
    )
    max_no_progress_cycles: int = _field(
        3,
        _int_in(-1, 1_000_000),
        "NVRx: cycles without progress before the job stops",
        cli=False,
        without_effect=_LAUNCHER_PROGRESS,
    )
    min_progress_iterations: int = _field(
        1,
        _int_in(0, 1_000_000_000),
        "NVRx: iterations a cycle must advance to count as progress",
        cli=False,
        without_effect=_LAUNCHER_PROGRESS,
    )
    checkpoint_iteration_file: str | None = _field(
        None,
        _optional_str,
        "NVRx: file holding the latest checkpoint iteration",
        nullable=True,
        cli=False,
        without_effect=_LAUNCHER_PROGRESS,
    )
    attribution_endpoint: str | None = _field(
        None,
        _optional_str,
        "NVRx: endpoint of its failure attribution service",
        nullable=True,
        without_effect="nvrx has no attribution service client",
    )
    attribution_stop_action: str | None = _field(
        None,
        _stop_action,
        "NVRx: log or no-restart on an attribution STOP verdict",
        nullable=True,
        without_effect="nvrx has no attribution service client",
    )
    attribution_export_url: str | None = _field(
        None,
        _optional_str,
        "NVRx: URL attribution results are posted to",
        nullable=True,
        without_effect="nvrx has no attribution service client",
    )
    cycle_info_dir: str | None = _field(
        None,
        _optional_str,
        "directory of the per-cycle info files (nvrx.ft.CycleInfo), written by group "
        "rank 0 at each cycle's start and end; ranks get NVRX_CURRENT_CYCLE_INFO",
        nullable=True,
    )
    segment_health_check_dir: str | None = _field(
        None,
        _optional_str,
        "NVRx: shared directory of per-task segment health decisions",
        nullable=True,
        without_effect=_NO_SEGMENTS,
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            spec: FieldSpec = f.metadata["nvrx"]
            value = spec.coerce(f.name, getattr(self, f.name))
            setattr(self, f.name, value)
            if spec.without_effect is not None and value != _default(f):
                _warn_without_effect(f.name, value, spec.without_effect)

    @staticmethod
    def field_names() -> tuple[str, ...]:
        """The configuration fields, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(FaultToleranceConfig))

    @staticmethod
    def field_spec(name: str) -> FieldSpec:
        """The :class:`FieldSpec` of one field (KeyError for an unknown name)."""
        for f in dataclasses.fields(FaultToleranceConfig):
            if f.name == name:
                spec: FieldSpec = f.metadata["nvrx"]
                return spec
        raise KeyError(name)

    @staticmethod
    def cli_field_names() -> tuple[str, ...]:
        """The fields that have ``--ft-<field>`` options (what :func:`add_ft_arguments` adds)."""
        return tuple(
            f.name for f in dataclasses.fields(FaultToleranceConfig) if f.metadata["nvrx"].cli
        )

    @classmethod
    def from_kwargs(cls, ignore_not_recognized: bool = True, **kwargs: Any) -> FaultToleranceConfig:
        """Build from keyword arguments.

        Unknown names are dropped with ``ignore_not_recognized=True`` (NVRx's default),
        all named in one warning with a "did you mean" for those that look like a
        misspelt field; with ``False`` the first unknown name is a ValueError, with its
        suggestion. A bad value is always a ValueError naming field and value.
        """
        known = cls.field_names()
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            described = [_describe_unknown(name, known) for name in unknown]
            if not ignore_not_recognized:
                raise ValueError(
                    f"Not recognized FaultToleranceConfig fields: {'; '.join(described)}"
                )
            if tuple(unknown) not in _warned_unknown:  # the launcher reads its file twice
                _warned_unknown.add(tuple(unknown))
                _logger.warning(
                    "ignoring settings that are not FaultToleranceConfig fields: %s",
                    "; ".join(described),
                )
        cfg = cls(**{k: v for k, v in kwargs.items() if k in known})
        _warn_given(cfg, kwargs)
        return cfg

    @classmethod
    def _from_peer(cls, values: Mapping[str, Any]) -> FaultToleranceConfig:
        """A config sent by a peer (monitor to rank): strict, and without repeat warnings."""
        with _quiet():
            return cls.from_kwargs(ignore_not_recognized=False, **dict(values))

    @classmethod
    def from_yaml_file(
        cls, cfg_path: str | os.PathLike[str], ignore_not_recognized: bool = True
    ) -> FaultToleranceConfig:
        """Build from the first ``fault_tolerance`` mapping found at any depth of a YAML file.

        A missing file is FileNotFoundError; anything wrong inside it (YAML syntax, an
        alias, no section, a bad value, an unknown field when not ignored) is a
        ValueError that starts with the file's path. An empty file or one without the
        section is a ValueError as in NVRx; :meth:`from_args` then uses the defaults.
        """
        path = pathlib.Path(cfg_path)
        section = _read_ft_section(path)
        misspelt = _misspelt_fields(section, cls.field_names())
        if misspelt:
            raise ValueError(
                f"{path}: misspelt fault_tolerance settings: "
                + "; ".join(
                    f"{bad!r} is not a setting; did you mean {good!r}?" for bad, good in misspelt
                )
            )
        try:
            return cls.from_kwargs(ignore_not_recognized=ignore_not_recognized, **dict(section))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FaultToleranceConfig:
        """Build from ``--ft-cfg-path`` (if given) overridden by every given ``ft_<field>``.

        A file that is empty or has no ``fault_tolerance`` section gives the defaults
        (logged), as in NVRx, so an empty file plus ``--ft-*`` options is a valid
        config. A missing file, bad YAML or a bad value is an error.
        """
        values: dict[str, Any] = {}
        cfg_path = getattr(args, "ft_cfg_path", None)
        if cfg_path:
            try:
                values = dataclasses.asdict(cls.from_yaml_file(cfg_path))
            except NoFtSectionError as exc:
                if os.fspath(cfg_path) not in _warned_no_section:  # the launcher parses twice
                    _warned_no_section.add(os.fspath(cfg_path))
                    _logger.warning("%s; using the defaults and the --ft-* options", exc)
        given: dict[str, Any] = {}
        for name in cls.cli_field_names():
            value = getattr(args, f"ft_{name}", None)
            if value is not None:
                given[name] = value
        cfg = cls(**{**values, **given})
        _warn_given(cfg, given)
        return cfg

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
        """Write ``{fault_tolerance: {...}}`` atomically; ``from_yaml_file`` reads it back.

        Fields without effect here are written only when they differ from their default,
        so reading the file back logs nothing about them.
        """
        import yaml

        path = pathlib.Path(cfg_path)
        values = self.to_dict()
        for f in dataclasses.fields(self):  # NVRx-only fields at their default: left out
            if f.metadata["nvrx"].without_effect is not None and values[f.name] == _default(f):
                del values[f.name]
        text = yaml.safe_dump({"fault_tolerance": values}, sort_keys=False)
        write_file_atomically(path, text)


class NoFtSectionError(ValueError):
    """A YAML file that is empty or has no ``fault_tolerance`` mapping."""


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _warn_without_effect(name: str, value: object, why: str) -> None:
    if _quiet_depth or name in _warned_without_effect:
        return
    _warned_without_effect.add(name)
    _logger.warning("FaultToleranceConfig.%s=%r is accepted without effect: %s", name, value, why)


def _warn_given(cfg: FaultToleranceConfig, given: Mapping[str, object]) -> None:
    """A field without effect that was given explicitly warns even at its default value."""
    for f in dataclasses.fields(cfg):
        spec: FieldSpec = f.metadata["nvrx"]
        if spec.without_effect is not None and f.name in given:
            _warn_without_effect(f.name, getattr(cfg, f.name), spec.without_effect)


#: The most single-character edits (insert, delete, replace, swap two neighbours) that
#: make a YAML key a misspelling of a field rather than a setting of someone else's.
_MAX_TYPO_EDITS = 2


def _edit_distance(a: str, b: str, limit: int) -> int:
    """Edits from ``a`` to ``b`` (a transposition counts one), or ``limit + 1`` if more."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before: list[int] | None = None
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cost = 0 if ca == cb else 1
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + cost)
            if before is not None and i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], before[j - 2] + 1)
        before, row = row, current
        if min(row) > limit:
            return limit + 1
    return min(row[-1], limit + 1)


def _misspelt_fields(section: Mapping[str, Any], known: tuple[str, ...]) -> list[tuple[str, str]]:
    """(key, field) for each key that is not a field, not one of NeMo's settings, and
    within :data:`_MAX_TYPO_EDITS` edits of a field: a typo, never someone else's key."""
    found = []
    for key in sorted(set(section) - set(known) - _NEMO_KEYS):
        distances = [(_edit_distance(key, name, _MAX_TYPO_EDITS), name) for name in known]
        distance, name = min(distances)
        if distance <= _MAX_TYPO_EDITS:
            found.append((key, name))
    return found


def _describe_unknown(name: str, known: tuple[str, ...]) -> str:
    if name in _NEMO_KEYS:
        return f"{name!r} (a NeMo setting)"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    if close:
        return f"{name!r} (did you mean {close[0]!r}?)"
    return repr(name)


def _read_ft_section(path: pathlib.Path) -> Mapping[str, Any]:
    import yaml  # only here: a monitor process never needs it

    class _NoAliasLoader(yaml.SafeLoader):
        """Refuses aliases: a self-referencing one recurses, an alias bomb never ends."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None, None, "YAML aliases (*name) are not allowed", event.start_mark
                )
            return super().compose_node(parent, index)

    with path.open("rb") as stream:
        raw = stream.read(_MAX_YAML_BYTES + 1)
    if len(raw) > _MAX_YAML_BYTES:
        raise ValueError(f"{path}: larger than {_MAX_YAML_BYTES} bytes")
    try:
        document = yaml.load(raw.decode("utf-8"), Loader=_NoAliasLoader)  # noqa: S506
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a valid YAML file: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply") from None
    section = _find_ft_section(document)
    if section is None:
        raise NoFtSectionError(f"{path}: no 'fault_tolerance' section found")
    if not isinstance(section, Mapping):
        raise ValueError(f"{path}: the 'fault_tolerance' section is not a mapping")
    if not all(isinstance(key, str) for key in section):
        raise ValueError(f"{path}: the 'fault_tolerance' section has non-string keys")
    return section


def _find_ft_section(node: object, depth: int = 0) -> object:
    if depth > 64:
        return None
    if isinstance(node, Mapping):
        if node.get("fault_tolerance"):
            return node["fault_tolerance"]
        children: list[object] = list(node.values())
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        found = _find_ft_section(child, depth + 1)
        if found is not None:
            return found
    return None


def _cli_type(name: str, spec: FieldSpec) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            with _quiet():  # the config built from the options warns, not each option
                value = spec.coerce(name, text)
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
    """Add ``--ft-cfg-path`` and ``--ft-<field>`` options for every field that has them.

    Each option stores into ``ft_<field>`` with default ``None`` ("not given"), so a
    YAML value is only overridden by an option the user actually gave. Values are
    validated at parse time (a bad value is a usage error naming the field) and kept
    as the given text, or ``CLI_NONE`` for ``none``/``null``;
    :meth:`FaultToleranceConfig.from_args` turns them into the config. Both the
    ``--ft-a-b`` and ``--ft-a_b`` spellings are accepted. Options come from each
    field's :class:`FieldSpec`, so a new field gets its options without another edit.
    """
    parser.add_argument(
        "--ft-cfg-path",
        "--ft-cfg_path",
        dest="ft_cfg_path",
        default=cfg_path_default,
        help="YAML file with a fault_tolerance section; --ft-<field> options override it",
    )
    for name in FaultToleranceConfig.cli_field_names():
        spec = FaultToleranceConfig.field_spec(name)
        extra: dict[str, Any] = {}
        if spec.is_flag:
            extra = {"nargs": "?", "const": "true"}
        notes = " (none/null accepted)" if spec.nullable else ""
        # NVRx fields that do nothing here are accepted (commands written for NVRx keep
        # working, with one warning) but kept out of --help: nobody should reach for them.
        # The migration guide's field table lists each with its reason.
        hidden = spec.without_effect is not None
        parser.add_argument(
            *spec.option_strings(name),
            dest=f"ft_{name}",
            default=None,
            type=_cli_type(name, spec),
            metavar=name.upper(),
            help=argparse.SUPPRESS if hidden else f"{spec.help}{notes}",
            **extra,
        )


def add_config_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    cfg_path_default: str | None = None,
) -> None:
    """Deprecated name of :func:`add_ft_arguments`."""
    warnings.warn(
        "nvrx.ft.add_config_arguments is deprecated; use nvrx.ft.add_ft_arguments",
        DeprecationWarning,
        stacklevel=2,
    )
    add_ft_arguments(parser, cfg_path_default=cfg_path_default)
