"""No futile restarts: recognise a failure that will recur identically (pure functions).

A cycle's failure is *deterministic-looking* when, before any rank of the cycle finished
its first training step, a rank exited with a Python exception that is not a
communication or infrastructure error. Its signature is the exception type and the
source line that raised it (file and line of the innermost frame). When two consecutive
cycles end with the same signature, restarting again cannot succeed: the launcher stops
with :attr:`~nvrx.launcher.exit_codes.ExitCode.DETERMINISTIC_FAILURE` and one line
naming the exception, the file and line, and the rank.

What never counts, so a faulty node is still restarted or replaced:

- a rank killed by a signal, or terminated by its monitor (a hang);
- communication and infrastructure errors: collective timeouts, connection resets or
  refusals, store and network errors, CUDA, NCCL and other accelerator errors
  (including out-of-memory), OS errors of the device;
- a failure after the cycle's first step (the job made progress there; the progress
  rule, --ft-max-no-progress-cycles, covers those);
- a rank without a traceback the launcher can read (no ``@record`` error file and no
  redirected stderr).

Nothing here reads a file or a clock; the agent passes what it gathered, and keeps the
last failed cycle's signature in a :class:`RepeatWatch`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

__all__ = [
    "FailureSignature",
    "RankOutcome",
    "RepeatWatch",
    "cycle_signature",
    "is_infrastructure_error",
    "parse_traceback",
    "repeats",
]

#: ``  File "path", line N, in func``: a traceback frame.
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')
#: ``pkg.Type: message`` or ``Type`` alone: the exception line ending a traceback.
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")

#: Exception types (last dotted component) that are communication or infrastructure.
_INFRA_TYPES = frozenset(
    {
        "DistError",
        "DistBackendError",
        "DistNetworkError",
        "DistStoreError",
        "DistQueueEmptyError",
        "ConnectionError",
        "ConnectionResetError",
        "ConnectionRefusedError",
        "ConnectionAbortedError",
        "BrokenPipeError",
        "TimeoutError",
        "timeout",
        "OutOfMemoryError",
        "AcceleratorError",
        "NcclError",
        "ChildFailedError",
        "SignalException",
        "RendezvousError",
        "RendezvousTimeoutError",
        "RendezvousClosedError",
        "KeyboardInterrupt",
        "SystemExit",
        "MemoryError",
    }
)
#: Words in a message that mark a communication or device error whatever its type.
_INFRA_WORDS = re.compile(
    r"nccl|gloo|cuda|cudnn|cublas|hip error|rocm|xla|device-side assert|ecc error"
    r"|out of memory|collective operation timeout|watchdog|timed out|timeout"
    r"|connection (?:reset|refused|closed|aborted)|broken pipe|socket|tcpstore|store"
    r"|rendezvous|process group|processgroup|barrier|all_reduce|allreduce|all_gather"
    r"|broadcast|reduce_scatter|peer|network|unreachable|nvml|infiniband|\bib\b|mpi",
    re.IGNORECASE,
)


@dataclasses.dataclass(frozen=True)
class FailureSignature:
    """An exception type raised at a source line, and the rank it was seen on."""

    exc_type: str
    file: str
    line: int
    rank: int
    message: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        """What two cycles must share: the type and the source line (not the rank)."""
        return (self.exc_type, self.file, self.line)

    def describe(self) -> str:
        """The one-line root cause."""
        text = f"{self.exc_type} at {self.file}:{self.line} on rank {self.rank}"
        if self.message:
            message = " ".join(self.message.split())
            text += f": {message[:200]}"
        return text


@dataclasses.dataclass(frozen=True)
class RankOutcome:
    """How one rank of a failed cycle ended, as the agent saw it."""

    rank: int
    #: The exit status (negative: killed by that signal).
    exitcode: int
    #: True when the rank's monitor terminated it (a hang or an unhealthy node).
    terminated_by_monitor: bool = False
    #: The rank's traceback text (error file or stderr tail), if any.
    traceback: str | None = None
    #: The exception line (``Type: message``) when known without a traceback.
    message: str | None = None


def parse_traceback(text: str) -> tuple[str, str, int, str] | None:
    """(exception type, file, line, message) of the last exception in a traceback text.

    The innermost frame of the last traceback block raised it; chained exceptions
    ("During handling of the above exception ...") are followed to the last one.
    None when the text holds no complete traceback.
    """
    lines = text.splitlines()
    start = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback ")), default=-1)
    if start < 0:
        return None
    frame: tuple[str, int] | None = None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        found = _FRAME.match(line)
        if found:
            frame = (found["file"], int(found["line"]))
            continue
        if line.startswith((" ", "\t")) or not line.strip():
            continue
        exc = _EXC_LINE.match(line.strip())
        if frame is None or exc is None:
            return None
        return exc["type"], frame[0], frame[1], (exc["message"] or "").strip()
    return None


def is_infrastructure_error(exc_type: str, message: str) -> bool:
    """True for a communication, store, device or resource error (never deterministic)."""
    if exc_type.rsplit(".", 1)[-1] in _INFRA_TYPES:
        return True
    return bool(_INFRA_WORDS.search(exc_type) or _INFRA_WORDS.search(message))


def cycle_signature(
    outcomes: Iterable[RankOutcome], *, first_step_seen: bool
) -> FailureSignature | None:
    """The signature of a cycle's failure when it may be deterministic, else None.

    None when the cycle got past its first step, when any rank was killed by a signal
    or by its monitor (a node or hang problem), or when no rank left a parsable,
    non-infrastructure exception. Otherwise the lowest rank's signature.
    """
    if first_step_seen:
        return None
    found: list[FailureSignature] = []
    for outcome in sorted(outcomes, key=lambda o: o.rank):
        if outcome.terminated_by_monitor or outcome.exitcode < 0:
            return None
        if outcome.exitcode == 0 or not outcome.traceback:
            continue
        parsed = parse_traceback(outcome.traceback)
        if parsed is None:
            continue
        exc_type, file, line, message = parsed
        if is_infrastructure_error(exc_type, message):
            continue
        found.append(FailureSignature(exc_type, file, line, outcome.rank, message))
    return found[0] if found else None


def repeats(previous: FailureSignature | None, current: FailureSignature | None) -> bool:
    """True when two consecutive cycles failed with the same deterministic signature."""
    return previous is not None and current is not None and previous.key == current.key


@dataclasses.dataclass
class RepeatWatch:
    """The last failed cycle's deterministic-looking signature, to tell a repeat."""

    last: FailureSignature | None = None

    def repeated_error(
        self, outcomes: Iterable[RankOutcome], *, first_step_seen: bool
    ) -> str | None:
        """The one-line root cause when this cycle repeats the last one's deterministic
        failure (before any rank's first step), else None; remembers this cycle's."""
        signature = cycle_signature(outcomes, first_step_seen=first_step_seen)
        repeated = repeats(self.last, signature)
        self.last = signature
        return signature.describe() if repeated and signature is not None else None

    def forget(self) -> None:
        """This cycle's failure is not deterministic-looking (e.g. a dead monitor)."""
        self.last = None
