"""--ft-segment: which segments run (pure), the round check, the segment id, the gate.

The gate runs for real: several SegmentGates in threads over one TCPStore on 127.0.0.1,
each with its own torch c10d rendezvous handler (for its timeouts and is_closed).
"""

from __future__ import annotations

import datetime
import pathlib
import threading
import time
import types
import uuid
from typing import Any

import pytest
import torch.distributed
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from nvrx.launcher._group_rank import _align
from nvrx.launcher._scheduler_order import InfraKey
from nvrx.launcher._segment_gate import GateFull, SegmentGate, SegmentLeave
from nvrx.launcher._segment_id import (
    SEGMENT_ID_ENV,
    node_segment_id,
    nvml_cluster_uuid,
    parse_segment_id,
)
from nvrx.launcher._segments import (
    Election,
    Member,
    Segment,
    SegmentSettings,
    elect,
    whole_segments,
)

pytestmark = pytest.mark.timeout(60)

dist: Any = torch.distributed


def _m(node: str, domain: str, index: int) -> Member:
    return Member(node, domain, InfraKey(1, index))


# -- election (pure) ------------------------------------------------------------------


def test_first_start_takes_whole_segments_in_scheduler_order() -> None:
    present = [_m("b1", "B", 3), _m("a0", "A", 0), _m("b0", "B", 2), _m("a1", "A", 1)]
    got = elect(0, present, None, size=2, need=1, settled=True)
    assert got is not None
    assert got.active == ("A#0",)
    assert got.active_nodes() == ["a0", "a1"]
    assert {s.name: s.members for s in got.segments} == {"A#0": ("a0", "a1"), "B#0": ("b0", "b1")}
    assert got.broken == ()


def test_too_few_complete_segments_elect_nothing() -> None:
    present = [_m("a0", "A", 0), _m("b0", "B", 2), _m("b1", "C", 3)]
    assert elect(0, present, None, size=2, need=1, settled=True) is None


def test_a_domain_of_more_nodes_is_cut_into_segments_and_the_rest_waits() -> None:
    present = [_m(f"n{i}", "rack", i) for i in range(5)]
    got = elect(0, present, None, size=2, need=2, settled=True)
    assert got is not None
    assert got.active == ("rack#0", "rack#1")
    assert got.active_nodes() == ["n0", "n1", "n2", "n3"]
    assert got.segment_of("n4") is None  # waits for another node of its domain


def test_returning_active_segments_come_first_then_scheduler_order() -> None:
    first = Election(
        0,
        (Segment("A#0", "A", ("a0", "a1")), Segment("B#0", "B", ("b0", "b1"))),
        ("B#0",),
    )
    present = [_m("a0", "A", 0), _m("a1", "A", 1), _m("b0", "B", 2), _m("b1", "B", 3)]
    got = elect(1, present, first, size=2, need=1, settled=True)
    assert got is not None
    assert got.active == ("B#0",)  # was active: kept although A orders first


def test_a_node_lost_breaks_its_segment_and_a_standby_takes_its_place() -> None:
    first = Election(
        0,
        (Segment("A#0", "A", ("a0", "a1")), Segment("B#0", "B", ("b0", "b1"))),
        ("A#0",),
    )
    present = [_m("a1", "A", 1), _m("b0", "B", 2), _m("b1", "B", 3)]
    assert elect(1, present, first, size=2, need=1, settled=False) is not None  # B is whole
    got = elect(1, present, first, size=2, need=1, settled=True)
    assert got is not None
    assert got.active == ("B#0",)
    assert [s.name for s in got.broken] == ["A#0"]
    assert [s.name for s in got.segments] == ["B#0"]
    assert got.segment_of("a1") == Segment("A#0", "A", ("a0", "a1"))


def test_before_the_settle_window_nothing_breaks() -> None:
    first = Election(
        0,
        (Segment("A#0", "A", ("a0", "a1")), Segment("B#0", "B", ("b0", "b1"))),
        ("A#0",),
    )
    # Every active node back, a standby half here: the fast election changes nothing.
    present = [_m("a0", "A", 0), _m("a1", "A", 1), _m("b0", "B", 2)]
    got = elect(1, present, first, size=2, need=1, settled=False)
    assert got is not None
    assert got.active == ("A#0",)
    assert got.broken == ()
    assert [s.name for s in got.segments] == ["A#0", "B#0"]


def test_a_half_present_standby_segment_is_no_candidate_but_not_broken() -> None:
    first = Election(
        0,
        (
            Segment("A#0", "A", ("a0", "a1")),
            Segment("B#0", "B", ("b0", "b1")),
            Segment("C#0", "C", ("c0", "c1")),
        ),
        ("A#0",),
    )
    present = [_m("a1", "A", 1), _m("b0", "B", 2), _m("c0", "C", 4), _m("c1", "C", 5)]
    got = elect(1, present, first, size=2, need=1, settled=True)
    assert got is not None
    assert got.active == ("C#0",)
    assert [s.name for s in got.broken] == ["A#0"]  # active, lost a node
    assert [s.name for s in got.segments] == ["B#0", "C#0"]  # B: a slow spare, kept


def test_a_fully_absent_standby_segment_is_kept_not_broken() -> None:
    first = Election(
        0,
        (Segment("A#0", "A", ("a0", "a1")), Segment("B#0", "B", ("b0", "b1"))),
        ("A#0",),
    )
    got = elect(1, [_m("a0", "A", 0), _m("a1", "A", 1)], first, size=2, need=1, settled=True)
    assert got is not None
    assert got.broken == ()
    assert [s.name for s in got.segments] == ["A#0", "B#0"]


def test_election_json_round_trip_and_refusals() -> None:
    got = elect(0, [_m("a0", "A", 0), _m("a1", "A", 1)], None, size=2, need=1, settled=True)
    assert got is not None
    assert Election.from_json(got.to_json(), 2) == got
    bad = [
        "not json",
        '{"epoch": 0}',
        '{"epoch": -1, "segments": [], "active": [], "broken": []}',
        '{"epoch": 0, "segments": [], "active": ["A#0"], "broken": []}',
        '{"epoch": 0, "segments": [{"name": "A#0", "domain": "A", "members": ["x"]}],'
        ' "active": [], "broken": []}',
        '{"epoch": 0, "segments": [{"name": "A#0", "domain": "A", "members": ["x", "x"]}],'
        ' "active": [], "broken": []}',
    ]
    for text in bad:
        with pytest.raises(ValueError, match="segment election"):
            Election.from_json(text, 2)


def test_whole_segments_check() -> None:
    assert whole_segments(["A#0", "A#0", "B#0", "B#0"], 2) is None
    assert "A#0 with 1" in str(whole_segments(["A#0", "B#0", "B#0"], 2))
    assert "no segment" in str(whole_segments(["A#0", None], 2))


# -- the round check in the group-rank exchange ---------------------------------------


def _store() -> Any:
    return dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=20),
    )


def _client(server: Any) -> Any:
    """One node's own connection to the store (a blocking wait holds its connection)."""
    return dist.TCPStore(
        "127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=20)
    )


def test_torch_rank_0_refuses_a_round_that_is_not_whole_segments() -> None:
    server = _store()
    stores = [_client(server) for _ in range(2)]
    segments = ["A#0", "B#0"]  # one node of each: mixed
    errors: list[BaseException] = []

    def node(rank: int) -> None:
        try:
            _align(
                stores[rank],
                rank,
                2,
                InfraKey(0, rank),
                f"n{rank}",
                segment=segments[rank],
                segment_size=2,
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(errors) == 2, errors
    assert all("not whole segments of 2 nodes" in str(e) for e in errors), errors
    assert all("A#0 with 1, B#0 with 1" in str(e) for e in errors), errors


def test_a_whole_segment_round_gets_its_ranks() -> None:
    server = _store()
    stores = [_client(server) for _ in range(2)]
    out: dict[int, int] = {}

    def node(rank: int) -> None:
        out[rank] = _align(
            stores[rank], rank, 2, InfraKey(0, 1 - rank), f"n{rank}", segment="A#0", segment_size=2
        )[0]

    threads = [threading.Thread(target=node, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == {0: 1, 1: 0}  # the gate's place orders the group ranks


# -- segment id -----------------------------------------------------------------------


def test_segment_id_from_the_environment() -> None:
    assert node_segment_id({SEGMENT_ID_ENV: " rack-7 "}) == ("rack-7", SEGMENT_ID_ENV)
    for bad in ("", "a b", "x#1", "é", "x" * 129):
        with pytest.raises(ValueError, match=SEGMENT_ID_ENV):
            parse_segment_id(bad)


def test_no_segment_id_says_why() -> None:
    def no_nvml() -> str:
        raise ValueError("NVML is not available: no library")

    with pytest.raises(ValueError, match="no segment id: NVRX_SEGMENT_ID is not set and NVML"):
        node_segment_id({}, no_nvml)


def _fake_nvml(uuids: list[bytes | None]) -> Any:
    """pynvml's shape for nvml_cluster_uuid (NVML itself does not run on this machine)."""

    def info(handle: int) -> Any:
        raw = uuids[handle]
        if raw is None:
            raise RuntimeError("Not Supported")
        return types.SimpleNamespace(clusterUuid=raw)

    return types.SimpleNamespace(
        nvmlDeviceGetCount=lambda: len(uuids),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetGpuFabricInfo=info,
    )


def test_cluster_uuid_of_the_gpus() -> None:
    one = uuid.uuid4().bytes
    assert nvml_cluster_uuid(_fake_nvml([one, one])) == str(uuid.UUID(bytes=one))
    with pytest.raises(ValueError, match="2 NVLink domains"):
        nvml_cluster_uuid(_fake_nvml([one, uuid.uuid4().bytes]))
    with pytest.raises(ValueError, match="no NVLink domain"):
        nvml_cluster_uuid(_fake_nvml([bytes(16)]))
    with pytest.raises(ValueError, match="no NVLink fabric info"):
        nvml_cluster_uuid(_fake_nvml([None]))
    with pytest.raises(ValueError, match="no GPU"):
        nvml_cluster_uuid(_fake_nvml([]))
    with pytest.raises(ValueError, match="cannot read NVLink fabric info"):
        nvml_cluster_uuid(types.SimpleNamespace())  # an older pynvml


@pytest.mark.gpu
def test_the_real_nvml_gives_an_id_or_a_reason() -> None:
    from nvrx.launcher._segment_id import _from_nvml

    try:
        got = _from_nvml()
    except ValueError as exc:  # GPUs without an NVLink fabric (not an NVL system)
        reason = str(exc)
        # On a GPU machine NVML itself must work: only the fabric may be missing.
        assert "NVLink" in reason, reason
        assert "NVML is not available" not in reason, reason
    else:
        assert uuid.UUID(got)


# -- the gate, for real over one store --------------------------------------------------


def _handler(store: Any, last_call: float, join: float = 20.0, *, keep_alive: bool = False) -> Any:
    """A real handler of MIN 2 (torch's default keep-alive, or 1 s x 2 with ``keep_alive``)."""
    backend = C10dRendezvousBackend(store, "seg")
    return dynamic_rendezvous.DynamicRendezvousHandler.from_backend(
        "seg",
        store,
        backend,
        min_nodes=2,
        max_nodes=2,
        timeout=dynamic_rendezvous.RendezvousTimeout(
            join=datetime.timedelta(seconds=join),
            last_call=datetime.timedelta(seconds=last_call),
        ),
        keep_alive_interval=1 if keep_alive else 5,  # torch's defaults: 5 s x 3
        keep_alive_max_attempt=2 if keep_alive else 3,
    )


def _gates(n: int, domains: str) -> list[SegmentGate]:
    return [
        SegmentGate(
            SegmentSettings(2, 2, n, domains[i]),
            f"n{i}",
            {"GROUP_RANK": str(i)},
            key=b"k" * 32,
            run_id="seg",
        )
        for i in range(n)
    ]


def _admit_all(
    gates: list[SegmentGate], stores: list[Any], handlers: list[Any]
) -> dict[int, object]:
    out: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            out[i] = gates[i].admit(handlers[i], stores[i])
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(gates))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def _install_cycle_steps(gate: SegmentGate, handler: Any, journal: Any) -> None:
    """The launcher's cycle steps on ``handler``: its next_rendezvous as the agent calls it."""
    from nvrx.launcher._cluster import ClusterOptions
    from nvrx.launcher._cluster_steps import ClusterSteps
    from nvrx.launcher._events import Recorder
    from nvrx.launcher.journal import JsonLines

    steps = ClusterSteps(
        ClusterOptions(standby_nodes=True, segments=gate.settings),
        Recorder(JsonLines(journal), JsonLines(None)),
        gate._node,
        run_id="seg",
        job_key=b"k" * 32,
    )
    steps.gate = gate
    steps.install(handler)


def test_gate_first_start_then_a_lost_node_brings_the_standby_segment() -> None:
    server = _store()
    gates = _gates(4, "AABB")
    stores = [_client(server) for _ in gates]
    handlers = [_handler(stores[i], last_call=0.5) for i in range(4)]
    # Epoch 0: all four; A has the lower scheduler order. B's nodes wait (threads stay).
    done: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            done[i] = gates[i].admit(handlers[i], stores[i])
        except BaseException as exc:
            done[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads[:2]:
        t.join(20)
    assert done == {0: True, 1: True}
    assert [g.place for g in gates[:2]] == [0, 1]
    assert gates[0].segment == "A#0"
    assert threads[2].is_alive()  # standbys, outside any round
    assert threads[3].is_alive()
    # Node 0 is lost; node 1 comes back (a restart): after the settle window A is broken.
    survivor: dict[int, object] = {}

    def back() -> None:
        try:
            survivor[1] = gates[1].admit(handlers[1], stores[1])
        except BaseException as exc:
            survivor[1] = exc

    t1 = threading.Thread(target=back, daemon=True)
    t1.start()
    t1.join(20)
    for t in threads[2:]:
        t.join(20)
    left = survivor[1]
    assert isinstance(left, SegmentLeave), left
    assert left.segment.name == "A#0"
    assert left.nodes == ["n1"]
    assert "1 of its 2 nodes did not come back" in left.reason
    assert done[2] is True
    assert done[3] is True
    assert [g.segment for g in gates[2:]] == ["B#0", "B#0"]
    assert [g.place for g in gates[2:]] == [0, 1]


def test_gate_restart_with_every_active_node_back_is_immediate() -> None:
    server = _store()
    gates = _gates(2, "AA")
    stores = [_client(server) for _ in gates]
    handlers = [_handler(s, last_call=30.0) for s in stores]
    assert _admit_all(gates, stores, handlers) == {0: True, 1: True}  # every MAX node here
    started = time.monotonic()
    assert _admit_all(gates, stores, handlers) == {0: True, 1: True}
    assert time.monotonic() - started < 20  # did not wait the 30 s settle window
    assert [g.epoch for g in gates] == [1, 1]


def test_gate_times_out_without_enough_complete_segments() -> None:
    server = _store()
    gates = _gates(3, "ABC")  # three nodes, no two in one domain
    stores = [_client(server) for _ in gates]
    handlers = [_handler(s, last_call=0.2, join=1.5) for s in stores]
    out = _admit_all(gates, stores, handlers)
    assert all(isinstance(v, RendezvousTimeoutError) for v in out.values()), out
    assert "fewer than 1 complete segments" in str(out[0])


def test_gate_ignores_a_forged_key() -> None:
    store = _store()
    # Someone without the job key writes a node into epoch 0 before the job starts.
    store.add("nvrx.launcher/segments/seg/0/count", 1)
    store.set(
        "nvrx.launcher/segments/seg/0/slot/0",
        '{"v": 1, "body": "{\\"node\\": \\"evil\\", \\"domain\\": \\"A\\", \\"tier\\": 0, '
        '\\"index\\": 0}", "mac": null}',
    )
    gates = _gates(2, "AA")
    stores = [_client(store) for _ in gates]
    handlers = [_handler(s, last_call=0.3) for s in stores]
    assert _admit_all(gates, stores, handlers) == {0: True, 1: True}
    assert sorted(g.place for g in gates if g.place is not None) == [0, 1]


# -- start-up checks (exit 2 naming the option and value) -------------------------------

_C10D = ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1"]


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--ft-segment=2", "--nnodes=3:4", *_C10D], {SEGMENT_ID_ENV: "A"}, "2 does not divide"),
        (["--ft-segment=0", "--nnodes=2:4", *_C10D], {SEGMENT_ID_ENV: "A"}, "--ft-segment"),
        (
            ["--ft-segment=2", "--nnodes=2:4", "--rdzv-backend=etcd-v2", "--rdzv-endpoint=h:1"],
            {SEGMENT_ID_ENV: "A"},
            "--ft-segment: needs --rdzv-backend c10d",
        ),
        (["--ft_segment=2", "--nnodes=2:4", *_C10D], {SEGMENT_ID_ENV: "a b"}, "NVRX_SEGMENT_ID"),
    ],
)
def test_bad_segment_settings_exit_2(
    argv: list[str],
    env: dict[str, str],
    named: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nvrx.launcher.cli import main
    from nvrx.launcher.exit_codes import ExitCode

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as info:
        main([*argv, "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    assert named in capsys.readouterr().err


def test_a_node_without_segment_id_exits_2_saying_why(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nvrx.launcher.cli import main

    monkeypatch.delenv(SEGMENT_ID_ENV, raising=False)
    with pytest.raises(SystemExit) as info:
        main(["--ft-segment=2", "--nnodes=2:4", *_C10D, "train.py"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--ft-segment=2: this node has no segment id: NVRX_SEGMENT_ID is not set" in err


def test_segments_imply_standby_and_carry_min_max(
    monkeypatch: pytest.MonkeyPatch, scripts_here: pathlib.Path
) -> None:
    from nvrx.launcher.cli import _options, get_parser

    monkeypatch.setenv(SEGMENT_ID_ENV, "rack-1")
    parser = get_parser()
    options = _options(
        parser.parse_args(["--ft_segment=2", "--nnodes=2:4", *_C10D, "train.py"]), parser
    )
    assert options.cluster.standby_nodes is True
    assert options.cluster.segments == SegmentSettings(2, 2, 4, "rack-1")


def test_hosts_store_tells_the_store_host_from_its_clients() -> None:
    import subprocess
    import sys

    from nvrx.launcher._segment_gate import hosts_store

    here = _store()
    assert hosts_store(here)
    code = (
        "import datetime, sys, torch.distributed as d\n"
        "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
        "print(s.port, flush=True)\n"
        "sys.stdin.read()\n"
    )
    host = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        client = dist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=20)
        )
        assert not hosts_store(client)  # served by the other process
    finally:
        host.kill()
        host.wait(10)


def test_the_gate_timeout_keeps_its_reason_in_the_launcher_exit() -> None:
    from torch.distributed.launcher.api import LaunchConfig

    from nvrx.launcher._launch import _rendezvous_failure

    config = LaunchConfig(min_nodes=2, max_nodes=4, nproc_per_node=1)
    reason = "--ft-segment=2: fewer than 1 complete segments came to the rendezvous within 9 s"
    assert reason in _rendezvous_failure(RendezvousTimeoutError(reason), None, config)
    # torch's own timeout has no message: the launcher says what it waited for
    assert "waiting for 2 to 4 node(s)" in _rendezvous_failure(
        RendezvousTimeoutError(), None, config
    )


def test_gate_refuses_a_launcher_beyond_max() -> None:
    server = _store()
    gates = _gates(2, "AB")  # no segment complete: both wait in epoch 0
    stores = [_client(server) for _ in range(3)]
    handlers = [_handler(st, last_call=30.0, join=4.0) for st in stores]
    waiting = threading.Thread(target=_admit_all, args=(gates, stores[:2], handlers[:2]))
    waiting.start()
    try:
        wait_until = time.monotonic() + 10
        while stores[2].add("nvrx.launcher/segments/seg/0/count", 0) < 2:
            assert time.monotonic() < wait_until, "the two nodes never came to the gate"
            time.sleep(0.05)
        third = SegmentGate(SegmentSettings(2, 2, 2, "A"), "n2", {}, key=b"k" * 32, run_id="seg")
        with pytest.raises(GateFull, match="2 nodes are in the job already"):
            third.admit(handlers[2], stores[2])
        # It never said it was there: the others still see two nodes.
        assert stores[2].add("nvrx.launcher/segments/seg/0/count", 0) == 2
    finally:
        waiting.join(20)  # the two time out (join_timeout 4 s)


def test_standbys_take_over_when_every_active_node_is_lost_at_once() -> None:
    """The whole active segment dies (its NVLink domain): nobody comes back to open the
    next epoch, so the standbys open it once torch's rendezvous has listed no node for a
    keep-alive window."""
    server = _store()
    gates = _gates(4, "AABB")
    stores = [_client(server) for _ in gates]

    handlers = [_handler(st, last_call=0.5, join=30.0, keep_alive=True) for st in stores]
    done: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            done[i] = gates[i].admit(handlers[i], stores[i])
        except BaseException as exc:
            done[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads[:2]:
        t.join(20)
    assert done == {0: True, 1: True}
    # A's two nodes form torch's round, run a while, then both die (no more keep-alives).
    ranks: dict[int, int] = {}

    def join(i: int) -> None:
        ranks[i] = handlers[i].next_rendezvous().rank

    joins = [threading.Thread(target=join, args=(i,), daemon=True) for i in (0, 1)]
    for t in joins:
        t.start()
    for t in joins:
        t.join(20)
    assert sorted(ranks.values()) == [0, 1]
    time.sleep(4.0)  # longer than the settle + keep-alive window: the round is listed
    assert threads[2].is_alive(), "a standby started while the active segment ran"
    for i in (0, 1):
        handlers[i]._stop_heartbeats()
    for t in threads[2:]:
        t.join(20)
    assert done[2] is True
    assert done[3] is True
    assert [g.epoch for g in gates[2:]] == [1, 1]
    election = gates[2]._elections[1]
    assert election.active == ("B#0",)
    assert [s.name for s in election.broken] == ["A#0"]


def test_a_standby_segment_still_waiting_when_the_job_ends_exits_as_a_standby(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job closes the rendezvous while segment B waits: B's launchers end the way
    torch's standby nodes do (its graceful exit, ft_launcher's exit 0), not as a
    rendezvous error (exit 5): they never joined one of torch's rounds. A standby that
    hosts the store serves it a moment longer, so the others still see the end."""
    from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError

    from nvrx.launcher import _staged_rendezvous

    server = _store()
    gates = _gates(4, "AABB")
    stores = [_client(server) for _ in gates]
    grace = 2.0  # longer than the gate's poll of the closed rendezvous (1 s)
    monkeypatch.setattr(_staged_rendezvous, "HOST_GRACE_S", grace)
    monkeypatch.setattr(_staged_rendezvous, "hosts_store", lambda store: store is stores[2])
    ended: dict[int, float] = {}
    handlers = [_handler(s, last_call=0.5) for s in stores]
    for i in (2, 3):  # the standbys' next_rendezvous as the agent calls it
        _install_cycle_steps(gates[i], handlers[i], tmp_path / f"j{i}")
    out: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            out[i] = (
                gates[i].admit(handlers[i], stores[i]) if i < 2 else handlers[i].next_rendezvous()
            )
        except BaseException as exc:
            out[i] = exc
        ended[i] = time.monotonic()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads[:2]:
        t.join(20)
    assert out == {0: True, 1: True}
    assert threads[2].is_alive()
    assert threads[3].is_alive()
    closed_at = time.monotonic()
    handlers[0].set_closed()  # the job ended (an agent closes it when its ranks are done)
    for t in threads[2:]:
        t.join(20)
    assert isinstance(out[2], RendezvousGracefulExitError), out[2]
    assert isinstance(out[3], RendezvousGracefulExitError), out[3]
    assert ended[2] - closed_at >= grace  # node 2 hosts the store: it served it longer


def test_the_round_deadline_grows_with_the_round_and_large_rounds_keep_the_join_timeout() -> None:
    """torch's defaults (last call 30 s, keep-alive 5 s x 3, join 600 s): 105 s for a
    small round, 0.5 s more per elected node; from about 1,000 nodes on it reaches the
    join timeout, so a large round that is merely slow to form is never cut short."""
    from nvrx.launcher._segment_gate import join_timeout, round_deadline

    server = _store()  # kept: the handler's client needs it up
    handler = _handler(_client(server), last_call=30.0, join=600.0)
    assert round_deadline(handler, 0) == pytest.approx(105.0)
    assert round_deadline(handler, 16) == pytest.approx(113.0)
    assert round_deadline(handler, 1024) > join_timeout(handler) == 600.0


@pytest.mark.timeout(90)
def test_an_elected_node_gone_before_torchs_round_forms_brings_a_new_election(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n1 passes the gate with n0 (segment A) and dies before torch's join. The round
    cannot form: at the round deadline (torch's last call + keep-alive window + margin,
    not the 60 s join timeout) n0 goes back to the gate, the new election breaks A (n0
    leaves with exit 3, its journal says why) and segment B runs in torch's round."""
    from nvrx.launcher import _cluster_steps, _segment_gate
    from nvrx.launcher._launcher_exit import LauncherExit

    monkeypatch.setattr(_segment_gate, "_ROUND_MARGIN_S", 5.0)  # B's round takes 1.5-2.5 s
    monkeypatch.setattr(_segment_gate, "_ROUND_PER_NODE_S", 0.0)
    # This process serves the test's store: n0 would stay to host it until the job ends.
    monkeypatch.setattr(_cluster_steps, "hosts_store", lambda store: False)
    server = _store()
    gates = _gates(4, "AABB")
    stores = [_client(server) for _ in gates]

    handlers = [_handler(st, last_call=0.5, join=60.0, keep_alive=True) for st in stores]
    assert _segment_gate.round_deadline(handlers[0], 2) == pytest.approx(7.5)
    for i in (0, 2, 3):  # next_rendezvous as the agent calls it; n1 only passes the gate
        _install_cycle_steps(gates[i], handlers[i], tmp_path / f"j{i}")
    out: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            if i == 1:
                out[i] = gates[i].admit(handlers[i], stores[i])
            else:
                info = handlers[i].next_rendezvous()
                out[i] = (info.rank, info.world_size)
        except BaseException as exc:
            out[i] = exc

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert time.monotonic() - started < 40, "waited for torch's 60 s join timeout"
    assert out[1] is True
    left = out[0]
    assert isinstance(left, LauncherExit), left
    assert left.code == 3
    assert "segment A#0 broke" in str(left)
    assert "1 of its 2 nodes did not come back" in str(left)
    assert {out[2], out[3]} == {(0, 2), (1, 2)}, out
    assert [g.epoch for g in gates[2:]] == [1, 1]
    assert [s.name for s in gates[2]._elections[1].broken] == ["A#0"]
    assert '"event": "segment_left"' in (tmp_path / "j0").read_text()
    for h in handlers:  # B's keep-alive timers would outlive the test's store
        h._stop_heartbeats()


def test_unsigned_counters_from_outside_the_job_decide_nothing(tmp_path: Any) -> None:
    """The adds someone without the job key can make (open an epoch, push the place
    count down or far up, take the elector's turn, move the current epoch on) neither
    start the standby segment nor break the running one, nor stall the gate."""
    server = _store()
    outsider = _client(server)
    p = "nvrx.launcher/segments/seg/"

    def forge(epoch: int) -> None:
        for name, by in (
            ("open", 1),
            ("opened", 1),
            ("count", -1),
            ("count", 10**7),
            ("elector", 1),
            ("elected", 5),
        ):
            outsider.add(f"{p}{epoch}/{name}" if name != "elected" else p + name, by)
        outsider.set(f"{p}{epoch}/result", '{"v": 1, "body": "{}", "mac": null}')

    forge(0)
    gates = _gates(4, "AABB")
    stores = [_client(server) for _ in gates]
    handlers = [_handler(s, last_call=0.5) for s in stores]
    out: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            out[i] = gates[i].admit(handlers[i], stores[i])
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads[:2]:
        t.join(20)
    assert out == {0: True, 1: True}  # A runs epoch 0
    assert [g.epoch for g in gates[:2]] == [0, 0]
    forge(1)  # while A runs and B waits
    time.sleep(2.5)  # five settle windows
    assert threads[2].is_alive(), out
    assert threads[3].is_alive(), out
    assert gates[2].epoch is None
    assert _admit_all(gates[:2], stores[:2], handlers[:2]) == {0: True, 1: True}  # a restart
    assert [g.epoch for g in gates[:2]] == [1, 1]
    assert threads[2].is_alive(), out
    handlers[0].set_closed()
    for t in threads[2:]:
        t.join(20)
    assert out[2] is False  # the job ended while B waited
    assert out[3] is False


def test_a_restart_with_the_active_segments_back_skips_the_settle_window() -> None:
    """MAX 4, segment A only (B never comes): every node of the last active segment is
    back, which alone lets the restart's election go at once (not MAX nodes present)."""
    server = _store()
    gates = _gates(4, "AABB")[:2]
    stores = [_client(server) for _ in gates]
    first = [_handler(s, last_call=0.5) for s in stores]  # epoch 0 settles quickly
    assert _admit_all(gates, stores, first) == {0: True, 1: True}
    restart = [_handler(s, last_call=30.0) for s in stores]
    started = time.monotonic()
    assert _admit_all(gates, stores, restart) == {0: True, 1: True}
    assert time.monotonic() - started < 10  # well inside the 30 s settle window
    assert [g.epoch for g in gates] == [1, 1]


@pytest.mark.parametrize(
    ("conf", "extra", "warned"),
    [
        ("last_call_timeout=10", [], True),  # < the 15 s --workers-stop-timeout
        ("last_call_timeout=20", [], False),
        ("last_call_timeout=20", ["--ft-node-health-check-cmd=true"], True),  # + 60 s
        ("last_call_timeout=80", ["--ft-node-health-check-cmd=true"], False),
    ],
)
def test_a_settle_window_shorter_than_a_restart_warns_at_start_up(
    conf: str,
    extra: list[str],
    warned: bool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    scripts_here: pathlib.Path,
) -> None:
    import logging

    from nvrx.launcher.cli import _options, get_parser

    monkeypatch.setenv(SEGMENT_ID_ENV, "rack-1")
    parser = get_parser()
    argv = ["--ft-segment=2", "--nnodes=2:4", *_C10D, f"--rdzv-conf={conf}", *extra, "t.py"]
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        _options(parser.parse_args(argv), parser)
    said = [r.getMessage() for r in caplog.records if "settle window" in r.getMessage()]
    assert bool(said) is warned, said
    if warned:
        assert "--workers-stop-timeout 15 s" in said[0]
        assert "can be declared broken" in said[0]


def test_a_node_back_after_its_segment_broke_says_it_came_too_late() -> None:
    server = _store()
    gates = _gates(4, "AABB")
    stores = [_client(server) for _ in gates]
    handlers = [_handler(s, last_call=0.5) for s in stores]
    out: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            out[i] = gates[i].admit(handlers[i], stores[i])
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads[:2]:
        t.join(20)
    assert out == {0: True, 1: True}
    # A restart: node 0 comes back, node 1 is slow; after the settle window A is broken.
    first = _admit_all(gates[:1], stores[:1], handlers[:1])[0]
    assert isinstance(first, SegmentLeave), first
    assert "1 of its 2 nodes did not come back" in first.reason
    for t in threads[2:]:
        t.join(20)
    assert (out[2], out[3]) == (True, True)  # B runs epoch 1
    late = _admit_all(gates[1:2], stores[1:2], handlers[1:2])[0]  # node 1, too late
    assert isinstance(late, SegmentLeave), late
    assert late.segment.name == "A#0"
    assert "this node came back after the settle window" in late.reason
    assert "did not come back" not in late.reason
    assert late.nodes == ["n0", "n1"]


def test_a_fabric_registration_in_progress_is_waited_for_then_refused() -> None:
    one = uuid.uuid4().bytes
    answers = [(2, 0, bytes(16)), (2, 0, bytes(16)), (3, 0, one)]  # (state, status, uuid)
    slept: list[float] = []

    def info(handle: int) -> Any:
        state, status, raw = answers.pop(0) if len(answers) > 1 else answers[0]
        return types.SimpleNamespace(state=state, status=status, clusterUuid=raw)

    nvml = types.SimpleNamespace(
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetGpuFabricInfo=info,
    )
    assert nvml_cluster_uuid(nvml, sleep=slept.append) == str(uuid.UUID(bytes=one))
    assert slept == [1.0, 1.0]  # asked again while registering, not refused at once
    answers[:] = [(2, 0, bytes(16))]
    with pytest.raises(ValueError, match="registration is still in progress after 0 s"):
        nvml_cluster_uuid(nvml, wait_s=0.0, sleep=slept.append)
    answers[:] = [(1, 0, bytes(16))]
    with pytest.raises(ValueError, match="registration has not started"):
        nvml_cluster_uuid(nvml, sleep=slept.append)
    answers[:] = [(3, 7, bytes(16))]
    with pytest.raises(ValueError, match=r"registration failed \(status 7\)"):
        nvml_cluster_uuid(nvml, sleep=slept.append)


def test_a_broken_segments_store_host_serves_while_nodes_use_the_gate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nodes at the gate are outside torch's lists: their use of the gate (here: places
    counted in the current epoch) keeps the store host serving; once nothing changes
    for the idle window it stops."""
    from nvrx.launcher import _cluster_steps

    monkeypatch.setattr(_cluster_steps, "_HOST_IDLE_S", 0.0)
    server = _store()
    gate = _gates(2, "AA")[0]
    store = _client(server)
    handler = dynamic_rendezvous.DynamicRendezvousHandler.from_backend(
        "seg",
        store,
        C10dRendezvousBackend(store, "seg"),
        min_nodes=2,
        max_nodes=2,
        timeout=dynamic_rendezvous.RendezvousTimeout(last_call=datetime.timedelta(seconds=0.5)),
        keep_alive_interval=1,
        keep_alive_max_attempt=1,
    )  # idle window: 1 s keep-alive + 2 x 0.5 s settle
    host = threading.Thread(
        target=_cluster_steps._host_until_the_job_ends, args=(handler, gate, store), daemon=True
    )
    other = _client(server)
    started = time.monotonic()
    host.start()
    while time.monotonic() - started < 5.0:  # a node at the gate, for 5 s
        other.add("nvrx.launcher/segments/seg/0/count", 1)
        time.sleep(0.5)
    assert host.is_alive(), "the host stopped while a node used the gate"
    host.join(15)  # the grace of 3 s after the idle window
    assert not host.is_alive()
