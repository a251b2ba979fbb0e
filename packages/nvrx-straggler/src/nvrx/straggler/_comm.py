"""The few collectives straggler reports need, on the backend's own device.

Everything goes through :class:`Comm` so a report's collectives are countable and
use one process group. Tensors live on CUDA only for an NCCL group; a gloo group
never touches CUDA. Names travel as JSON bytes (never pickle). With no initialised
process group, or a world of one, every call is local and free.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Comm"]


class Comm:
    """Collectives over one process group (``None``: the default group)."""

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.calls = 0
        """Collectives issued so far (for tests and diagnostics)."""

    @property
    def distributed(self) -> bool:
        """True when a process group with more than one rank is in use."""
        return dist.is_available() and dist.is_initialized() and self.world_size() > 1

    def world_size(self) -> int:
        """Ranks in the group; 1 without torch.distributed."""
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return int(dist.get_world_size(self.group))

    def rank(self) -> int:
        """This process's rank in the group; 0 without torch.distributed."""
        if not (dist.is_available() and dist.is_initialized()):
            return 0
        return int(dist.get_rank(self.group))

    def device(self) -> torch.device:
        """Where collective tensors must live: CUDA for NCCL, CPU otherwise."""
        if self.distributed and str(dist.get_backend(self.group)).lower() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def all_reduce_min(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise minimum over ranks (float64 on the host afterwards)."""
        if not self.distributed:
            return values
        t = values.to(self.device())
        self.calls += 1
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return t.cpu()

    def gather_rows(self, row: torch.Tensor) -> torch.Tensor | None:
        """Stack every rank's equally long row on rank 0; other ranks get None."""
        if not self.distributed:
            return row.unsqueeze(0)
        device = self.device()
        t = row.to(device)
        world = self.world_size()
        rank = self.rank()
        dst = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        bufs = [torch.empty_like(t) for _ in range(world)] if rank == 0 else None
        self.calls += 1
        dist.gather(t, gather_list=bufs, dst=dst, group=self.group)
        if bufs is None:
            return None
        return torch.stack(bufs).cpu()

    def all_gather_json(self, obj: object) -> list[Any]:
        """Every rank's JSON-serialisable value, in rank order (two collectives)."""
        if not self.distributed:
            return [obj]
        device = self.device()
        data = json.dumps(obj, separators=(",", ":")).encode()
        world = self.world_size()
        size = torch.tensor([len(data)], dtype=torch.int64, device=device)
        sizes = [torch.empty_like(size) for _ in range(world)]
        self.calls += 1
        dist.all_gather(sizes, size, group=self.group)
        lengths = [int(s.item()) for s in sizes]
        longest = max(lengths)
        payload = torch.zeros(longest, dtype=torch.uint8, device=device)
        if data:
            payload[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        bufs = [torch.empty_like(payload) for _ in range(world)]
        self.calls += 1
        dist.all_gather(bufs, payload, group=self.group)
        return [
            json.loads(bytes(b[:n].cpu().tolist()).decode())
            for b, n in zip(bufs, lengths, strict=True)
        ]
