"""NVRx's ``AsyncRequest`` and ``AsyncCallsQueue``, run on a thread (nothing pickled).

A request's ``async_fn`` runs on a background thread of this process; its finalize
functions run on the caller's thread in ``maybe_finalize_async_calls``, once every rank
has finished the call (one all-reduce per check unless ``no_dist``). NVRx forks or
feeds a persistent worker pickled requests, so local-checkpoint requests needed
``persistent=False`` there; here ``persistent`` is accepted and changes nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

__all__ = ["AsyncCallsQueue", "AsyncRequest"]

_logger = logging.getLogger("nvrx.ft.local_checkpoint")


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _reduce_device() -> torch.device:
    backend = str(dist.get_backend())
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce_int(value: int, op: Any) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=_reduce_device())
    dist.all_reduce(t, op=op)
    return int(t.item())


class AsyncRequest(NamedTuple):
    """Work to run in the background, then finalize functions to run on every rank."""

    async_fn: Callable[..., Any] | None
    async_fn_args: tuple[Any, ...]
    finalize_fns: list[Callable[[], Any]]
    async_fn_kwargs: dict[str, Any] = {}  # noqa: RUF012 (NVRx's default; never mutated)
    preload_fn: Callable[[], Any] | None = None
    is_frozen: bool = False
    call_idx: int = 0

    def add_finalize_fn(self, fn: Callable[[], Any]) -> None:
        """Append a finalize function (not allowed once frozen)."""
        if self.is_frozen:
            raise RuntimeError("cannot add finalize functions to a frozen AsyncRequest")
        self.finalize_fns.append(fn)

    def execute_sync(self) -> None:
        """Run the work now, then a barrier, then the finalize functions."""
        if self.async_fn is not None:
            self.async_fn(*self.async_fn_args, **self.async_fn_kwargs)
        if _dist_on():
            dist.barrier()
        for fn in self.finalize_fns:
            fn()

    def freeze(self) -> AsyncRequest:
        """A copy that refuses new finalize functions."""
        return self._replace(is_frozen=True, finalize_fns=list(self.finalize_fns))

    def execute_finalize_fns(self, validate_matching_call_idx: bool = True) -> int:
        """Run the finalize functions; with validation, every rank must be at this call."""
        if validate_matching_call_idx and _dist_on():
            lo = _all_reduce_int(self.call_idx, dist.ReduceOp.MIN)
            hi = _all_reduce_int(self.call_idx, dist.ReduceOp.MAX)
            assert lo == hi == self.call_idx, f"ranks finalize different calls ({lo}..{hi})"
        for fn in self.finalize_fns:
            fn()
        return self.call_idx


class _Call:
    def __init__(self, request: AsyncRequest) -> None:
        self.request = request
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="nvrx-async-call", daemon=True)

    def _run(self) -> None:
        req = self.request
        try:
            if req.preload_fn is not None:
                req.preload_fn()
            if req.async_fn is not None:
                req.async_fn(*req.async_fn_args, **req.async_fn_kwargs)
        except BaseException as exc:
            self.error = exc
            _logger.warning("an async checkpoint call failed: %s", exc)


class AsyncCallsQueue:
    """Schedules AsyncRequests on background threads and finalizes them in order."""

    def __init__(self, persistent: bool = True, **_ignored: Any) -> None:
        self.persistent = persistent
        self._calls: list[_Call] = []
        self._next_idx = 0

    def schedule_async_request(self, async_request: AsyncRequest) -> int:
        """Start the request's work in the background; return its call index."""
        idx = self._next_idx
        self._next_idx += 1
        call = _Call(async_request._replace(call_idx=idx, is_frozen=True))
        self._calls.append(call)
        call.thread.start()
        return idx

    def maybe_finalize_async_calls(
        self, blocking: bool = False, no_dist: bool = False
    ) -> list[int]:
        """Finalize the calls every rank has finished (all of them with ``blocking``).

        Returns the finalized call indices. A call whose work raised is finalized too
        (its finalize functions see the outcome, as NVRx's do).
        """
        done: list[int] = []
        while self._calls:
            call = self._calls[0]
            if blocking:
                call.thread.join()
            finished = not call.thread.is_alive()
            if not no_dist and _dist_on():
                finished = bool(_all_reduce_int(1 if finished else 0, dist.ReduceOp.MIN))
            if not finished:
                break
            if blocking and call.thread.is_alive():
                call.thread.join()
            self._calls.pop(0)
            done.append(call.request.execute_finalize_fns(validate_matching_call_idx=not no_dist))
        return done

    def get_num_unfinalized_calls(self) -> int:
        """Calls scheduled and not yet finalized."""
        return len(self._calls)

    def close(self, abort: bool = False) -> None:
        """Finalize what is left (blocking) unless ``abort``."""
        if not abort:
            self.maybe_finalize_async_calls(blocking=True)
        self._calls.clear()
