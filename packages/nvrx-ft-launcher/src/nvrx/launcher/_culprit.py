"""Name the rank that hung, not the ranks that wait for it: a pure function over evidence.

When one rank hangs, its peers block in the next collective within milliseconds, stop
heartbeating and are terminated by their monitors too. Each monitor's
``rank_terminated`` event carries the rank's last activity time and, when the monitor
could read the rank's stack dump, where its training thread was
(:class:`nvrx.ft.StackSummary`) and its scheduler state just before the monitor signalled
it. These rules read that evidence:

- stopped: exactly one rank was stopped by a signal (state ``T``, e.g. SIGSTOP): it was
  frozen, not waiting on anyone, so it is the culprit whatever the other rules say and
  even when some ranks left no evidence (its peers went stale at about the same time,
  and some exit when their collective fails); it needs evidence from a second rank
  unless the world is that one rank;
- stack: every rank has a stack, exactly one is outside a collective and the others
  are blocked inside one;
- collective: every rank's flight recorder was read (torch.distributed's trace of its
  collectives, see :mod:`nvrx.ft._flight`); the waiting ranks are all unfinished in the
  same collective (operation, process group, sequence number) and exactly one rank is
  not: it has not reached it (its latest collective is finished) or it waits in another
  one (a desync);
- desync: every rank's stack is inside a collective, and all but one are in the same
  operation, at least two of them (the flight recorder is not read);
- blocked: exactly one rank is in uninterruptible sleep (state ``D``: a read from a dead
  NFS server, a driver call) and has no stack (its stack dump cannot run until the
  kernel call ends), every other rank's stack is inside the same collective operation,
  and its own flight recorder (when read) does not show it waiting in a collective;
- timing: one rank's last activity (heartbeat, section open or close; wall clock, so
  ranks of other nodes compare) is earlier than every other rank's by ``min_margin_s``.

Otherwise a rule names a rank only when the other rule does not contradict it (the two name
different ranks, the stack rule's rank went stale last by the margin, or the timing
rule's rank is in a collective while another is not). Everything else is "undecided":
never a guess.

Whatever decides, the finding names the collective the others wait in (from the flight
recorder: operation, process group and sequence number; else the operation from their
stacks) and where the culprit was instead.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Iterable, Sequence
from typing import Any

from nvrx.ft import StackSummary
from nvrx.ft._events import RankTerminated
from nvrx.ft._flight import CollectiveState

__all__ = ["DEFAULT_MIN_MARGIN_S", "Basis", "CulpritFinding", "RankEvidence", "find_culprit"]

#: How much earlier the culprit's last activity must be than every other rank's.
DEFAULT_MIN_MARGIN_S = 2.0
_HANG_CAUSES = frozenset(
    {"initial_heartbeat_timeout", "heartbeat_timeout", "section_timeout", "out_of_section_timeout"}
)


class Basis(enum.Enum):
    """Which rule named the culprit."""

    STACK = "stack"
    TIMING = "timing"
    STOPPED = "stopped"
    COLLECTIVE = "collective"
    BLOCKED = "blocked"


@dataclasses.dataclass(frozen=True)
class RankEvidence:
    """What one rank's monitor knew when it terminated the rank for a hang."""

    rank: int
    cause: str
    last_activity_wall: float | None = None
    last_heartbeat_s: float | None = None
    last_activity_s: float | None = None
    stack: StackSummary | None = None
    #: The rank's /proc state letter before its monitor signalled it (None: not read).
    proc_state: str | None = None
    #: Its latest collective in torch's flight recorder (None: not read).
    collective: CollectiveState | None = None

    @classmethod
    def from_event(cls, event: RankTerminated) -> RankEvidence | None:
        """The evidence in a monitor's ``rank_terminated`` event of a hang; None when it
        terminated the rank for another cause (a failed health check)."""
        if event.cause not in _HANG_CAUSES:
            return None
        return cls(
            rank=event.rank,
            cause=event.cause,
            last_activity_wall=event.last_activity_wall,
            last_heartbeat_s=event.last_heartbeat_s,
            last_activity_s=event.last_activity_s,
            stack=event.stack,
            proc_state=event.proc_state,
            collective=event.collective,
        )

    def describe(self) -> str:
        """'last heartbeat 8.0 s ago, stack in train.py:53' (what is known of it)."""
        parts = []
        if self.proc_state == "T":
            parts.append("stopped by a signal (state T)")
        elif self.proc_state == "D":
            parts.append("blocked in the kernel (state D)")
        if self.last_heartbeat_s is not None:
            parts.append(f"last heartbeat {self.last_heartbeat_s:.1f} s ago")
        elif self.last_activity_s is not None:
            parts.append(f"no heartbeat, last activity {self.last_activity_s:.1f} s ago")
        parts.append("no stack" if self.stack is None else self.stack.describe())
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class CulpritFinding:
    """The likely culprit and its victims, or why the evidence does not decide."""

    culprit: int | None
    victims: tuple[int, ...]
    basis: tuple[Basis, ...]
    reason: str
    sentence: str
    #: The collective the other ranks wait in: ``op`` and, from the flight recorder,
    #: ``group`` and ``seq`` (None: unknown); None when no rank is known to wait in one.
    collective: dict[str, Any] | None = None
    #: Where the culprit was instead: its collective when it waits in another one, its
    #: innermost user frame ('train.py:40 in main') or its state; None: not known.
    culprit_frame: str | None = None

    @property
    def decided(self) -> bool:
        """True when a culprit is named."""
        return self.culprit is not None

    def to_json(self) -> dict[str, Any]:
        """The journal form."""
        return {
            "culprit": self.culprit,
            "victims": list(self.victims),
            "basis": [b.value for b in self.basis],
            "reason": self.reason,
            "sentence": self.sentence,
            "collective": self.collective,
            "culprit_frame": self.culprit_frame,
        }


def _ranks(ranks: Iterable[int]) -> str:
    items = sorted(ranks)
    return ("rank " if len(items) == 1 else "ranks ") + ", ".join(map(str, items))


def _grouped(evidence: Iterable[RankEvidence]) -> str:
    """'ranks 0, 2: blocked in all_reduce; rank 3: no stack' (same phrase, one group)."""
    groups: dict[str, list[int]] = {}
    for ev in evidence:
        phrase = ev.stack.describe() if ev.stack is not None else ev.describe()
        groups.setdefault(phrase, []).append(ev.rank)
    return "; ".join(f"{_ranks(r)}: {p}" for p, r in sorted(groups.items(), key=lambda g: g[1]))


def _by_stack(evidence: Sequence[RankEvidence]) -> int | None:
    if any(ev.stack is None for ev in evidence):
        return None
    outside = [ev.rank for ev in evidence if ev.stack is not None and not ev.stack.in_collective]
    return outside[0] if len(outside) == 1 and len(evidence) > 1 else None


def _by_timing(evidence: Sequence[RankEvidence], margin: float) -> int | None:
    times = [(ev.last_activity_wall, ev.rank) for ev in evidence]
    known = sorted((t, r) for t, r in times if t is not None)
    if len(known) != len(evidence) or len(known) < 2:
        return None
    (first, rank), (second, _) = known[0], known[1]
    return rank if second - first >= margin else None


def _stale_last_by_margin(evidence: Sequence[RankEvidence], rank: int, margin: float) -> bool:
    mine = next(ev.last_activity_wall for ev in evidence if ev.rank == rank)
    others = [ev.last_activity_wall for ev in evidence if ev.rank != rank]
    if mine is None or any(t is None for t in others):
        return False
    return any(mine - t >= margin for t in others if t is not None)


def _in_collective_while_another_is_not(evidence: Sequence[RankEvidence], rank: int) -> bool:
    stacks = {ev.rank: ev.stack for ev in evidence}
    mine = stacks[rank]
    return bool(
        mine is not None
        and mine.in_collective
        and any(s is not None and not s.in_collective for r, s in stacks.items() if r != rank)
    )


def _waited(evidence: Sequence[RankEvidence]) -> CollectiveState | None:
    """The unfinished collective most ranks' flight recorders are in (ties: none)."""
    counts = collections.Counter(
        ev.collective for ev in evidence if ev.collective is not None and ev.collective.pending
    )
    top = counts.most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def _by_collective(evidence: Sequence[RankEvidence]) -> int | None:
    """The one rank not in the collective the others wait in, by their flight recorders."""
    if len(evidence) < 2 or any(ev.collective is None for ev in evidence):
        return None
    waited = _waited(evidence)
    if waited is None:
        return None
    others = [ev for ev in evidence if ev.collective != waited]
    odd = others[0].collective if len(others) == 1 else None
    if odd is None:
        return None
    if odd.pending:
        # A desync: it waits in another collective. Only a majority of at least two
        # says which side is wrong.
        return others[0].rank if len(evidence) - 1 >= 2 else None
    if odd.group == waited.group and odd.seq >= waited.seq:
        return None  # it finished the collective the others wait in: not behind them
    return others[0].rank


def _by_stack_desync(evidence: Sequence[RankEvidence]) -> int | None:
    """All ranks in a collective by their stacks; one in another operation than the rest."""
    names = {ev.rank: ev.stack.collective if ev.stack else None for ev in evidence}
    if len(evidence) < 3 or any(n is None for n in names.values()):
        return None
    counts = collections.Counter(names.values())
    (top, n), *_ = counts.most_common(1)
    odd = [r for r, name in names.items() if name != top]
    return odd[0] if len(odd) == 1 and n >= 2 else None


def _by_blocked(evidence: Sequence[RankEvidence]) -> int | None:
    """The one rank in state D without a stack while every other one waits in a collective."""
    blocked = [ev for ev in evidence if ev.proc_state == "D" and ev.stack is None]
    others = [ev for ev in evidence if ev.rank not in {b.rank for b in blocked}]
    if len(blocked) != 1 or not others:
        return None
    if len({ev.stack.collective if ev.stack else None for ev in others} - {None}) != 1:
        return None
    if any(ev.stack is None or not ev.stack.in_collective for ev in others):
        return None
    mine = blocked[0].collective
    if mine is not None and mine.pending:
        return None  # its wait in a collective went through the kernel: the other rules'
    return blocked[0].rank


def _waited_by(evidence: Sequence[RankEvidence], culprit: int | None) -> dict[str, Any] | None:
    """The collective the ranks other than the culprit wait in (journal form)."""
    others = [ev for ev in evidence if ev.rank != culprit]
    state = _waited(others)
    if state is not None:
        return {"op": state.op, "group": state.group, "seq": state.seq}
    ops = collections.Counter(ev.stack.collective for ev in others if ev.stack is not None)
    ops.pop(None, None)
    top = ops.most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    return {"op": top[0][0], "group": None, "seq": None}


def _doing(ev: RankEvidence) -> str | None:
    """Where the culprit was: 'in broadcast #5 on default_pg at train.py:40 (main)'."""
    parts = {"T": ["stopped by a signal"], "D": ["blocked in the kernel"]}.get(
        ev.proc_state or "", []
    )
    if ev.collective is not None and ev.collective.pending:
        parts.append(f"in {ev.collective.describe()}")
    elif ev.stack is not None and ev.stack.collective is not None:
        parts.append(f"in {ev.stack.collective}")
    if ev.stack is not None:
        parts.append(f"at {ev.stack.location} ({ev.stack.function})")
    return " ".join(parts) or None


def _describe_waited(waited: dict[str, Any]) -> str:
    if waited["seq"] is None:
        return str(waited["op"])
    return f"{waited['op']} #{waited['seq']} on {waited['group']}"


def _explain(finding: CulpritFinding, evidence: Sequence[RankEvidence]) -> CulpritFinding:
    """Add the waited collective and the culprit's whereabouts to a finding."""
    waited = _waited_by(evidence, finding.culprit)
    frame = None
    sentence = finding.sentence
    if finding.culprit is not None:
        frame = _doing(next(ev for ev in evidence if ev.rank == finding.culprit))
        if waited is not None:
            sentence += (
                f"; {_ranks(finding.victims)} {'wait' if len(finding.victims) > 1 else 'waits'}"
                f" in {_describe_waited(waited)}"
                + (f" while rank {finding.culprit} is {frame}" if frame else "")
                if finding.victims
                else ""
            )
    elif waited is not None:
        sentence += f"; waited collective: {_describe_waited(waited)}"
    return dataclasses.replace(finding, sentence=sentence, collective=waited, culprit_frame=frame)


def find_culprit(
    evidence: Iterable[RankEvidence],
    *,
    world_size: int | None = None,
    min_margin_s: float = DEFAULT_MIN_MARGIN_S,
) -> CulpritFinding:
    """Decide the culprit of one cycle's hang from every terminated rank's evidence.

    ``world_size`` (when known) makes a rank without evidence a reason to stay
    undecided: it may be the one that hung. The first evidence of a rank counts.
    """
    items = sorted({ev.rank: ev for ev in reversed(list(evidence))}.values(), key=lambda e: e.rank)
    return _explain(_find(items, world_size, min_margin_s), items)


def _find(
    evidence: Sequence[RankEvidence], world_size: int | None, min_margin_s: float
) -> CulpritFinding:
    seen: dict[int, RankEvidence] = {}
    for ev in evidence:
        seen.setdefault(ev.rank, ev)
    items = sorted(seen.values(), key=lambda ev: ev.rank)

    def undecided(reason: str) -> CulpritFinding:
        detail = _grouped(items) if items else "no hang evidence"
        return CulpritFinding(None, (), (), reason, f"culprit undecided ({reason}): {detail}")

    if not items:
        return undecided("no rank was terminated for a hang")
    # A rank frozen by a signal waited on no one: the ranks without evidence (e.g. those
    # whose collective failed when it was killed, so they exited first) cannot change that.
    stopped = [ev.rank for ev in items if ev.proc_state == "T"]
    if len(stopped) == 1 and (len(items) > 1 or world_size == 1):
        frozen = stopped[0]
        waiting = [ev for ev in items if ev.rank != frozen]
        sentence = f"rank {frozen}: {seen[frozen].describe()}"
        if waiting:
            sentence += f"; {_grouped(waiting)}"
        return CulpritFinding(
            frozen,
            tuple(ev.rank for ev in waiting),
            (Basis.STOPPED,),
            "it was stopped by a signal (state T) while the others waited",
            sentence,
        )
    if world_size is not None:
        missing = sorted(set(range(world_size)) - set(seen))
        if missing:
            return undecided(f"no evidence from {_ranks(missing)}")
    if len(items) == 1:
        if world_size == 1:
            only = items[0]
            return CulpritFinding(
                only.rank, (), (), "the only rank", f"rank {only.rank}: {only.describe()}"
            )
        return undecided("evidence from one rank only")
    by_collective = _by_collective(items)
    by_stack = _by_stack(items)
    by_timing = _by_timing(items, min_margin_s)
    by_blocked = _by_blocked(items)
    if by_collective is not None:
        if by_stack is not None and by_stack != by_collective:
            return undecided(
                f"the flight recorders point at rank {by_collective}, the stacks at rank {by_stack}"
            )
        basis = tuple(
            b
            for b, r in (
                (Basis.COLLECTIVE, by_collective),
                (Basis.BLOCKED, by_blocked),
                (Basis.STACK, by_stack),
                (Basis.TIMING, by_timing),
            )
            if r == by_collective
        )
        victims = [ev for ev in items if ev.rank != by_collective]
        odd = seen[by_collective].collective
        how = (
            "it waits in another collective than the others (a desync)"
            if odd is not None and odd.pending
            else "it has not reached the collective the others wait in"
        )
        return CulpritFinding(
            by_collective,
            tuple(ev.rank for ev in victims),
            basis,
            how + " (flight recorder)",
            f"rank {by_collective}: {seen[by_collective].describe()}; {_grouped(victims)}",
        )
    if by_blocked is not None:
        if by_timing is not None and by_timing != by_blocked:
            return undecided(
                f"rank {by_blocked} is blocked in the kernel, "
                f"the heartbeat times point at rank {by_timing}"
            )
        victims = [ev for ev in items if ev.rank != by_blocked]
        return CulpritFinding(
            by_blocked,
            tuple(ev.rank for ev in victims),
            (Basis.BLOCKED,) + ((Basis.TIMING,) if by_timing == by_blocked else ()),
            "it is blocked in the kernel (state D) while the others wait in a collective",
            f"rank {by_blocked}: {seen[by_blocked].describe()}; {_grouped(victims)}",
        )
    desync = False
    if by_stack is None:
        by_stack = _by_stack_desync(items)
        desync = by_stack is not None
    if by_stack is not None and by_timing is not None and by_stack != by_timing:
        return undecided(
            f"the stacks point at rank {by_stack}, the heartbeat times at rank {by_timing}"
        )
    if by_stack is not None and _stale_last_by_margin(items, by_stack, min_margin_s):
        return undecided(f"rank {by_stack} is outside a collective but went stale last")
    if by_timing is not None and _in_collective_while_another_is_not(items, by_timing):
        return undecided(f"rank {by_timing} went stale first but is blocked in a collective")
    culprit = by_stack if by_stack is not None else by_timing
    if culprit is None:
        stacks = [ev.stack for ev in items]
        if all(s is not None and s.in_collective for s in stacks):
            why = "every rank is blocked in a collective"
        elif all(s is not None for s in stacks):
            outside = [ev.rank for ev in items if ev.stack and not ev.stack.in_collective]
            why = f"{_ranks(outside)} are outside a collective"
        else:
            why = "no clear heartbeat margin and not every rank's stack is known"
        return undecided(why)
    basis = tuple(
        b for b, r in ((Basis.STACK, by_stack), (Basis.TIMING, by_timing)) if r == culprit
    )
    stack_reason = (
        "its stack is in another collective than the others' (a desync)"
        if desync
        else "its stack is outside a collective while the others wait in one"
    )
    main = seen[culprit]
    victims = [ev for ev in items if ev.rank != culprit]
    sentence = f"rank {culprit}: {main.describe()}; {_grouped(victims)}"
    return CulpritFinding(
        culprit,
        tuple(ev.rank for ev in victims),
        basis,
        " and ".join(
            {
                Basis.STACK: stack_reason,
                Basis.TIMING: f"it went stale first by at least {min_margin_s:.1f} s",
            }[b]
            for b in basis
        ),
        sentence,
    )
