"""The restart cycle, restart count and goodput so far, for Lightning's loggers.

ft_launcher writes a cycle-info file per restart cycle and names it in
``NVRX_CURRENT_CYCLE_INFO`` (see :func:`nvrx.ft.read_cycle_info`). A rank lives for one
cycle, so the callbacks read it once, at ``on_train_start``, and log it as metrics
beside the loss: into ``trainer.callback_metrics`` on every rank and to the loggers from
rank 0. Nothing is read or logged when the variable is unset; the training loop never
pays for it.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from nvrx.ft import CYCLE_INFO_ENV, read_cycle_info

__all__ = [
    "CYCLE_METRICS",
    "METRIC_CYCLE",
    "METRIC_ETTR",
    "METRIC_PRODUCTIVE_S",
    "METRIC_RESTART_COUNT",
    "METRIC_WALL_S",
    "RESTART_COUNT_ENV",
    "cycle_metrics",
    "report_cycle_metrics",
    "trainer_and_module",
]

METRIC_CYCLE = "nvrx/cycle"
METRIC_RESTART_COUNT = "nvrx/restart_count"
METRIC_ETTR = "nvrx/goodput/ettr"
METRIC_PRODUCTIVE_S = "nvrx/goodput/productive_s"
METRIC_WALL_S = "nvrx/goodput/wall_s"
#: Every metric name, in the order they are logged.
CYCLE_METRICS = (
    METRIC_CYCLE,
    METRIC_RESTART_COUNT,
    METRIC_ETTR,
    METRIC_PRODUCTIVE_S,
    METRIC_WALL_S,
)
#: torchrun's restart count: the fallback when the cycle-info file cannot be used.
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
_MAX_COUNT = 2**31 - 1


def _restart_count(environ: Mapping[str, str]) -> int | None:
    raw = environ.get(RESTART_COUNT_ENV, "").strip()
    if not raw.isascii() or not raw.isdigit():
        return None
    value = int(raw)
    return value if value <= _MAX_COUNT else None


def cycle_metrics(environ: Mapping[str, str] | None = None) -> dict[str, float]:
    """The metrics for this rank's cycle; ``{}`` when ``NVRX_CURRENT_CYCLE_INFO`` is unset.

    A file that cannot be used (one WARNING from :func:`nvrx.ft.read_cycle_info`) leaves
    only the restart count, from ``TORCHELASTIC_RESTART_COUNT`` when that is a count.
    """
    env = os.environ if environ is None else environ
    path = env.get(CYCLE_INFO_ENV, "")
    if not path:
        return {}
    info = read_cycle_info(path)
    if info is None:
        restarts = _restart_count(env)
        return {} if restarts is None else {METRIC_RESTART_COUNT: float(restarts)}
    metrics = {METRIC_CYCLE: float(info.cycle), METRIC_RESTART_COUNT: float(info.restart_count)}
    if info.goodput is not None:
        metrics[METRIC_ETTR] = info.goodput.ettr
        metrics[METRIC_PRODUCTIVE_S] = info.goodput.productive_s
        metrics[METRIC_WALL_S] = info.goodput.wall_s
    return metrics


def trainer_and_module(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(trainer, pl_module)`` of a hook called in any shape (NVRx's hooks take ``*args``)."""
    trainer = kwargs.get("trainer", args[0] if args else None)
    pl_module = kwargs.get("pl_module", args[1] if len(args) > 1 else None)
    return trainer, pl_module


def _reporter(trainer: Any) -> object | None:
    """The first nvrx callback on the trainer that reports cycle metrics: only it logs."""
    for callback in getattr(trainer, "callbacks", ()):
        if getattr(callback, "_reports_cycle_metrics", False) is True:
            return callback  # type: ignore[no-any-return]
    return None


def report_cycle_metrics(
    callback: object, trainer: Any, pl_module: Any, log: Callable[..., None]
) -> dict[str, float]:
    """Read this cycle's metrics once and log them; returns what was logged.

    ``log(level, msg, *args)`` is the callback's rank-0 logger. Logging failures are
    warned about and never raised: monitoring never breaks training.
    """
    if trainer is None or _reporter(trainer) is not callback:
        return {}
    metrics = cycle_metrics()
    if not metrics:
        return {}
    logged = False
    try:
        if pl_module is not None:
            # Every rank reads the same file, so no sync_dist (a collective at each epoch
            # end); Lightning would advise it once per metric when its epoch value is
            # computed in a distributed run: that advice, for our names only, is muted.
            warnings.filterwarnings("ignore", message=r".*self\.log\('nvrx/", category=UserWarning)
            pl_module.log_dict(metrics, logger=False, batch_size=1)
            logged = True
    except Exception as exc:  # a logging failure must not stop training
        log(logging.WARNING, "Failed to put the restart cycle metrics in callback_metrics: %s", exc)
    try:
        if trainer.is_global_zero:
            for pl_logger in trainer.loggers:
                pl_logger.log_metrics(metrics, step=trainer.global_step)
            logged = True
    except Exception as exc:
        log(logging.WARNING, "Failed to send the restart cycle metrics to the loggers: %s", exc)
    if not logged:
        return {}
    log(
        logging.INFO,
        "Restart cycle metrics: %s",
        ", ".join(f"{name}={value:g}" for name, value in metrics.items()),
    )
    return metrics
