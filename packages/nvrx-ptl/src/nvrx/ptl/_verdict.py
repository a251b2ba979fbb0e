"""Share a straggler report's outcome with every rank: the verdict and rank 0's scores.

Only rank 0 holds the job's report (``gather_on_rank0``), but every rank must stop
together and log the same values: EarlyStopping and ModelCheckpoint read
``trainer.callback_metrics`` on every rank, and ranks that disagree deadlock in the
checkpoint's collectives. Two sum-reductions through the strategy (so on the
strategy's device and process group, gloo or NCCL) carry it: first
``[number of ranks that found a straggler, length of rank 0's payload]``, then the
payload, rank 0's score summary as JSON bytes (other ranks add zeros). No pickle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ._compat import Trainer

__all__ = ["MAX_PAYLOAD_BYTES", "Verdict", "decode_scores", "encode_scores", "share_verdict"]

#: Largest score summary shared (a summary is 3 numbers per score kind and section).
MAX_PAYLOAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Verdict:
    """What every rank knows after a report: stop or not, and the scores to log."""

    found: bool
    scores: dict[str, float] = field(default_factory=dict)


def encode_scores(scores: Mapping[str, float]) -> bytes:
    """Rank 0's summary as JSON bytes; empty when there is none or it is too large."""
    finite = {str(k): float(v) for k, v in scores.items() if math.isfinite(v)}
    if not finite:
        return b""
    payload = json.dumps(finite, sort_keys=True, allow_nan=False).encode()
    return payload if len(payload) <= MAX_PAYLOAD_BYTES else b""


def decode_scores(payload: bytes) -> dict[str, float]:
    """The summary from :func:`encode_scores`; an empty dict if it is not one."""
    if not payload or len(payload) > MAX_PAYLOAD_BYTES:
        return {}
    try:
        data = json.loads(payload.decode())
    except (ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        k: float(v)
        for k, v in data.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def share_verdict(trainer: Trainer, found: bool, scores: Mapping[str, float]) -> Verdict:
    """Combine every rank's ``found`` and hand rank 0's ``scores`` to all (a collective).

    Every rank must call it at the same report. ``found`` is true on every rank if
    it was true on any; ``scores`` are rank 0's on every rank.
    """
    if trainer.world_size <= 1:
        return Verdict(found, {k: v for k, v in scores.items() if math.isfinite(v)})
    strategy = trainer.strategy
    device = strategy.root_device
    payload = encode_scores(scores) if trainer.is_global_zero else b""
    head = torch.tensor([int(found), len(payload)], dtype=torch.int64, device=device)
    head = strategy.reduce(head, reduce_op="sum")
    any_found = int(head[0].item()) > 0
    length = int(head[1].item())
    if not 0 < length <= MAX_PAYLOAD_BYTES:
        return Verdict(any_found)
    body = torch.zeros(length, dtype=torch.int32, device=device)
    if payload:
        body.copy_(torch.tensor(list(payload), dtype=torch.int32))
    body = strategy.reduce(body, reduce_op="sum")
    values = body.cpu().tolist()
    if any(not 0 <= b <= 255 for b in values):  # a rank added something other than zeros
        return Verdict(any_found)
    return Verdict(any_found, decode_scores(bytes(values)))
