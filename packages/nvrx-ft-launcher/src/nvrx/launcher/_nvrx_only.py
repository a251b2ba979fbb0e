"""NVRx 0.7 launcher options that ft_launcher accepts without acting on them, and why.

Launch scripts written for NVRx pass these; refusing them would break the first
command after switching. Each is accepted (its value still checked where NVRx has a
fixed set of choices), hidden from ``--help``, and when given logged once at WARNING
with the reason it has no effect here. Options that are FaultToleranceConfig fields
come from nvrx.ft instead; an entry here whose flags are taken already is skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os

__all__ = [
    "NVRX_ONLY_ENV",
    "NVRX_ONLY_OPTIONS",
    "NvrxOnlyOption",
    "add_nvrx_only_options",
    "warn_without_effect",
]

logger = logging.getLogger("nvrx.launcher")


@dataclasses.dataclass(frozen=True)
class NvrxOnlyOption:
    """One NVRx launcher option: its spellings, why it does nothing here, what it takes."""

    flags: tuple[str, ...]
    why: str
    choices: tuple[str, ...] | None = None
    #: Values that describe what ft_launcher does anyway: given, they need no warning.
    same_as_ours: frozenset[str] = frozenset()
    #: The nvrx option whose meaning this spelling has (then it is an alias, not ignored).
    alias_of: str | None = None
    #: ``"?"``: a boolean that may be given alone; None: takes one value.
    nargs: str | None = None

    @property
    def dest(self) -> str:
        """``--ft-a-b`` stores into ``ft_a_b``, so ``PET_FT_A_B`` sets it (torchrun's rule)."""
        return self.flags[0].lstrip("-").replace("-", "_")


def _spellings(name: str) -> tuple[str, ...]:
    """``--ft-a-b`` and NVRx's other spelling ``--ft_a_b``."""
    return (f"--{name}", f"--{name.replace('-', '_')}")


_LOGS = (
    "ft_launcher has no gRPC log funnel or consolidated log file; use "
    "--ft-per-cycle-applog-prefix (per-rank files per cycle) or torchrun's "
    "--log-dir/--redirects/--tee for rank logs and --ft-journal for launcher events"
)
_ATTRIBUTION = "ft_launcher has no client for NVRx's failure attribution service"
_ENDPOINT = (
    "ft_launcher has no gRPC client for a node health service (nvhcd); run the service's "
    "own check with --ft-node-health-check-cmd instead"
)
_STORAGE = (
    "ft_launcher does not query Lustre/NFS health; storage_healthcheck_path "
    "(--ft-storage-healthcheck-path) checks that given paths are reachable and writable"
)
_SEGMENTS = (
    "ft_launcher has no scheduler segment-health exchange (--ft-segment's segments "
    "leave the job when one of their nodes is lost)"
)

#: Every NVRx 0.7 launcher option without a counterpart here (FT config fields excluded).
NVRX_ONLY_OPTIONS: tuple[NvrxOnlyOption, ...] = (
    NvrxOnlyOption(
        ("--ft-restart-policy", "--ft-restart_policy", "--restart-policy", "--restart_policy"),
        "ft_launcher restarts every rank when any rank fails (any-failed), the only "
        "policy NVRx 0.7 still supports; min-healthy is not available",
        choices=("any-failed", "min-healthy"),
        same_as_ours=frozenset({"any-failed"}),
    ),
    NvrxOnlyOption(
        _spellings("ft-rdzv-impl"),
        "ft_launcher uses torch's rendezvous (--rdzv-backend) with job-wide decisions "
        "kept in its store; NVRx's barrier/legacy implementations are not used",
        choices=("barrier", "legacy"),
    ),
    NvrxOnlyOption(_spellings("ft-base-logfile"), _LOGS),
    NvrxOnlyOption(_spellings("ft-nvrx-logfile"), _LOGS),
    NvrxOnlyOption(_spellings("ft-enable-log-server"), _LOGS, nargs="?"),
    NvrxOnlyOption(_spellings("ft-log-server-port"), _LOGS),
    NvrxOnlyOption(_spellings("ft-log-aggregator-count"), _LOGS),
    NvrxOnlyOption(_spellings("ft-log-leaf-max-queue-chunks"), _LOGS),
    NvrxOnlyOption(_spellings("ft-log-server-log-prefix"), _LOGS),
    NvrxOnlyOption(_spellings("ft-log-server-graceful-shutdown-timeout"), _LOGS),
    NvrxOnlyOption(_spellings("ft-attribution-endpoint"), _ATTRIBUTION),
    NvrxOnlyOption(_spellings("ft-attribution-startup-timeout"), _ATTRIBUTION),
    NvrxOnlyOption(_spellings("ft-attribution-llm-api-key-file"), _ATTRIBUTION),
    NvrxOnlyOption(_spellings("ft-attribution-llm-base-url"), _ATTRIBUTION),
    NvrxOnlyOption(_spellings("ft-attribution-llm-model"), _ATTRIBUTION),
    NvrxOnlyOption(
        _spellings("ft-attribution-analysis-backend"), _ATTRIBUTION, choices=("mcp", "lib")
    ),
    NvrxOnlyOption(_spellings("ft-attribution-compute-timeout"), _ATTRIBUTION),
    NvrxOnlyOption(_spellings("ft-attribution-log-level"), _ATTRIBUTION),
    NvrxOnlyOption(_spellings("ft-attribution-export-url"), _ATTRIBUTION),
    NvrxOnlyOption(
        _spellings("ft-attribution-stop-action"),
        _ATTRIBUTION,
        choices=("log", "no-restart"),
        same_as_ours=frozenset({"log"}),
    ),
    # NVRx's underscore spellings of FT config options that act here: aliases only.
    NvrxOnlyOption(_spellings("ft-cycle-info-dir"), "an alias", alias_of="--ft-cycle-info-dir"),
    NvrxOnlyOption(_spellings("ft-numa-bind-strict"), "an alias", alias_of="--ft-numa-bind-strict"),
    NvrxOnlyOption(_spellings("ft-node-health-check-endpoint"), _ENDPOINT),
    NvrxOnlyOption(_spellings("ft-enable-dist-storage-healthcheck"), _STORAGE, nargs="?"),
    NvrxOnlyOption(
        _spellings("ft-storage-health-check-path"),
        _STORAGE,
        alias_of="--ft-storage-healthcheck-path",
    ),
    NvrxOnlyOption(_spellings("ft-segment-health-check-dir"), _SEGMENTS),
    # The FT config field's option takes effect (whole segments, _segments.py); this
    # entry only adds NVRx's other spelling, --ft_segment, as its alias.
    NvrxOnlyOption(_spellings("ft-segment"), "", alias_of="--ft-segment"),
)

#: NVRx environment variables that change nothing here, and why (logged once when set).
NVRX_ONLY_ENV: dict[str, str] = {
    "NVRX_DISABLE_RANK_MONITORS": "ft_launcher always runs a monitor per rank (it supervises "
    "them and they cost next to nothing); run torchrun for a job without monitoring",
    "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "ft_launcher does not limit launchers per node",
}


class _Given(argparse.Action):
    """Store the value and remember that this option was given, for the one warning."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        self.entry: NvrxOnlyOption = kwargs.pop("entry")  # type: ignore[assignment]
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, "true" if values is None else values)


def add_nvrx_only_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Add every entry of :data:`NVRX_ONLY_OPTIONS` whose flags are still free."""
    taken = parser._option_string_actions
    added: list[argparse.Action] = []
    for entry in NVRX_ONLY_OPTIONS:
        free = [flag for flag in entry.flags if flag not in taken]
        if not free:
            continue
        # A spelling of an option nvrx.ft (or nvrx) has: the others become its aliases.
        owners = [taken[flag] for flag in (entry.alias_of, *entry.flags) if flag in taken]
        target = owners[0] if owners else None
        if target is not None:
            parser.add_argument(
                *free,
                dest=target.dest,
                type=target.type or str,
                nargs=target.nargs,
                const=target.const,
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )
            continue
        extra: dict[str, object] = {} if entry.nargs is None else {"nargs": entry.nargs}
        added.append(
            parser.add_argument(
                *free,
                dest=entry.dest,
                action=_Given,
                entry=entry,
                default=None,
                choices=entry.choices,
                help=argparse.SUPPRESS,
                **extra,  # type: ignore[arg-type]
            )
        )
    return added


def warn_without_effect(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Log once per given NVRx-only option (and set NVRx-only variable) why it does nothing."""
    for action in parser._actions:
        if not isinstance(action, _Given):
            continue
        value = getattr(args, action.dest, None)
        if value is None or str(value) in action.entry.same_as_ours:
            continue
        logger.warning(
            "%s %s is accepted for NVRx compatibility but has no effect: %s",
            action.option_strings[0],
            value,
            action.entry.why,
        )
    for name, why in NVRX_ONLY_ENV.items():
        if os.environ.get(name):
            logger.warning("%s is set but has no effect: %s", name, why)
