"""Exit codes of ft_launcher: each outcome a scheduler must tell apart has its own code."""

from __future__ import annotations

import enum
import signal

__all__ = ["ExitCode", "exit_code_for_signal", "exit_codes_table"]


class ExitCode(enum.IntEnum):
    """Why the launcher exited.

    A scheduler (or an sbatch script) decides from this whether to requeue, drop the
    node, or stop: "the job finished", "the job keeps failing" and "this node was
    dropped" must never share a code.
    """

    #: Every rank on every node exited 0.
    SUCCESS = 0
    #: Ranks failed and the job-wide restart budget (--max-restarts) is spent.
    RESTARTS_EXHAUSTED = 1
    #: Bad command line or configuration (argparse convention).
    USAGE_ERROR = 2
    #: This node left the job: a rank asked to exclude it, torch found its ranks
    #: unhealthy, it failed a health check before a rendezvous, or its segment lost a
    #: node (--ft-segment).
    NODE_EXCLUDED = 3
    #: A rank asked to shut the whole workload down (ShutdownWorkload).
    WORKLOAD_SHUTDOWN = 4
    #: The launcher itself failed (rendezvous timed out or closed, store lost, ...).
    LAUNCHER_ERROR = 5
    #: Two consecutive cycles failed before their first step with the same exception
    #: at the same source line: restarting cannot help (--ft-stop-on-repeated-error=false
    #: turns the rule off).
    DETERMINISTIC_FAILURE = 6
    #: Ranks crashed again and again without making progress (the progress rule).
    NO_PROGRESS = 93


_DESCRIPTIONS = {
    ExitCode.SUCCESS: "every rank on every node exited 0",
    ExitCode.RESTARTS_EXHAUSTED: "ranks failed and the job-wide restart budget is spent",
    ExitCode.USAGE_ERROR: "bad command line option or configuration value",
    ExitCode.NODE_EXCLUDED: "this node left the job (a rank asked to exclude it, a "
    "health check failed, or its segment lost a node)",
    ExitCode.WORKLOAD_SHUTDOWN: "a rank asked to shut the workload down",
    ExitCode.LAUNCHER_ERROR: "the launcher failed (rendezvous timeout or closed, store lost)",
    ExitCode.DETERMINISTIC_FAILURE: "two cycles in a row failed before their first step "
    "with the same exception at the same line (a bug or missing file, not the node)",
    ExitCode.NO_PROGRESS: "ranks kept failing without progress (progress rule)",
}


def exit_code_for_signal(sig: signal.Signals) -> int:
    """128 + the signal number: the shell's convention for "ended by a signal"."""
    return 128 + int(sig)


def exit_codes_table() -> str:
    """The exit codes as text, for ``--help`` and the docs."""
    lines = [f"  {int(code):>3}  {_DESCRIPTIONS[code]}" for code in ExitCode]
    lines.append("  128+N  the launcher got signal N (e.g. 143 for SIGTERM) and stopped every rank")
    return "\n".join(lines)
