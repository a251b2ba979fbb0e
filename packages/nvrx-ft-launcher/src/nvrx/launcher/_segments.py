"""Which segments run the job (``--ft-segment=N``): the pure part, no store, no torch.

A segment is N nodes of one NVLink domain (the same segment id, :mod:`._segment_id`).
A job runs on whole segments only: MIN/N of them are active, the others wait. Each
restart is an *epoch* of the segment gate (:mod:`._segment_gate`): the nodes that come
back say so, and one of them runs :func:`elect` on what it sees.

- The segments are fixed once formed: the nodes of one domain not yet in a segment are
  taken N at a time in scheduler order (SLURM_PROCID, then GROUP_RANK, then arrival);
  fewer than N left over wait until more of their domain arrive.
- A segment is complete when every one of its nodes came back. The active segments of
  the previous epoch come first (NVRx 0.7: hot-spare rounds prefer returning active
  nodes), then the others in scheduler order (their lowest member first).
- An active segment that lost a node is *broken*: its other nodes leave the job. Only
  an election that waited its full settle window declares segments broken; the fast one
  (every active node came back) changes nothing but the epoch. A standby segment not
  all there is only no candidate (a slow node must not cost a spare).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence

from ._scheduler_order import InfraKey

__all__: list[str] = []

_MAX_NAME = 200


@dataclasses.dataclass(frozen=True)
class SegmentSettings:
    """``--ft-segment``: segment size, the job's MIN and MAX nodes, this node's segment id."""

    size: int
    min_nodes: int
    max_nodes: int
    segment_id: str


@dataclasses.dataclass(frozen=True)
class Member:
    """A node at the gate: its id, its segment id (domain) and its scheduler order."""

    node: str
    domain: str
    key: InfraKey


@dataclasses.dataclass(frozen=True)
class Segment:
    """N nodes of one domain that join and leave the job together."""

    name: str
    domain: str
    #: The node ids, in scheduler order (their group ranks follow it).
    members: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Election:
    """One epoch's outcome: every segment known, which run, which broke."""

    epoch: int
    segments: tuple[Segment, ...]
    #: The names of the active segments, in group-rank order.
    active: tuple[str, ...]
    #: Segments that lost a node in this epoch (their other nodes leave the job).
    broken: tuple[Segment, ...] = ()

    def segment_of(self, node: str) -> Segment | None:
        """The segment ``node`` belongs to (broken ones included), or None."""
        for seg in (*self.segments, *self.broken):
            if node in seg.members:
                return seg
        return None

    def active_nodes(self) -> list[str]:
        """Every active node, segment after segment: index = the node's place in the job."""
        by_name = {s.name: s for s in self.segments}
        return [n for name in self.active for n in by_name[name].members]

    def to_json(self) -> str:
        def seg(s: Segment) -> dict[str, object]:
            return {"name": s.name, "domain": s.domain, "members": list(s.members)}

        return json.dumps(
            {
                "epoch": self.epoch,
                "segments": [seg(s) for s in self.segments],
                "active": list(self.active),
                "broken": [seg(s) for s in self.broken],
            }
        )

    @classmethod
    def from_json(cls, text: str, size: int) -> Election:
        """Parse and check a published election; ValueError for anything malformed."""
        try:
            data = json.loads(text)
        except ValueError:
            raise ValueError("segment election: not JSON") from None
        if not isinstance(data, dict) or set(data) != {"epoch", "segments", "active", "broken"}:
            raise ValueError("segment election: wrong fields")
        epoch = data["epoch"]
        if type(epoch) is not int or epoch < 0:
            raise ValueError(f"segment election: bad epoch {epoch!r}")
        segments = tuple(_segment(s, size) for s in _list(data["segments"]))
        broken = tuple(_segment(s, size) for s in _list(data["broken"]))
        active = tuple(_name(a) for a in _list(data["active"]))
        names = {s.name for s in segments}
        nodes = [n for s in (*segments, *broken) for n in s.members]
        if len(names) != len(segments) or len(set(nodes)) != len(nodes):
            raise ValueError("segment election: a segment or node listed twice")
        if len(set(active)) != len(active) or not set(active) <= names:
            raise ValueError("segment election: active segments not among the segments")
        return cls(epoch, segments, active, broken)


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ValueError("segment election: not a list")
    return value


def _name(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_NAME or not value.isprintable():
        raise ValueError(f"segment election: bad name {value!r}")
    return value


def _segment(value: object, size: int) -> Segment:
    if not isinstance(value, dict) or set(value) != {"name", "domain", "members"}:
        raise ValueError("segment election: bad segment")
    members = tuple(_name(m) for m in _list(value["members"]))
    if len(members) != size:
        raise ValueError(f"segment election: a segment of {len(members)} nodes, not {size}")
    return Segment(_name(value["name"]), _name(value["domain"]), members)


def _new_segments(
    loose: Iterable[Member], size: int, taken_names: set[str]
) -> tuple[list[tuple[Segment, InfraKey]], list[Member]]:
    """Nodes in no segment yet, N at a time per domain in scheduler order; the rest."""
    by_domain: dict[str, list[Member]] = {}
    for m in loose:
        by_domain.setdefault(m.domain, []).append(m)
    formed: list[tuple[Segment, InfraKey]] = []
    left: list[Member] = []
    for domain in sorted(by_domain):
        members = sorted(by_domain[domain], key=lambda m: (m.key, m.node))
        whole = len(members) - len(members) % size
        left.extend(members[whole:])
        for start in range(0, whole, size):
            chunk = members[start : start + size]
            k = 0
            while f"{domain}#{k}" in taken_names:
                k += 1
            name = f"{domain}#{k}"
            taken_names.add(name)
            formed.append((Segment(name, domain, tuple(m.node for m in chunk)), chunk[0].key))
    return formed, left


def elect(
    epoch: int,
    present: Sequence[Member],
    previous: Election | None,
    size: int,
    need: int,
    *,
    settled: bool,
) -> Election | None:
    """The segments that run epoch ``epoch``, or None while fewer than ``need`` are complete.

    ``present``: the nodes that came to this epoch's gate; ``previous``: the last epoch's
    election (None at the first start); ``settled``: the settle window has passed, so a
    segment with some of its nodes here and some not is broken (else it is only not
    complete yet).
    """
    here = {m.node: m for m in present}
    known = () if previous is None else previous.segments
    complete: list[tuple[Segment, InfraKey]] = []
    kept: list[Segment] = []
    broken: list[Segment] = []
    prev_active = () if previous is None else previous.active
    for seg in known:
        arrived = [n for n in seg.members if n in here]
        if len(arrived) == size:
            complete.append((seg, min(here[n].key for n in seg.members)))
            kept.append(seg)
        elif settled and seg.name in prev_active:
            broken.append(seg)  # an active segment lost a node: the others leave
        else:
            # A standby segment not all here: slow, or one of its nodes died; it is no
            # candidate now, and breaking it for a slow node would lose a good spare.
            kept.append(seg)
    in_segment = {n for s in known for n in s.members}
    formed, _waiting = _new_segments(
        (m for m in present if m.node not in in_segment), size, {s.name for s in known}
    )
    candidates = complete + formed
    rank = {name: i for i, name in enumerate(prev_active)}
    candidates.sort(key=lambda c: (rank.get(c[0].name, len(rank)), c[1], c[0].name))
    if len(candidates) < need:
        return None
    return Election(
        epoch=epoch,
        segments=(*kept, *(s for s, _ in formed)),
        active=tuple(s.name for s, _ in candidates[:need]),
        broken=tuple(broken),
    )


def whole_segments(names: Sequence[str | None], size: int) -> str | None:
    """Why a round of nodes in segments ``names`` is not whole segments, or None if it is."""
    if any(n is None for n in names):
        return "a node of the round has no segment"
    counts: dict[str, int] = {}
    for n in names:
        if n is not None:
            counts[n] = counts.get(n, 0) + 1
    wrong = {n: c for n, c in sorted(counts.items()) if c != size}
    if wrong:
        parts = ", ".join(f"{n} with {c}" for n, c in wrong.items())
        return f"the round is not whole segments of {size} nodes: {parts}"
    return None
