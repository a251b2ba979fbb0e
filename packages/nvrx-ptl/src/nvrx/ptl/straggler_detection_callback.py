"""StragglerDetectionCallback: straggler detection around Lightning's training steps."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from nvrx.ft import publish_straggler_report
from nvrx.straggler import Detector, Report, SustainedSlowdownRule

from ._compat import Callback, LightningModule, Trainer, save_last_checkpoint
from ._cycle_metrics import report_cycle_metrics
from ._verdict import share_verdict
from .straggler_scores import finite_scores, format_rank_scores, score_summary

__all__ = ["STEP_SECTION", "StragglerDetectionCallback"]

#: Section that times a whole training step: forward, backward and optimizer step.
STEP_SECTION = "train_step"


def _check_threshold(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{field} must be a number in [0, 1], got {value!r}")


def _ranks(ids: Iterable[Any]) -> str:
    return ", ".join(f"rank {s.rank} ({s.node})" for s in sorted(ids, key=lambda s: s.rank))


class StragglerDetectionCallback(Callback):
    """Lightning callback that finds slow ranks (stragglers) while a model trains.

    During ``fit`` it times every whole training step (forward, backward and
    optimizer step, from batch start to batch end, with GPU kernels captured where
    CUPTI is available) as the section ``train_step``, and the strategy's
    ``training_step`` (the forward pass) as its own section, since data-parallel
    gradient syncs make every rank's whole step equally long. Every
    ``report_time_interval`` seconds the ranks' scores are gathered on rank 0, which
    logs the stragglers and a table of the worst ranks and sends min/median/max of
    each score to the Trainer's loggers.

    Under ``ft_launcher`` rank 0 also hands each full report to its launcher
    (:func:`nvrx.ft.publish_straggler_report`, once per report: a hand-over to a
    background writer, never raising), which serves the per-rank scores as
    ``nvrx_straggler_score`` and counts the time the ranks waited for the slowest one as
    straggler wait in its goodput: ``(max - median) / step`` of the ranks' forward-pass
    medians over the median whole step (``train_step``; the whole steps are equally long
    under data-parallel training, where the fast ranks wait inside the gradient
    all-reduce). Only slowness in the forward pass counts: a rank slow only in its
    backward pass or data loading shows no wait.

    Scores run from 0 to 1 (1: as fast as the reference; 0.5: twice as slow). GPU
    scores need CUPTI (``nvrx-straggler[cupti]``) and a GPU; section scores work
    everywhere. A rank is a straggler when a score is below its threshold; a
    threshold of 0 turns that check off. As in NVRx, only GPU stragglers stop the
    training (``stop_if_detected``); section stragglers are logged, and stop it too
    with ``stop_on_section_scores=True``.

    Args:
        report_time_interval: seconds between reports (a report is a collective).
        calc_relative_gpu_perf: compute relative scores (rank vs the fastest rank),
            for GPU and sections.
        calc_individual_gpu_perf: compute individual scores (rank vs its own best),
            for GPU and sections.
        num_gpu_perf_scores_to_print: ranks shown in each score table (0: no tables).
        gpu_relative_perf_threshold: straggler threshold of relative GPU scores.
        gpu_individual_perf_threshold: straggler threshold of individual GPU scores.
        stop_if_detected: end the job when a GPU straggler is found, as NVRx does:
            with a checkpoint callback, the last checkpoint is saved (the callback's
            own ``last`` checkpoint with ``save_last=True``, else
            ``last-straggler-stop-step=N.ckpt`` in its directory), then every rank
            raises ``SystemExit(1)`` (so the rank fails, and ``ft_launcher`` restarts
            it if restarts are left); without one, ``trainer.should_stop`` is set and
            fit returns.
        enable_ptl_logging: log min/median/max of each score (``gpu_relative_perf/min``
            ...) through ``pl_module.log_dict`` on every rank (rank 0's values), so
            they are in ``trainer.callback_metrics`` for EarlyStopping and
            ModelCheckpoint, and send them to the Trainer's loggers at the report's step.
        profiling_interval: time one step in this many (reduces overhead).
        logger_name: name of the logger of this callback's messages; NVRx's default,
            ``"nemo_logger.StragglerDetectionCallback"``, where NeMo's handlers listen
            and its tests look for "GPU relative performance". Pass another name to log
            elsewhere; None: the default.
        section_relative_perf_threshold: straggler threshold of relative section scores.
        section_individual_perf_threshold: straggler threshold of individual section
            scores.
        gather_on_rank0: gather every rank's scores on rank 0, which reports for the
            job (default). With False nothing is gathered: each rank judges and logs
            only itself, and the loggers get rank 0's own scores.
        stop_on_section_scores: with ``stop_if_detected`` (or
            ``stop_if_sustained_straggler``), section stragglers stop the training
            too, not only GPU stragglers. Needed where there are no GPU scores (no GPU,
            or no CUPTI).
        stop_if_sustained_straggler: also end the job (as ``stop_if_detected`` does)
            when the sustained-slowdown rule flags a rank: slower than the median rank
            by ``sustained_min_slowdown`` for ``sustained_windows`` reports in a row
            (GPU relative scores; section relative scores with
            ``stop_on_section_scores``). It catches a GPU that throttles by 5-20%, which
            never falls below a 0.7 threshold. What the rule finds is logged whether or
            not this is set. It needs ``gather_on_rank0`` and at least 3 ranks.
        sustained_min_slowdown: slowdown vs the median rank the rule needs (0.04: 4%).
        sustained_windows: reports in a row the rule needs.
    """

    def __init__(
        self,
        report_time_interval: float = 300.0,
        calc_relative_gpu_perf: bool = True,
        calc_individual_gpu_perf: bool = True,
        num_gpu_perf_scores_to_print: int = 5,
        gpu_relative_perf_threshold: float = 0.7,
        gpu_individual_perf_threshold: float = 0.7,
        stop_if_detected: bool = False,
        enable_ptl_logging: bool = True,
        profiling_interval: int = 1,
        logger_name: str | None = "nemo_logger.StragglerDetectionCallback",
        section_relative_perf_threshold: float = 0.7,
        section_individual_perf_threshold: float = 0.7,
        gather_on_rank0: bool = True,
        stop_on_section_scores: bool = False,
        stop_if_sustained_straggler: bool = False,
        sustained_min_slowdown: float = 0.04,
        sustained_windows: int = 3,
    ) -> None:
        super().__init__()
        if (
            isinstance(report_time_interval, bool)
            or not isinstance(report_time_interval, (int, float))
            or not report_time_interval > 0
        ):
            raise ValueError(f"report_time_interval must be > 0, got {report_time_interval!r}")
        if isinstance(profiling_interval, bool) or not isinstance(profiling_interval, int):
            raise ValueError(f"profiling_interval must be an int >= 1, got {profiling_interval!r}")
        if profiling_interval < 1:
            raise ValueError(f"profiling_interval must be an int >= 1, got {profiling_interval!r}")
        if (
            isinstance(num_gpu_perf_scores_to_print, bool)
            or not isinstance(num_gpu_perf_scores_to_print, int)
            or num_gpu_perf_scores_to_print < 0
        ):
            raise ValueError(
                "num_gpu_perf_scores_to_print must be an int >= 0, "
                f"got {num_gpu_perf_scores_to_print!r}"
            )
        _check_threshold("gpu_relative_perf_threshold", gpu_relative_perf_threshold)
        _check_threshold("gpu_individual_perf_threshold", gpu_individual_perf_threshold)
        _check_threshold("section_relative_perf_threshold", section_relative_perf_threshold)
        _check_threshold("section_individual_perf_threshold", section_individual_perf_threshold)
        self.scores_to_compute: list[str] = []
        if calc_relative_gpu_perf:
            self.scores_to_compute.append("relative_perf_scores")
        if calc_individual_gpu_perf:
            self.scores_to_compute.append("individual_perf_scores")
        if not self.scores_to_compute:
            raise ValueError(
                "No straggler performance scores specified: set calc_relative_gpu_perf=True "
                "or calc_individual_gpu_perf=True"
            )
        self.report_time_interval = float(report_time_interval)
        self.calc_relative_gpu_perf = calc_relative_gpu_perf
        self.calc_individual_gpu_perf = calc_individual_gpu_perf
        self.num_gpu_perf_scores_to_print = num_gpu_perf_scores_to_print
        self.gpu_relative_perf_threshold = float(gpu_relative_perf_threshold)
        self.gpu_individual_perf_threshold = float(gpu_individual_perf_threshold)
        self.section_relative_perf_threshold = float(section_relative_perf_threshold)
        self.section_individual_perf_threshold = float(section_individual_perf_threshold)
        if not isinstance(gather_on_rank0, bool):
            raise ValueError(f"gather_on_rank0 must be a bool, got {gather_on_rank0!r}")
        self.gather_on_rank0 = gather_on_rank0
        for name, flag in (
            ("stop_if_detected", stop_if_detected),
            ("enable_ptl_logging", enable_ptl_logging),
            ("stop_on_section_scores", stop_on_section_scores),
            ("stop_if_sustained_straggler", stop_if_sustained_straggler),
        ):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be a bool, got {flag!r}")
        if (
            isinstance(sustained_min_slowdown, bool)
            or not isinstance(sustained_min_slowdown, (int, float))
            or not 0 < sustained_min_slowdown < 10
        ):
            raise ValueError(
                "sustained_min_slowdown must be a number in (0, 10), "
                f"got {sustained_min_slowdown!r}"
            )
        if (
            isinstance(sustained_windows, bool)
            or not isinstance(sustained_windows, int)
            or sustained_windows < 1
        ):
            raise ValueError(f"sustained_windows must be an int >= 1, got {sustained_windows!r}")
        self.stop_if_sustained_straggler = stop_if_sustained_straggler
        self.sustained_min_slowdown = float(sustained_min_slowdown)
        self.sustained_windows = sustained_windows
        self.stop_on_section_scores = stop_on_section_scores
        self.stop_if_detected = stop_if_detected
        self.enable_ptl_logging = enable_ptl_logging
        self.profiling_interval = profiling_interval
        self.logger = logging.getLogger(logger_name or "nemo_logger.StragglerDetectionCallback")
        self.initialized = False
        #: The latest report this rank received (None before the first one); rank 0
        #: holds every rank's scores when ``gather_on_rank0`` is True.
        self.last_report: Report | None = None
        self._owns_detector = False
        self._unwrap: Callable[[], None] | None = None
        self._step_section: AbstractContextManager[Any] | None = None
        self._rank = 0
        self._is_rank0 = True
        self._told_no_gpu_scores = False
        #: When the current report window began (wall time), for the launcher's goodput.
        self._window_start: float | None = None
        #: The section timing the strategy's training_step (the forward pass).
        self._forward_section: str | None = None

    # -- logging -----------------------------------------------------------------------------

    def _log0(self, level: int, msg: str, *args: object) -> None:
        if self._is_rank0:
            self.logger.log(level, f"[StragglerDetectionCallback@rank0] {msg}", *args)

    def _log_report(self, level: int, msg: str, *args: object) -> None:
        """Report messages: rank 0 speaks for the job, or each rank for itself without gather."""
        if self._is_rank0 or not self.gather_on_rank0:
            self.logger.log(level, f"[StragglerDetectionCallback@rank{self._rank}] {msg}", *args)

    # -- life cycle --------------------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Start the detector and time the strategy's training_step (fit only)."""
        if stage != "fit" or self.initialized:
            return
        self._rank = trainer.global_rank
        self._is_rank0 = trainer.is_global_zero
        if not Detector.initialized:
            Detector.initialize(
                scores_to_compute=self.scores_to_compute,
                gather_on_rank0=self.gather_on_rank0,
                profiling_interval=self.profiling_interval,
                report_time_interval=self.report_time_interval,
                sustained_slowdown_rule=SustainedSlowdownRule(
                    self.sustained_min_slowdown, self.sustained_windows
                ),
            )
            self._owns_detector = True
        self._time_forward(trainer)
        self.initialized = True
        self._log0(
            logging.INFO,
            "Straggler detection started: report every %.1f s, scores %s",
            self.report_time_interval,
            self.scores_to_compute,
        )

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Stop the detector at the end of fit."""
        if stage == "fit":
            self._shutdown()

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """Close the open step section and stop the detector."""
        section = self._step_section
        self._step_section = None
        if section is not None:
            section.__exit__(type(exception), exception, exception.__traceback__)
        self._shutdown()

    def _time_forward(self, trainer: Trainer) -> None:
        """Time ``strategy.training_step`` as its own section (ours only: restored at the end)."""
        strategy = trainer.strategy
        original = strategy.training_step
        name = f"{type(strategy).__name__}.training_step"
        self._forward_section = name

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not Detector.initialized:  # shut down under our feet: just run the step
                return original(*args, **kwargs)
            with Detector.detection_section(name, profile_cuda=False):
                return original(*args, **kwargs)

        self._unwrap = functools.partial(_restore, strategy, "training_step", original, timed)
        strategy.training_step = timed  # type: ignore[method-assign]

    def _shutdown(self) -> None:
        if not self.initialized:
            return
        self.initialized = False
        self._step_section = None
        if self._unwrap is not None:
            self._unwrap()
            self._unwrap = None
        if self._owns_detector:
            self._owns_detector = False
            Detector.shutdown()

    # -- the step section --------------------------------------------------------------------

    def _detector_alive(self) -> bool:
        if self.initialized and not Detector.initialized:
            self._log0(
                logging.WARNING, "The straggler Detector was shut down; straggler detection stops"
            )
            self._shutdown()
        return self.initialized

    @property
    def _reports_cycle_metrics(self) -> bool:
        """Logs the restart cycle, restart count and goodput too, with enable_ptl_logging."""
        return bool(self.enable_ptl_logging)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log the restart cycle's metrics (once per fit)."""
        self._window_start = time.time()  # wall clock: label
        report_cycle_metrics(self, trainer, pl_module, self._log0)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Open the whole-step section."""
        if not self._detector_alive():
            return
        unfinished = self._step_section
        if unfinished is not None:  # the previous batch never ended (skipped): do not time it
            unfinished.__exit__(RuntimeError, None, None)
        section = Detector.detection_section(STEP_SECTION, profile_cuda=True)
        section.__enter__()
        self._step_section = section

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Close the step section; on report intervals, report and maybe stop."""
        if not self._detector_alive():
            return
        section = self._step_section
        self._step_section = None
        if section is not None:
            section.__exit__(None, None, None)
        started = time.monotonic()
        report = Detector.generate_report_if_interval_elapsed()
        if not Detector.is_interval_elapsed():
            return
        found = False
        scores: dict[str, float] = {}
        if report is not None and (trainer.is_global_zero or not self.gather_on_rank0):
            found, scores = self._handle_report(report)
            if trainer.is_global_zero and self.gather_on_rank0:
                self._publish(report)
        may_stop = self.stop_if_detected or self.stop_if_sustained_straggler
        if may_stop or self.enable_ptl_logging:
            verdict = share_verdict(trainer, found, scores)  # a collective: every rank
            found, scores = verdict.found, verdict.scores
        if self.enable_ptl_logging and scores:
            self._log_scores(trainer, pl_module, scores)
        self._log0(
            logging.INFO,
            "Straggler report processing time: %.3f s",
            time.monotonic() - started,
        )
        if may_stop and found:
            self._stop_training(trainer)

    # -- reports -----------------------------------------------------------------------------

    def _handle_report(self, report: Report) -> tuple[bool, dict[str, float]]:
        """Log the report; return (it calls for a stop, score summary)."""
        self.last_report = report
        stragglers = report.identify_stragglers(
            gpu_rel_threshold=self.gpu_relative_perf_threshold,
            section_rel_threshold=self.section_relative_perf_threshold,
            gpu_indiv_threshold=self.gpu_individual_perf_threshold,
            section_indiv_threshold=self.section_individual_perf_threshold,
        )
        gpu_found = section_found = False
        warn = logging.WARNING
        if stragglers["straggler_gpus_relative"]:
            gpu_found = True
            self._log_report(
                warn,
                "STRAGGLER DETECTION WARNING: Some GPUs have worse relative performance. "
                "Affected ranks: %s",
                _ranks(stragglers["straggler_gpus_relative"]),
            )
        if stragglers["straggler_gpus_individual"]:
            gpu_found = True
            self._log_report(
                warn,
                "STRAGGLER DETECTION WARNING: Some GPUs performance dropped. Affected ranks: %s",
                _ranks(stragglers["straggler_gpus_individual"]),
            )
        for section, ids in sorted(stragglers["straggler_sections_relative"].items()):
            section_found = True
            self._log_report(
                warn,
                "STRAGGLER DETECTION WARNING: Section %r is slower on some ranks than on the "
                "fastest one. Affected ranks: %s",
                section,
                _ranks(ids),
            )
        for section, ids in sorted(stragglers["straggler_sections_individual"].items()):
            section_found = True
            self._log_report(
                warn,
                "STRAGGLER DETECTION WARNING: Section %r got slower than its own best on some "
                "ranks. Affected ranks: %s",
                section,
                _ranks(ids),
            )
        sustained = report.identify_sustained_stragglers()
        for slowdown in sustained["details"]:
            self._log_report(warn, "STRAGGLER DETECTION WARNING: %s", slowdown.reason)
        score_sets = self._score_sets(report)
        no_gpu_scores = not finite_scores(report.gpu_relative_perf_scores) and not finite_scores(
            report.gpu_individual_perf_scores
        )
        if no_gpu_scores and not self._told_no_gpu_scores:
            self._told_no_gpu_scores = True
            self._log_report(
                logging.INFO,
                "No GPU performance scores (no GPU kernels recorded: needs a GPU and CUPTI); "
                "using section scores",
            )
        for missing in report.non_comparable:
            if no_gpu_scores and missing.score.startswith("gpu"):
                continue
            where = f" in section {missing.section!r}" if missing.section else ""
            self._log_report(
                logging.INFO,
                "Rank %d has no %s score%s: %s",
                missing.rank,
                missing.score,
                where,
                missing.reason,
            )
        if self.num_gpu_perf_scores_to_print > 0:
            tables = [
                f"{title}:\n"
                + format_rank_scores(scores, report.rank_to_node, self.num_gpu_perf_scores_to_print)
                for title, prefix, scores in score_sets
                if scores or prefix.startswith("gpu_")  # GPU tables always, as NVRx prints them
            ]
            if tables:
                self._log_report(logging.INFO, "Straggler report:\n%s", "".join(tables))
        sections = self.stop_on_section_scores
        stop = (self.stop_if_detected and (gpu_found or (sections and section_found))) or (
            self.stop_if_sustained_straggler
            and bool(
                sustained["straggler_gpus_relative"]
                or (sections and sustained["straggler_sections_relative"])
            )
        )
        return stop, self._summary(score_sets) if self.enable_ptl_logging else {}

    def _publish(self, report: Report) -> None:
        """Hand the full report to ft_launcher, if it asked (a file write; never raises).

        The forward pass's and the whole step's medians go with it: see the class doc on
        the straggler wait. A background thread writes it (this returns at once); a
        failure is one WARNING from ``nvrx.ft.straggler_scores``; training carries on.
        """
        now = time.time()  # wall clock: label (the report window)
        start, self._window_start = self._window_start, now
        publish_straggler_report(
            report,
            window_start=start,
            window_end=now,
            forward_section=self._forward_section or STEP_SECTION,
            step_section=STEP_SECTION,
        )

    def _score_sets(self, report: Report) -> list[tuple[str, str, Mapping[int, float]]]:
        """Every score kind of the report: (display title, metric prefix, scores)."""
        out: list[tuple[str, str, Mapping[int, float]]] = []
        kinds = []
        if self.calc_relative_gpu_perf:
            kinds.append(("relative", report.gpu_relative_perf_scores))
        if self.calc_individual_gpu_perf:
            kinds.append(("individual", report.gpu_individual_perf_scores))
        for kind, scores in kinds:
            out.append((f"GPU {kind} performance", f"gpu_{kind}_perf", scores))
        for kind, _ in kinds:
            by_section = getattr(report, f"section_{kind}_perf_scores")
            for name, scores in sorted(by_section.items()):
                out.append(
                    (f"Section {name!r} {kind} performance", f"section_{kind}_perf/{name}", scores)
                )
        return out

    @staticmethod
    def _summary(score_sets: list[tuple[str, str, Mapping[int, float]]]) -> dict[str, float]:
        """``{"<prefix>/min" | "/median" | "/max": value}`` over each score set's finite scores."""
        metrics: dict[str, float] = {}
        for _, prefix, scores in score_sets:
            for stat, value in score_summary(scores).items():
                metrics[f"{prefix}/{stat}"] = value
        return metrics

    def _log_scores(
        self, trainer: Trainer, pl_module: LightningModule, scores: dict[str, float]
    ) -> None:
        """Scores into ``callback_metrics`` on every rank, and to the loggers from rank 0."""
        try:
            pl_module.log_dict(scores, logger=False, batch_size=1)
        except Exception as exc:  # a logging failure must not stop training
            self._log0(logging.WARNING, "Failed to log straggler scores: %s", exc)
        if not trainer.is_global_zero:
            return
        for pl_logger in trainer.loggers:
            try:
                pl_logger.log_metrics(scores, step=trainer.global_step)
            except Exception as exc:
                self._log0(logging.WARNING, "Failed to log straggler scores: %s", exc)

    def _stop_training(self, trainer: Trainer) -> None:
        """End the job as NVRx does: save the last checkpoint, then ``SystemExit(1)``.

        Runs on every rank at the same report (the verdict is shared). Without a
        checkpoint callback it only sets ``trainer.should_stop``, as NVRx does.
        """
        self._log0(logging.ERROR, "Detected stragglers. Terminating training...")
        trainer.should_stop = True
        checkpoint_callback = trainer.checkpoint_callback
        if checkpoint_callback is None:
            self._log0(
                logging.WARNING,
                "No checkpoint callback: training stops at the end of this step, no checkpoint",
            )
            return
        path = save_last_checkpoint(trainer, checkpoint_callback)
        checkpoint_io = trainer.strategy.checkpoint_io
        finalize = getattr(checkpoint_io, "maybe_finalize_save_checkpoint", None)
        if callable(finalize):
            self._log0(logging.INFO, "Async checkpointing detected, waiting for it to complete...")
            finalize(blocking=True)
        if path is None:
            self._log0(logging.WARNING, "The checkpoint callback has no directory: nothing saved")
        else:
            self._log0(logging.INFO, "Saved checkpoint %s before stopping", path)
        raise SystemExit(1)


def _restore(obj: object, name: str, original: object, wrapper: object) -> None:
    """Undo an instance-attribute wrap, unless something else was wrapped on top of it."""
    if vars(obj).get(name) is not wrapper:
        return  # ours stays underneath and passes through once the detector is gone
    if getattr(type(obj), name, None) is getattr(original, "__func__", None):
        delattr(obj, name)
    else:
        setattr(obj, name, original)
