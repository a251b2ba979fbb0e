"""The engine behind both APIs: save (copy now, finish in the background), restore.

Nothing here raises into a training loop: a save that cannot be made is skipped with
one warning per kind of reason; a restore that cannot agree or load falls back to the
global checkpoint on every rank together (one ``all_reduce(MIN)`` confirms).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import logging
import math
import mmap
import os
import pathlib
import socket
import threading
import time
import zlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from nvrx.ft.checkpointing.local import _agreement, _format, _placement, _plan, _tree
from nvrx.ft.checkpointing.local._contract import (
    LocalCkptSettings,
    RestoreRecord,
    RestoreSource,
    write_restore_record,
)
from nvrx.ft.checkpointing.local._crc import crc32
from nvrx.ft.checkpointing.local._replicator import Replicator
from nvrx.ft.checkpointing.local._store import Held, NoSpace, Store
from nvrx.ft.checkpointing.local._writer import Writer

__all__: list[str] = []

_logger = logging.getLogger("nvrx.ft.local_checkpoint")

COMM_TIMEOUT_S = 300.0
"""Timeout of the snapshot group's collectives and of one replica transfer."""
_RESTORE_TAG = 41


class _TensorsChanged(RuntimeError):
    """A saved tensor's metadata no longer matched the plan the save used (its own
    kind: the writer warns once per kind)."""


@dataclasses.dataclass(frozen=True)
class Restored:
    """What the engine restored (the API turns it into its RestoreResult)."""

    source: RestoreSource
    iteration: int | None
    state: dict[str, Any] | None
    seconds: float
    snapshot_wall: float | None = None


@dataclasses.dataclass
class _Valid:
    owner: int
    iteration: int
    nbytes: int
    view: memoryview
    manifest: _format.Manifest


@dataclasses.dataclass
class _Layout:
    """Where a state's tensors go in a slot, kept while their dtypes, shapes and devices
    stay the same (a training state's do), so a save computes nothing but the copy.

    ``views[slot]`` are typed tensors over that slot's mapping, one per CPU tensor with
    bytes, shaped like it: one ``copy_`` per tensor, strided sources included.
    """

    key: list[_tree.TensorKey]
    entries: list[_format.TensorEntry]
    data_end: int
    frame: list[str]  # the entries' JSON around their CRCs (_format.entries_frame)
    parts_len: int  # their most bytes with CRCs
    spans: list[slice]  # every entry's bytes in the snapshot, for the CRCs
    cpu: list[int]  # indices of the CPU tensors with bytes
    cuda: list[tuple[int, int]]  # (offset, nbytes) of the other tensors with bytes
    all_cpu: bool  # every tensor is in ``cpu``, in order
    views: dict[int, tuple[mmap.mmap, list[torch.Tensor]]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, key: list[_tree.TensorKey]) -> _Layout:
        entries = []
        pos = _format.PREAMBLE_SIZE
        for dtype, shape, device in key:
            nbytes = math.prod(shape) * dtype.itemsize
            entries.append(
                _format.TensorEntry(_format.dtype_name(dtype), tuple(shape), pos, nbytes, 0, device)
            )
            pos = _format.align(pos + nbytes)
        parts = [_format.entry_parts(e) for e in entries]
        cpu = [i for i, e in enumerate(entries) if e.nbytes and e.device == "cpu"]
        return cls(
            key=key,
            entries=entries,
            data_end=pos,
            frame=_format.entries_frame(parts),
            parts_len=_format.parts_bound(parts),
            spans=[slice(e.offset, e.offset + e.nbytes) for e in entries],
            cpu=cpu,
            cuda=[(e.offset, e.nbytes) for e in entries if e.nbytes and e.device != "cpu"],
            all_cpu=len(cpu) == len(entries),
        )

    def views_in(self, slot_idx: int, mm: mmap.mmap) -> list[torch.Tensor]:
        """The destination tensors of the CPU tensors in this slot's mapping."""
        have = self.views.get(slot_idx)
        if have is not None and have[0] is mm:
            return have[1]
        raw = torch.frombuffer(mm, dtype=torch.uint8)
        out = []
        for i in self.cpu:
            e = self.entries[i]
            dtype, shape, _device = self.key[i]
            out.append(raw[e.offset : e.offset + e.nbytes].view(dtype).view(shape))
        self.views[slot_idx] = (mm, out)
        return out


def _node_key() -> int:
    raw = os.environ.get("GROUP_RANK")
    if raw is not None and raw.strip().isdigit():
        return int(raw)
    return 1 << 40 | zlib.crc32(socket.gethostname().encode())


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    src = t.detach()
    if src.is_conj():
        src = src.resolve_conj()
    if src.is_neg():
        src = src.resolve_neg()
    return src.contiguous().reshape(-1).view(torch.uint8)


class Engine:
    """Saves and restores one rank's snapshots in its node directory."""

    def __init__(
        self,
        settings: LocalCkptSettings,
        group: dist.ProcessGroup | None,
        *,
        rank_dir: pathlib.Path | None = None,
    ) -> None:
        self.settings = settings
        self.job = settings.job_id
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else int(os.environ.get("RANK", "0") or 0)
        self.world_size = dist.get_world_size() if distributed else 1
        self.group: dist.ProcessGroup | None = None
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        if distributed and self.world_size > 1:
            self.group = group or dist.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=COMM_TIMEOUT_S)
            )
            keys = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
            dist.all_gather(keys, torch.tensor([_node_key()], dtype=torch.int64), group=self.group)
            self.node_of_rank = [int(k.item()) for k in keys]
        else:
            if not distributed and (os.environ.get("WORLD_SIZE") or "1").strip() not in ("", "1"):
                self._warn(
                    "no-dist",
                    "local checkpoints were set up before torch.distributed.init_process_group:"
                    " each rank saves and restores alone, with no agreement and no replicas",
                )
            self.node_of_rank = [0]
            self.rank = 0
        wanted = settings.replicas
        self.replicas = _placement.effective_replicas(self.node_of_rank, wanted)
        if self.replicas < wanted and len(set(self.node_of_rank)) == 1:
            _logger.info("one node: local checkpoints are kept without replicas")
        elif self.replicas < wanted:
            self._warn(
                "replicas",
                "%d replica(s) asked, only %d other node(s): keeping %d",
                wanted,
                len(set(self.node_of_rank)) - 1,
                self.replicas,
            )
        self.holders = _placement.replica_holders(self.rank, self.node_of_rank, self.replicas)
        self.owners_held = _placement.owners_held_by(self.rank, self.node_of_rank, self.replicas)
        # Offers: own two slots plus two per owner held; stale holdings may add more.
        most = max(
            len(_placement.owners_held_by(r, self.node_of_rank, self.replicas))
            for r in range(len(self.node_of_rank))
        )
        self.offer_slots = 2 * (1 + max(most, self.replicas))
        self.store = Store(
            rank_dir or settings.local_rank_dir(self.local_rank),
            settings.node_dir,
            settings.max_share,
        )
        self.writer = Writer()
        self.replicator: Replicator | None = None
        self._staging: torch.Tensor | None = None
        self._layout: _Layout | None = None
        self._plan: _plan.Plan | None = None  # of the last state, for the next save
        self._plan_misses = 0
        self._head_prefix = _format.head_prefix(
            job=self.job, owner=self.rank, world_size=self.world_size
        )
        self._stream: Any = None
        self._closed = False
        self.last_saved: int | None = None
        self.last_committed: int | None = None
        self.saves = 0
        self.skipped = 0
        if self.group is not None and (self.owners_held or self.holders):
            self._replicator().start()

    # -- warnings -----------------------------------------------------------------------
    def _warn(self, kind: str, msg: str, *args: object) -> None:
        if kind in self._warned:
            _logger.debug(msg, *args)
            return
        self._warned.add(kind)
        _logger.warning(msg + " (warned once)", *args)

    # -- save -----------------------------------------------------------------------------
    def save(self, iteration: int, state: Mapping[str, Any]) -> bool:
        """Copy ``state`` now; finish and replicate in the background. Never raises."""
        try:
            return self._save(iteration, state)
        except Exception as exc:
            self.skipped += 1
            self._warn(
                "save-error", "local checkpoint save of iteration %s skipped: %s", iteration, exc
            )
            return False

    def _save(self, iteration: int, state: Mapping[str, Any]) -> bool:
        if self._closed:
            self._warn("closed", "local checkpoints are closed; save of %s skipped", iteration)
            return False
        if type(iteration) is not int or iteration < 0:
            raise ValueError(f"iteration {iteration!r} is not a whole number >= 0")
        if self.writer.busy():
            self.skipped += 1
            self._warn(
                "busy",
                "the previous local checkpoint is still being written or replicated; "
                "save of iteration %d skipped",
                iteration,
            )
            return False
        tensors, tree_json, lay, unchecked = self._walk(state)
        wall = time.time()  # wall clock: label
        head = _format.manifest_head(self._head_prefix, iteration, wall)
        bound = _format.manifest_bound(head, tree_json, lay.parts_len)
        slot_idx = self.store.write_slot(self.rank)
        try:
            slot = self.store.open_slot(self.rank, slot_idx, lay.data_end + bound)
        except NoSpace as exc:
            self.skipped += 1
            self._warn("space", "local checkpoint of iteration %d skipped: %s", iteration, exc)
            return False
        except OSError as exc:
            self.skipped += 1
            self._warn("oserror", "local checkpoint of iteration %d skipped: %s", iteration, exc)
            return False
        try:
            event = self._copy(tensors, lay, slot_idx, slot.mm)
        except Exception:
            if unchecked is None:
                raise
            # A tensor no longer fits the last save's plan (its size, type or device
            # changed): walk the state in full and copy again, into the same slot.
            self._drop_plan(unchecked)
            return self._save(iteration, state)
        self.writer.submit(
            lambda: self._finish(
                slot_idx, iteration, head, tree_json, lay, event, unchecked, tensors
            )
        )
        self.last_saved = iteration
        self.saves += 1
        return True

    def _copy(self, tensors: list[torch.Tensor], lay: _Layout, slot_idx: int, mm: mmap.mmap) -> Any:
        """Copy the CPU tensors into the slot now, start the device ones; their event."""
        if lay.cpu:
            srcs = tensors if lay.all_cpu else [tensors[i] for i in lay.cpu]
            with torch.no_grad():
                torch._foreach_copy_(lay.views_in(slot_idx, mm), srcs)
        if lay.cuda:
            return self._copy_from_devices(tensors, lay.entries, lay.data_end)
        return None

    def _walk(
        self, state: Mapping[str, Any]
    ) -> tuple[list[torch.Tensor], str, _Layout, _plan.Plan | None]:
        """The state's tensors, its tree's JSON, their layout, and the plan whose
        tensor metadata check is still to come (None after a full walk).

        With a plan of the last state, only the structure and the tensors' dtypes
        are checked here: reading every tensor's shape, device and layout too costs
        about 0.6 us a tensor on a freshly made state dict (0.7 ms for an AdamW state
        of 1200 tensors), so the writer thread checks them after the copy
        (:meth:`_finish`). A tensor whose shape no longer fits its place makes the
        copy raise, and this save walks in full; one that still broadcasts into it
        (a smaller shape), or one on another device, has its snapshot dropped there
        and the next save walks in full. Without a plan the state is walked in full
        (TypeError on what cannot be kept) and planned for the next save.

        A state whose structure keeps changing is planned again after 1, 2, 4, 8...
        misses, so that making plans that never match costs it next to nothing."""
        plan, lay = self._plan, self._layout
        if plan is not None and lay is not None:
            got = plan.match(state)
            if got is not None:
                return got[0], got[1], lay, plan
            self._plan = None
        tree, tensors, key = _tree.flatten_for_save(state)
        if lay is None or lay.key != key:
            lay = self._layout = _Layout.of(key)
        tree_json = _format.encode_tree(tree)
        self._plan_misses += 1
        if not self._plan_misses & (self._plan_misses - 1):
            self._plan = _plan.Plan.of(state, tensors, tree_json)
        return tensors, tree_json, lay, None

    def _drop_plan(self, plan: _plan.Plan) -> None:
        """The next save walks the state in full (``plan`` no longer fits it)."""
        if self._plan is plan:
            self._plan = None

    def _copy_from_devices(
        self, tensors: list[torch.Tensor], entries: list[_format.TensorEntry], size: int
    ) -> Any:
        """Async D2H of every device tensor into the pinned staging buffer; its event."""
        if self._staging is None or self._staging.numel() < size:
            self._staging = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        if self._stream is None:
            self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for t, e in zip(tensors, entries, strict=True):
                if t.device.type == "cpu" or e.nbytes == 0:
                    continue
                t.record_stream(stream)
                self._staging[e.offset : e.offset + e.nbytes].copy_(
                    _flat_bytes(t), non_blocking=True
                )
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
        # The snapshot must not see the next step's in-place updates: the training
        # stream waits (on the GPU, the CPU goes on) until the copy is done.
        torch.cuda.current_stream().wait_event(event)
        return event

    def _finish(
        self,
        slot_idx: int,
        iteration: int,
        head: str,
        tree_json: str,
        lay: _Layout,
        event: Any,
        unchecked: _plan.Plan | None,
        tensors: list[torch.Tensor],
    ) -> None:
        """On the writer thread: the tensors' metadata against the plan (when the save
        used one), checksums, manifest, preamble (last), replication."""
        if unchecked is not None:
            if not unchecked.same_tensor_meta(tensors):
                self._drop_plan(unchecked)
                raise _TensorsChanged(
                    f"the snapshot of iteration {iteration} is dropped: a tensor of the state"
                    " changed its size, type or device since the last save (the next save"
                    " walks the state again)"
                )
            self._plan_misses = 0
        del tensors  # not kept alive by this job any longer than the check
        slot = self.store.mapped(self.rank, slot_idx)
        assert slot is not None
        view = slot.view()
        if event is not None:
            event.synchronize()
            assert self._staging is not None
            dst = torch.frombuffer(slot.mm, dtype=torch.uint8)
            for off, n in lay.cuda:
                dst[off : off + n].copy_(self._staging[off : off + n])
        # One CRC32 per tensor, looped in C: between two checksums (each releases the
        # GIL over more than 5 KiB) this thread holds the GIL for a slice, not for
        # Python bytecode.
        crcs = list(map(crc32, map(view.__getitem__, lay.spans)))
        manifest = _format.join_manifest(head, tree_json, lay.frame, crcs)
        data_end = lay.data_end
        total = data_end + len(manifest)
        if total > slot.size:
            raise RuntimeError("manifest outgrew its reserved room")  # never: bound is an upper one
        view[data_end:total] = manifest
        pre = _format.Preamble(
            iteration=iteration,
            owner=self.rank,
            world_size=self.world_size,
            data_len=data_end - _format.PREAMBLE_SIZE,
            manifest_off=data_end,
            manifest_len=len(manifest),
            manifest_crc=crc32(manifest),
            total_len=total,
        )
        view[: _format.PREAMBLE_SIZE] = _format.encode_preamble(pre)
        self.store.committed(self.rank, slot_idx, iteration)
        self.last_committed = iteration
        if self.holders:
            self._replicator().send(view[:total], iteration)

    def _replicator(self) -> Replicator:
        if self.replicator is None:
            assert self.group is not None
            self.replicator = Replicator(
                self.group,
                self.rank,
                self.holders,
                self.owners_held,
                self.store,
                COMM_TIMEOUT_S,
            )
        return self.replicator

    def wait(self, timeout: float | None = None) -> bool:
        return self.writer.wait(timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.writer.wait(COMM_TIMEOUT_S)
        self.writer.close(5.0)
        if self.replicator is not None:
            self.replicator.close()
        self._layout = None  # its views pin the slots' mappings
        self._plan = None
        self.store.close()

    # -- restore ----------------------------------------------------------------------------
    def restore(self, template: Mapping[str, Any] | None, global_iteration: int | None) -> Restored:
        """Agree with every rank, fetch what is missing, load. Collective; never raises."""
        t0 = time.monotonic()
        plan, valid = self.agree(global_iteration)
        if plan is None or plan.iteration is None:
            return self._fallback(plan, global_iteration, t0)
        state, source, wall = self.load_agreed(plan, valid, template)
        if state is None:
            return self._fallback(plan, global_iteration, t0)
        out = Restored(source, plan.iteration, state, time.monotonic() - t0, wall)
        self.record(out)
        return out

    def agree(self, global_iteration: int | None) -> tuple[_agreement.Plan | None, list[_Valid]]:
        """The plan every rank computes from one all_gather (None when it failed)."""
        valid = self._verified_holdings()
        offers = sorted(
            ((v.owner, v.iteration, v.nbytes) for v in valid),
            key=lambda o: (o[0] != self.rank, -o[1], o[0]),
        )
        block = _agreement.encode(offers, global_iteration, self.offer_slots)
        try:
            table = self._gather(block)
        except Exception as exc:
            self._warn("agree", "local checkpoint agreement failed (%s); using the global one", exc)
            return None, valid
        return _agreement.choose(table, self.world_size), valid

    def load_agreed(
        self,
        plan: _agreement.Plan,
        valid: list[_Valid],
        template: Mapping[str, Any] | None,
    ) -> tuple[dict[str, Any] | None, RestoreSource, float | None]:
        """Fetch and load the agreed snapshot; state None on every rank if any rank failed."""
        state: dict[str, Any] | None = None
        source = RestoreSource.OWN
        wall: float | None = None
        try:
            buf = self._exchange(plan, valid)
            if buf is None:
                raise RuntimeError("the snapshot never arrived")
            if plan.source_of[self.rank] != self.rank:
                source = RestoreSource.PEER
            _pre, man = _format.parse(
                buf,
                job=self.job,
                world_size=self.world_size,
                verify_tensors=source is RestoreSource.PEER,
            )
            if man.owner != self.rank or man.iteration != plan.iteration:
                raise _format.SnapshotError("the snapshot is not the one agreed")
            state = self._load(buf, man, template)
            wall = man.wall
            ok = 1
        except Exception as exc:
            self._warn("load", "could not load the agreed local checkpoint: %s", exc)
            ok = 0
        try:
            ok = self._all_min(ok)
        except Exception as exc:
            self._warn("confirm", "local checkpoint confirmation failed: %s", exc)
            ok = 0
        return (state if ok else None), source, wall

    def all_ok(self, ok: bool) -> bool:
        """True on every rank iff ``ok`` on every rank (one all_reduce on the group)."""
        return bool(self._all_min(1 if ok else 0))

    def _fallback(
        self, plan: _agreement.Plan | None, global_iteration: int | None, t0: float
    ) -> Restored:
        g = plan.global_iteration if plan is not None else global_iteration
        source = RestoreSource.GLOBAL if g is not None else RestoreSource.NONE
        out = Restored(source, g, None, time.monotonic() - t0)
        self.record(out)
        return out

    def record(self, out: Restored) -> None:
        """Write this rank's restore record where the launcher reads it; never raises.

        Under ft_launcher that is the launcher's node directory (its environment), even
        when a caller gave the manager another root; otherwise this engine's directory.
        """
        try:
            launcher = LocalCkptSettings.from_env()
            node_dir = launcher.node_dir if launcher is not None else self.settings.node_dir
            count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
            write_restore_record(
                node_dir,
                RestoreRecord(
                    restart_count=count,
                    rank=self.rank,
                    local_rank=self.local_rank,
                    source=out.source,
                    iteration=out.iteration,
                    snapshot_wall=out.snapshot_wall,
                    restore_s=out.seconds,
                    wall=time.time(),  # wall clock: label
                ),
            )
        except Exception as exc:
            self._warn("record", "could not write the restore record: %s", exc)

    def _verified_holdings(self) -> list[_Valid]:
        """Every held snapshot that checks out completely; checked in parallel threads
        (the CRC32 releases the GIL), a bad one is one warning."""
        held: list[Held] = [h for h in self.store.held() if 0 <= h.owner < self.world_size]

        def check(h: Held) -> _Valid | None:
            try:
                view = self.store.read_view(h)
                _pre, man = _format.parse(view, job=self.job, world_size=self.world_size)
            except (OSError, ValueError) as exc:
                _logger.warning("skipping local checkpoint %s: %s", h.path, exc)
                return None
            return _Valid(h.owner, h.iteration, h.total_len, view, man)

        if len(held) <= 1:
            found = [check(h) for h in held]
        else:
            workers = max(1, min(len(held), os.cpu_count() or 1, 8))
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                found = list(pool.map(check, held))
        return [v for v in found if v is not None]

    def _gather(self, block: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return block.unsqueeze(0)
        parts = [torch.empty_like(block) for _ in range(self.world_size)]
        dist.all_gather(parts, block, group=self.group)
        return torch.stack(parts)

    def _all_min(self, ok: int) -> int:
        if self.group is None:
            return ok
        t = torch.tensor([ok], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def _exchange(self, plan: _agreement.Plan, valid: list[_Valid]) -> memoryview | None:
        """Send the snapshots this rank supplies; return this rank's own (local or received)."""
        assert plan.iteration is not None
        mine = {(v.owner, v.iteration): v for v in valid}
        works = []
        recv_buf: torch.Tensor | None = None
        recv_raw = bytearray()
        for owner, src in enumerate(plan.source_of):
            if src == owner:
                continue
            if src == self.rank:
                v = mine[(owner, plan.iteration)]
                body = torch.frombuffer(v.view, dtype=torch.uint8, count=v.nbytes)
                works.append(dist.isend(body, owner, group=self.group, tag=_RESTORE_TAG))
            elif owner == self.rank:
                recv_raw = bytearray(plan.nbytes_of[owner])
                recv_buf = torch.frombuffer(recv_raw, dtype=torch.uint8)
                works.append(dist.irecv(recv_buf, src, group=self.group, tag=_RESTORE_TAG))
        for w in works:
            assert w is not None
            w.wait()
        if recv_buf is not None:
            return memoryview(recv_raw)
        own = mine.get((self.rank, plan.iteration))
        return None if own is None else own.view

    def _load(
        self, buf: memoryview, man: _format.Manifest, template: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        placed = _tree.tensor_paths(template) if template is not None else {}
        cuda_ok = torch.cuda.is_available()

        def tensor_at(index: int, path: str) -> torch.Tensor:
            entry = man.tensors[index]
            view = _format.tensor_view(buf, entry)
            like = placed.get(path)
            if like is not None:
                device = like.device
            elif entry.device == "cuda" and cuda_ok:
                device = torch.device("cuda", torch.cuda.current_device())
            else:
                device = torch.device("cpu")
            if device.type == "cpu":
                return view.clone()
            return view.to(device, copy=True)

        state = _tree.unflatten(man.tree, tensor_at)
        if not isinstance(state, dict):
            raise _format.SnapshotError("the snapshot's root is not a dict")
        return state


def warn_disabled_once(_warned: list[bool] = [False]) -> None:  # noqa: B006
    """One warning per process that local checkpoints are off."""
    if not _warned[0]:
        _warned[0] = True
        _logger.warning(
            "local checkpoints are off (no NVRX_LOCAL_CKPT_DIR from ft_launcher and no "
            "settings given): saves do nothing, restore says GLOBAL/NONE"
        )
