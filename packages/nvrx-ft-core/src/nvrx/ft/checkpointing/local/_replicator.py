"""Sending each snapshot to its holders and receiving peers' snapshots, in the background.

All traffic is point-to-point on the engine's one snapshot group (a dedicated gloo
group; never the training's group, never the rendezvous store). Each (owner, holder)
pair is an ordered stream of messages, so ranks that skip different saves never
mismatch::

    owner -> holder   header  int64[2] = (iteration, nbytes)      (iteration -1: closing)
    holder -> owner   accept  int64[1] = 1 (room made) or 0 (no room: the owner skips)
    owner -> holder   body    the snapshot's bytes after the preamble
    owner -> holder   preamble  the first 4096 bytes, written last by the holder

The holder receives straight into its slot for that owner (zeroed preamble first), so
a transfer cut off midway leaves an invalid slot and the holder's other slot valid.
An owner whose holder does not answer within the timeout stops sending to it (one
warning) instead of blocking its saves.
"""

from __future__ import annotations

import datetime
import logging
import threading

import torch
import torch.distributed as dist

from nvrx.ft.checkpointing.local import _format
from nvrx.ft.checkpointing.local._background import lower_this_thread
from nvrx.ft.checkpointing.local._store import Store

__all__: list[str] = []

_logger = logging.getLogger("nvrx.ft.local_checkpoint")

TAG_HEADER = 11
TAG_BODY = 12
TAG_PREAMBLE = 13
TAG_ACCEPT = 21
_FOREVER = datetime.timedelta(days=3650)


def _isend(t: torch.Tensor, dst: int, *, group: dist.ProcessGroup, tag: int) -> dist.Work:
    work = dist.isend(t, dst, group=group, tag=tag)
    assert work is not None  # this rank is in the group
    return work


def _irecv(t: torch.Tensor, src: int, *, group: dist.ProcessGroup, tag: int) -> dist.Work:
    work = dist.irecv(t, src, group=group, tag=tag)
    assert work is not None
    return work


class Replicator:
    """The owner side (``send``, run on the writer thread) and the holder side (threads)."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        rank: int,
        holders: list[int],
        owners: list[int],
        store: Store,
        timeout_s: float,
    ) -> None:
        self.group = group
        self.rank = rank
        self.holders = list(holders)
        self.owners = list(owners)
        self.store = store
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.broken: set[int] = set()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._warned: set[str] = set()
        self.received = 0
        self.sent = 0

    def _warn(self, kind: str, msg: str, *args: object) -> None:
        if kind in self._warned:
            _logger.debug(msg, *args)
        else:
            self._warned.add(kind)
            _logger.warning(msg + " (warned once)", *args)

    # -- holder side ------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        for owner in self.owners:
            t = threading.Thread(
                target=self._receive_loop,
                args=(owner,),
                name=f"nvrx-local-ckpt-recv-{owner}",
                daemon=True,
            )
            t.start()
            self._threads.append(t)

    def _receive_loop(self, owner: int) -> None:
        lower_this_thread()
        while True:
            header = torch.zeros(2, dtype=torch.int64)
            try:
                # An owner may not save for hours: wait without the group's timeout (a
                # timed-out gloo wait closes the pair for good).
                _irecv(header, owner, group=self.group, tag=TAG_HEADER).wait(_FOREVER)
            except Exception as exc:
                self._warn("recv", "stopped receiving replicas of rank %d: %s", owner, exc)
                return
            iteration, nbytes = int(header[0]), int(header[1])
            if iteration < 0:
                return
            try:
                self._receive_one(owner, iteration, nbytes)
            except Exception as exc:
                self._warn("recv", "stopped receiving replicas of rank %d: %s", owner, exc)
                return

    def _receive_one(self, owner: int, iteration: int, nbytes: int) -> None:
        slot_idx = self.store.write_slot(owner)
        try:
            if nbytes < _format.PREAMBLE_SIZE:
                raise ValueError(f"a snapshot of {nbytes} bytes")
            slot = self.store.open_slot(owner, slot_idx, nbytes)
            accept = 1
        except (OSError, ValueError) as exc:
            self._warn(
                "room", "no room for rank %d's replica of iteration %d: %s", owner, iteration, exc
            )
            accept = 0
        _isend(
            torch.tensor([accept], dtype=torch.int64), owner, group=self.group, tag=TAG_ACCEPT
        ).wait(self.timeout)
        if not accept:
            return
        dst = torch.frombuffer(slot.mm, dtype=torch.uint8)
        body = dst[_format.PREAMBLE_SIZE : nbytes]
        _irecv(body, owner, group=self.group, tag=TAG_BODY).wait(self.timeout)
        raw = bytearray(_format.PREAMBLE_SIZE)  # no numpy: torch may be installed without it
        pre = torch.frombuffer(raw, dtype=torch.uint8)
        _irecv(pre, owner, group=self.group, tag=TAG_PREAMBLE).wait(self.timeout)
        parsed = _format.parse_preamble(bytes(raw))
        if parsed.owner != owner or parsed.iteration != iteration or parsed.total_len != nbytes:
            raise ValueError("the replica's preamble is not the one announced")
        dst[: _format.PREAMBLE_SIZE].copy_(pre)
        self.store.committed(owner, slot_idx, iteration)
        self.received += 1

    # -- owner side ---------------------------------------------------------------------------
    def send(self, view: memoryview, iteration: int) -> None:
        """Send one committed snapshot to every holder (on the writer thread)."""
        body = torch.frombuffer(view, dtype=torch.uint8, count=len(view))
        for holder in self.holders:
            if holder in self.broken:
                continue
            try:
                self._send_one(holder, body, iteration)
            except Exception as exc:
                self.broken.add(holder)
                self._warn(
                    f"send{holder}",
                    "stopped replicating to rank %d (it did not take iteration %d: %s)",
                    holder,
                    iteration,
                    exc,
                )

    def _send_one(self, holder: int, body: torch.Tensor, iteration: int) -> None:
        header = torch.tensor([iteration, body.numel()], dtype=torch.int64)
        _isend(header, holder, group=self.group, tag=TAG_HEADER).wait(self.timeout)
        accept = torch.zeros(1, dtype=torch.int64)
        _irecv(accept, holder, group=self.group, tag=TAG_ACCEPT).wait(self.timeout)
        if int(accept.item()) != 1:
            return
        _isend(body[_format.PREAMBLE_SIZE :], holder, group=self.group, tag=TAG_BODY).wait(
            self.timeout
        )
        _isend(
            body[: _format.PREAMBLE_SIZE].clone(), holder, group=self.group, tag=TAG_PREAMBLE
        ).wait(self.timeout)
        self.sent += 1

    def close(self, timeout: float = 10.0) -> None:
        """Tell every holder this owner is done; let the receiving threads end."""
        end = torch.tensor([-1, 0], dtype=torch.int64)
        for holder in self.holders:
            if holder in self.broken:
                continue
            try:
                _isend(end, holder, group=self.group, tag=TAG_HEADER).wait(
                    datetime.timedelta(seconds=timeout)
                )
            except Exception as exc:
                _logger.debug("could not tell rank %d we are closing: %s", holder, exc)
        for t in self._threads:
            t.join(timeout)
