"""The segment gate: before torch's join, only the nodes of the elected segments go on.

``--ft-segment=N``. Each start and restart of the job is an *epoch* of the gate, in the
rendezvous' own store (the base store, under ``nvrx.launcher/segments/<run id>/``).
Every value that decides anything is signed with the job key (bound to its store key and
the run's nonce, :mod:`._run_nonce`);
the only unsigned values are hints (``<e>/opened``, ``<e>/count``) that say where to
look, never what to do:

1. a node comes to the gate: the nodes active in the last epoch *open* the next one,
   each with its signed marker ``<e>/open/<node>`` (a standby, when every active node is
   gone, too); an epoch is open once a marker is valid from a node of one of the last
   election's segments. The others (standbys, late nodes) wait until then;
2. each node says it is here: it claims a place ``<e>/slot/<i>`` with compare_set (no
   two nodes share one; the ``count`` hint only says where to start), the value its
   signed id, segment id and scheduler order. At most MAX + a margin places;
3. a node that sees enough (the first start: every MAX node here; a restart: every
   node of the last active segments back; else the settle window, torch's
   ``last_call_timeout``, passed) runs :func:`~._segments.elect`. Any node may, once
   its place's stagger has passed (place x 2 s); the result is written with
   compare_set(``<e>/result``, "", signed), so the first one stands;
4. every node reads the result and checks its signature: an active node calls torch's
   join, a standby waits for the next epoch (never inside a round), a node of a broken
   segment leaves the job. A node new to the job finds the current epoch as the first
   one without a valid result.

So torch's rounds only ever hold the elected segments; torch's rank 0 checks it again
(:mod:`._group_rank`). A client without the key can still disturb the store (delete or
overwrite keys: the gate then waits, and times out), but cannot choose who runs, open an
epoch or break a segment.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta

from torch.distributed.elastic.rendezvous import RendezvousHandler
from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

from ._run_nonce import run_nonce, scheduler_attempt, signed_run
from ._scheduler_order import InfraKey, infra_key
from ._segments import Election, Member, Segment, SegmentSettings, elect
from ._signed_store import Rejections, SignedStore
from ._torch_compat import Store, rendezvous_nodes

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

_POLL_S = 0.1
_CLOSED_CHECK_S = 1.0
#: How often a waiting node verifies the open markers once the unsigned hint says so.
_OPEN_CHECK_S = 1.0
#: How often an elector reads the places (each empty place is one store check).
_SCAN_S = 0.25
#: Places beyond MAX (a few launchers too many, or values nobody can verify).
_SLOT_MARGIN = 8
#: Any node may elect; the one in place i after i x this, should the earlier ones die.
_ELECTOR_STAGGER_S = 2.0
#: What torch's round of the elected nodes may take beyond its last call and keep-alive:
#: this, plus the per-node share (every join is a compare-and-set on torch's one state
#: key, so a large round takes longer to form; at 1,024 nodes the deadline reaches
#: torch's default join timeout and nothing is cut short).
_ROUND_MARGIN_S = 60.0
_ROUND_PER_NODE_S = 0.5


class GateFull(Exception):
    """MAX nodes are at the gate already: this launcher is one too many."""


class SegmentLeave(Exception):
    """This node's segment broke (lost a node): this node leaves the job."""

    def __init__(self, segment: Segment, reason: str, nodes: list[str]) -> None:
        super().__init__(f"segment {segment.name}: {reason}")
        self.segment = segment
        self.reason = reason
        #: The segment's nodes that came back, this one included.
        self.nodes = nodes


def _presence(member: Member) -> str:
    return json.dumps(
        {
            "node": member.node,
            "domain": member.domain,
            "tier": member.key.tier,
            "index": member.key.index,
        }
    )


def _parse_presence(text: str) -> Member:
    data = json.loads(text)
    if not isinstance(data, dict) or set(data) != {"node", "domain", "tier", "index"}:
        raise ValueError("not a segment gate key")
    node, domain = data["node"], data["domain"]
    for value in (node, domain):
        if not isinstance(value, str) or not 0 < len(value) <= 255 or not value.isprintable():
            raise ValueError(f"not a node or segment id: {value!r}")
    key = InfraKey.from_json(json.dumps({"tier": data["tier"], "index": data["index"]}))
    return Member(node, domain, key)


class SegmentGate:
    """One node's side of the gate; remembers the epoch it was last active in."""

    def __init__(
        self,
        settings: SegmentSettings,
        node: str,
        env: Mapping[str, str],
        *,
        key: bytes | None = None,
        run_id: str = "",
    ) -> None:
        self.settings = settings
        self._node = node
        self._env = env
        self._key = key
        self._run_id = run_id
        #: The gate's signed values (with the run's nonce), once the store is known.
        self._signed: SignedStore | None = None
        self._rejections = Rejections()
        self._prefix = f"nvrx.launcher/segments/{run_id}/"
        #: The epoch this node was last active in (None: never yet).
        self.epoch: int | None = None
        #: This node's place among the active nodes (its group-rank order) and segment.
        self.place: int | None = None
        self.segment: str | None = None
        self._elections: dict[int, Election] = {}
        #: Each epoch's keys read so far (index -> member, None: not usable).
        self._seen: dict[tuple[int, int], Member | None] = {}
        self._said_standby = -1
        #: Epochs whose open marker was verified; results warned about once.
        self._open_epochs: set[int] = set()
        self._next_open_check = 0.0

    # -- store keys ----------------------------------------------------------------

    def _k(self, name: str) -> str:
        return self._prefix + name

    def _sig(self, store: Store) -> SignedStore:
        """The gate's values in ``store``, signed for this run (its nonce read or created once)."""
        if self._signed is None or self._signed.store is not store:
            if self._signed is None:
                attempt = scheduler_attempt(self._env)
                run = signed_run(self._run_id, run_nonce(store, self._key, self._run_id, attempt))
            else:
                run = self._signed.signed_run
            self._signed = SignedStore(store, self._key, run, rejections=self._rejections)
        return self._signed

    def _write(self, store: Store, name: str, body: str) -> None:
        self._sig(store).set(self._k(name), body)

    def _count(self, store: Store, name: str, by: int = 0) -> int:
        return int(store.add(self._k(name), by))

    def _election(self, store: Store, epoch: int) -> Election | None:
        if epoch in self._elections:
            return self._elections[epoch]

        def parse(body: str) -> Election:
            election = Election.from_json(body, self.settings.size)
            if election.epoch != epoch:
                raise ValueError(f"an election for epoch {election.epoch}")
            return election

        election = self._sig(store).read(self._k(f"{epoch}/result"), parse)
        if election is None:
            return None
        self._elections[epoch] = election
        return election

    def _current_epoch(self, store: Store) -> int:
        """The first epoch without a valid result (a node new to the job starts there)."""
        epoch = 0
        while self._election(store, epoch) is not None:
            epoch += 1
        return epoch

    def _places(self) -> int:
        return self.settings.max_nodes + _SLOT_MARGIN

    def _present(self, store: Store, epoch: int) -> list[Member]:
        """The nodes in the epoch's places (each place read once it is taken)."""
        found: dict[str, Member] = {}
        for i in range(self._places()):
            member = self._place_member(store, epoch, i)
            if member is not None:
                found.setdefault(member.node, member)
        return list(found.values())

    def _place_member(self, store: Store, epoch: int, i: int) -> Member | None:
        name = f"{epoch}/slot/{i}"
        if (epoch, i) not in self._seen:
            if not store.check([self._k(name)]):
                return None  # free
            key = self._k(name)
            self._seen[epoch, i] = self._sig(store).parse(key, store.get(key), _parse_presence)
        return self._seen[epoch, i]

    def _claim(self, store: Store, epoch: int, member: Member, hint: int) -> int:
        """Take a free place (compare_set: no two nodes share one), from ``hint`` on."""
        places = self._places()
        start = min(max(hint, 0), places - 1)
        body = _presence(member)
        for j in range(places):
            i = (start + j) % places
            ours = self._sig(store).compare_set(self._k(f"{epoch}/slot/{i}"), body)
            if ours is None:
                raise RuntimeError("--ft-segment needs a rendezvous store with compare-and-set")
            if ours:
                self._seen[epoch, i] = member
                return i
        raise GateFull(
            f"--nnodes {self.settings.min_nodes}:{self.settings.max_nodes}: all {places} "
            f"places at the segment gate are taken; this launcher is one too many"
        )

    def _open(self, store: Store, epoch: int) -> None:
        """Open ``epoch``: this node's signed marker, then the hint that one is there."""
        self._write(store, f"{epoch}/open/{self._node}", _open_marker(epoch, self._node))
        self._count(store, f"{epoch}/opened", 1)

    def _is_open(self, store: Store, epoch: int, now: float) -> bool:
        """Epoch 0 is open; a later one once a node of the last election's segments says so."""
        if epoch == 0 or epoch in self._open_epochs:
            return True
        if now < self._next_open_check or self._count(store, f"{epoch}/opened") <= 0:
            return False
        self._next_open_check = now + _OPEN_CHECK_S
        previous = self._election(store, epoch - 1)
        if previous is None:
            return False
        for seg in previous.segments:
            for node in seg.members:
                marker = self._sig(store).read(self._k(f"{epoch}/open/{node}"), str)
                if marker == _open_marker(epoch, node):
                    self._open_epochs.add(epoch)
                    return True
        return False

    # -- the last round, for node_replaced ------------------------------------------

    def record_round(self, store: Store, nodes: Sequence[tuple[str, int]]) -> None:
        """Group rank 0 writes the round's (node, group rank) list for the next segment."""
        self._write(store, "last_round", json.dumps([[n, r] for n, r in nodes]))

    def last_round(self, store: Store) -> tuple[tuple[str, int], ...]:
        """The last round's (node, group rank) list; empty if none or not valid."""

        def parse(body: str) -> tuple[tuple[str, int], ...]:
            data = json.loads(body)
            if not isinstance(data, list) or not all(
                isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and type(e[1]) is int
                for e in data
            ):
                raise ValueError("not the last round's node list [[node, rank], ...]")
            return tuple((e[0], e[1]) for e in data)

        return self._sig(store).read(self._k("last_round"), parse) or ()

    def activity(self, store: Store) -> tuple[int, int, int]:
        """What changes while nodes use the gate: the current epoch, its count and opened
        hints. Only ever a reason for a store host to serve longer, never to act."""
        epoch = self._current_epoch(store)
        return epoch, self._count(store, f"{epoch}/count"), self._count(store, f"{epoch}/opened")

    # -- the gate ------------------------------------------------------------------

    def admit(self, handler: RendezvousHandler, store: Store) -> bool:
        """Wait until this node's segment is elected to run; False if the job ended.

        Raises SegmentLeave when this node's segment broke, and RendezvousTimeoutError
        when an open epoch finds too few complete segments within torch's join timeout.
        """
        was_active = self.epoch is not None
        epoch = (self.epoch + 1) if self.epoch is not None else self._current_epoch(store)
        while True:
            election = self._outcome(handler, store, epoch, opener=was_active)
            if election is None:
                return False
            active = election.active_nodes()
            if self._node in active:
                self.epoch = epoch
                self.place = active.index(self._node)
                seg = election.segment_of(self._node)
                self.segment = None if seg is None else seg.name
                logger.info(
                    "segment %s runs (epoch %d): active segments %s",
                    self.segment,
                    epoch,
                    ", ".join(election.active),
                )
                return True
            seg = election.segment_of(self._node)
            if seg is not None and seg in election.broken:
                back = self._back(store, epoch, seg)
                if self._node not in back:  # this node itself came too late
                    raise SegmentLeave(
                        seg,
                        f"this node came back after the settle window, when epoch {epoch} "
                        f"was elected without it; its other nodes leave the job",
                        [*back, self._node],
                    )
                missing = len(seg.members) - len(back)
                raise SegmentLeave(
                    seg,
                    f"{missing} of its {len(seg.members)} nodes did not come back within "
                    f"the settle window; its other nodes leave the job",
                    back,
                )
            if was_active:
                name = "none" if seg is None else seg.name
                raise SegmentLeave(
                    seg or Segment(name, self.settings.segment_id, (self._node,)),
                    f"this node came back after epoch {epoch} was elected without it",
                    [self._node],
                )
            if self._said_standby != epoch:
                self._said_standby = epoch
                logger.info(
                    "standby (epoch %d, segment %s): active segments %s",
                    epoch,
                    "not formed yet" if seg is None else seg.name,
                    ", ".join(election.active),
                )
            epoch += 1

    def elected_nodes(self) -> int:
        """How many nodes the epoch this node was last admitted in elected (0: none yet)."""
        election = None if self.epoch is None else self._elections.get(self.epoch)
        return 0 if election is None else len(election.active_nodes())

    def _back(self, store: Store, epoch: int, seg: Segment) -> list[str]:
        here = {m.node for m in self._present(store, epoch)}
        return [n for n in seg.members if n in here]

    def _outcome(
        self, handler: RendezvousHandler, store: Store, epoch: int, *, opener: bool
    ) -> Election | None:
        """Epoch ``epoch``'s election (taking part once it is open); None if the job ended."""
        settle = settle_window(handler)
        join = join_timeout(handler)
        if opener:
            self._open(store, epoch)
        opened_at: float | None = None
        index = -1
        next_closed_check = next_scan = 0.0
        # A standby that saw the last election opens the next epoch itself when every
        # active node is lost at once (nobody is left to open it): torch's rendezvous
        # listed nodes since, and has listed none for a keep-alive and a settle window
        # (or never listed any within the join timeout).
        orphan_after = settle + keep_alive_window(handler)
        watch_from = time.monotonic()
        empty_since: float | None = None
        seen_listed = False
        watch_round = not opener and epoch > 0 and (epoch - 1) in self._elections
        while True:
            election = self._election(store, epoch)
            if election is not None:
                return election
            now = time.monotonic()
            if opened_at is None and self._is_open(store, epoch, now):
                opened_at = now
                if self.epoch is None and not self._elections:
                    self._refuse_beyond_max(store, epoch)
                # The unsigned count: where to look for a free place, and the arrival
                # order where the scheduler gives none (never who runs or breaks).
                hint = max(self._count(store, f"{epoch}/count", 1) - 1, 0)
                member = Member(self._node, self.settings.segment_id, infra_key(self._env, hint))
                index = self._claim(store, epoch, member, hint)
                next_scan = now
            if opened_at is not None:
                waited = now - opened_at
                if waited >= index * _ELECTOR_STAGGER_S and now >= next_scan:
                    next_scan = now + _SCAN_S
                    self._try_elect(store, epoch, settled=waited >= settle)
                if now - opened_at > join:
                    raise RendezvousTimeoutError(
                        f"--ft-segment={self.settings.size}: fewer than "
                        f"{self.settings.min_nodes // self.settings.size} complete segments "
                        f"came to the rendezvous within {join:g} s"
                    )
            if now >= next_closed_check:
                next_closed_check = now + _CLOSED_CHECK_S
                if handler.is_closed():
                    return None
                if watch_round and opened_at is None:
                    found = rendezvous_nodes(handler)
                    if found is None or found[0] > 0:
                        seen_listed = seen_listed or found is not None
                        empty_since = None
                    elif empty_since is None:
                        empty_since = now
                    gone = empty_since is not None and (
                        now - empty_since > orphan_after if seen_listed else now - watch_from > join
                    )
                    if gone:
                        logger.warning(
                            "no node is left in the rendezvous: every active node is gone; "
                            "this standby opens epoch %d",
                            epoch,
                        )
                        self._open(store, epoch)
                        watch_round = False
            time.sleep(_POLL_S)

    def _refuse_beyond_max(self, store: Store, epoch: int) -> None:
        """A node new to the job that finds MAX nodes at the gate does not say it is here."""
        limit = self.settings.max_nodes
        if self._count(store, f"{epoch}/count") < limit:
            return  # the cheap check; a forged count alone refuses nobody:
        here = [m for m in self._present(store, epoch) if m.node != self._node]
        if len(here) >= limit:
            raise GateFull(
                f"--nnodes {self.settings.min_nodes}:{limit}: {len(here)} nodes are in the "
                f"job already (running or waiting as standbys); this launcher is one too many"
            )

    def _try_elect(self, store: Store, epoch: int, *, settled: bool) -> None:
        present = self._present(store, epoch)
        previous = self._election(store, epoch - 1) if epoch > 0 else None
        back = {m.node for m in present}
        if previous is None:  # the first start: nothing to break
            ready = settled or len(present) >= self.settings.max_nodes
        else:  # MAX nodes here is no reason to skip the settle window of a missing node
            ready = settled or set(previous.active_nodes()) <= back
        if not ready:
            return
        size = self.settings.size
        election = elect(
            epoch, present, previous, size, self.settings.min_nodes // size, settled=settled
        )
        if election is None:
            return
        # A value there that is not a valid result (nobody with the key wrote it) is
        # replaced exactly, once; another node's valid election stands.
        ours = self._sig(store).compare_set(
            self._k(f"{epoch}/result"),
            election.to_json(),
            stands=lambda _: self._election(store, epoch) is not None,
            tries=2,
        )
        if not ours:
            return
        logger.info(
            "segment election, epoch %d: active %s, broken %s",
            epoch,
            ", ".join(election.active),
            ", ".join(s.name for s in election.broken) or "none",
        )


def _open_marker(epoch: int, node: str) -> str:
    return json.dumps({"epoch": epoch, "node": node})


def hosts_store(store: Store) -> bool:
    """Whether this process serves ``store`` (a TCPStore listening on its port here).

    Torch's c10d backend hosts the rendezvous store in one launcher; a node of a broken
    segment that hosts it must stay up until the job ends. Linux: /proc/net/tcp{,6}.
    """
    port = getattr(store, "port", None)
    if not isinstance(port, int):
        return False
    inodes = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/self/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    except OSError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                        continue
                    if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                        return True
        except (OSError, ValueError):
            continue
    return False


def keep_alive_window(handler: RendezvousHandler) -> float:
    """How long torch lists a dead node: keep_alive_interval x keep_alive_max_attempt."""
    settings = getattr(handler, "settings", None)
    interval = getattr(settings, "keep_alive_interval", None)
    attempts = getattr(settings, "keep_alive_max_attempt", 3)
    seconds = interval.total_seconds() if isinstance(interval, timedelta) else 5.0
    return seconds * (attempts if isinstance(attempts, int) else 3)


def round_deadline(handler: RendezvousHandler, nodes: int) -> float:
    """How long torch's round of ``nodes`` elected nodes may take to form, in seconds.

    Each of them was at the gate a moment ago: the round needs torch's last call, a dead
    node of the last round dropped from torch's lists (its keep-alive window) and a
    margin that grows with the round. Longer, and an elected node is gone: the nodes go
    back to the gate, where a new election breaks its segment and brings a standby
    segment in.
    """
    margin = _ROUND_MARGIN_S + _ROUND_PER_NODE_S * max(nodes, 0)
    return settle_window(handler) + keep_alive_window(handler) + margin


def settle_window(handler: RendezvousHandler) -> float:
    """torch's last call (``--rdzv-conf last_call_timeout``), in seconds: the settle window."""
    return _timeout(handler, "last_call", 30.0)


def join_timeout(handler: RendezvousHandler) -> float:
    """torch's join timeout (``--rdzv-conf join_timeout``), in seconds."""
    return _timeout(handler, "join", 600.0)


def _timeout(handler: RendezvousHandler, name: str, default: float) -> float:
    settings = getattr(handler, "settings", None)
    value = getattr(getattr(settings, "timeout", None), name, None)
    return value.total_seconds() if isinstance(value, timedelta) else default
