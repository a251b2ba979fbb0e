"""The rank side: heartbeats, sections and timeout calculation, talking to this rank's monitor.

Heartbeats and section events are plain stores into a shared memory block the monitor
reads, so they cost well under a microsecond, never block, and never fail because the
monitor is slow, stopped or gone (that is noticed about once a second and logged
once). Everything else (init, calculated timeouts, workload control requests) goes
over the control socket as JSON frames.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import logging
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from nvrx.ft._detection import STEP_SECTION
from nvrx.ft._flight import start_trace_server, stop_trace_server
from nvrx.ft._learning import (
    CHECKPOINT,
    EPOCH,
    EVENT_KINDS,
    VALIDATION,
    LearnSettings,
    automatic_floor,
    cap_and_floor,
    learned_timeout,
    pending_reason,
)
from nvrx.ft._protocol import PROTOCOL_VERSION, ProtocolError, encode_frame, recv_frame
from nvrx.ft._shm import (
    LAST_HB_NS,
    OOS_SINCE_NS,
    SECTION_BASE,
    SECTIONS_USED,
    SLOT_LAYOUT,
    STEPS_STARTED,
    WARMUP_STEPS,
    SharedBlock,
)
from nvrx.ft._state import CURRENT_TIMEOUTS_STATE_KEY, FtStateError, parse_timeouts_state
from nvrx.ft.config import FaultToleranceConfig
from nvrx.ft.data import (
    MONITOR_SOCKET_ENV,
    HeartbeatTimeouts,
    SectionTimeouts,
    WorkloadControlRequest,
    monitor_socket_from_env,
)
from nvrx.ft.timeouts_calc import SectionStat, TimeoutsCalc, TimeoutsCalcError

__all__ = ["RankMonitorClient", "RankMonitorClientError"]

_NS = 1_000_000_000
_CONTROL_TIMEOUT_S = 10.0
_CONNECT_RETRY_S = 5.0
_PROBE_PERIOD_NS = _NS
_monotonic_ns = time.monotonic_ns


def _cap(value: float | None, configured: float | None, floor: float) -> float | None:
    return None if value is None else cap_and_floor(value, configured, floor)


def _at_least(value: float | None, other: float | None) -> float | None:
    if value is None or other is None:
        return value
    return max(value, other)


def _fmt(value: float | None) -> str:
    return "off" if value is None else f"{value:.2f} s"


def _hb_key(hb: HeartbeatTimeouts | None) -> tuple[float | None, float | None] | None:
    return None if hb is None else (hb.initial, hb.subsequent)


def _sec_key(sec: SectionTimeouts | None) -> tuple[object, ...] | None:
    if sec is None:
        return None
    return (sorted(sec.section.items(), key=lambda kv: kv[0]), sec.out_of_section)


class RankMonitorClientError(Exception):
    """Misuse of the client, or a control request the monitor could not carry out."""


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise RankMonitorClientError(f"${name}={value!r} is not an integer") from None


def _current_rank() -> int:
    """The global rank: the process group's when there is one, else $RANK, else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return _env_int("RANK", 0)


def _connect(sock: socket.socket, path: str) -> None:
    """Connect, waiting up to a few seconds for a monitor that is (re)starting."""
    deadline = time.monotonic() + _CONNECT_RETRY_S
    while True:
        try:
            sock.connect(path)
            return
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def _check_peer_is_us(sock: socket.socket, path: str) -> None:
    """The monitor must run as our user (as the monitor checks us), or we talk to no one."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    if uid != os.getuid():
        raise ProtocolError(
            f"the process listening on {path} runs as uid {uid}, not ours ({os.getuid()})"
        )


def _dist_ready() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _dump_stream() -> TextIO | None:
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (OSError, ValueError, AttributeError):
            continue
    return None


class RankMonitorClient:
    """Connects a training rank to its monitor. Create it, then ``init_workload_monitoring()``.

    Attributes follow NVRx: ``cfg`` (the monitor's config, after init), ``hb_timeouts``
    and ``section_timeouts`` (the timeouts in force), ``timeouts_calc``,
    ``is_initialized``, and ``loaded_hb_timeouts``/``loaded_section_timeouts`` (from
    :meth:`load_state_dict`).

    The hot-path methods are meant for the training thread; like NVRx's, they are not
    synchronised against each other across threads.
    """

    CURRENT_TIMEOUTS_STATE_KEY = CURRENT_TIMEOUTS_STATE_KEY

    def __init__(self) -> None:
        self.logger = logging.getLogger("nvrx.ft.RankMonitorClient")
        self.cfg: FaultToleranceConfig | None = None
        self.rank: int | None = None
        self.rank_monitor_socket: str | None = None
        self.is_initialized = False
        self.timeouts_calc: TimeoutsCalc | None = None
        self.hb_timeouts: HeartbeatTimeouts | None = None
        self.section_timeouts: SectionTimeouts | None = None
        self.loaded_hb_timeouts: HeartbeatTimeouts | None = None
        self.loaded_section_timeouts: SectionTimeouts | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._block: SharedBlock | None = None
        self._slots: Any = None
        self._calc = TimeoutsCalc()
        self._section_entries: dict[str, tuple[SectionStat, int]] = {}
        self._sections_used = False
        self._next_probe_ns = 0
        self._monitor_lost = False
        self._dump_signal: int | None = None
        self._warmup_left = 0
        self._step_slot = -1
        self._misuse_logged: set[tuple[str, str]] = set()
        self._unmonitored_seen: set[str] = set()  # logged once: later calls return at once
        self._previous_excepthook: Any = None
        self._floor_s = 0.0
        self._warmup_steps = 0
        self._learn_requested: tuple[str, ...] | None = None
        self._learn_requested_sections: tuple[str, ...] | None = None
        self._reset_learning()

    def _reset_learning(self) -> None:
        """Learned timeouts off; see :meth:`enable_learned_timeouts`."""
        #: The settings while learning is enabled (pending or active), else None.
        self._learn: LearnSettings | None = None
        self._learning = False  # read in the hot path's rare branches
        self._learn_active = False
        self._learn_steps = 0
        self._learn_seen: set[str] = set()
        self._learn_noted: set[str] = set()
        self._learn_suspended = False
        self._learn_sections: frozenset[str] | None = None
        self._learn_error_logged = False
        self._probe_due_ns = 0
        # What is in force without learning (configured, loaded or calculated), and
        # whether it was calculated in this job (learning then only loosens it).
        self._base_hb: HeartbeatTimeouts | None = None
        self._base_sec: SectionTimeouts | None = None
        self._hb_calculated_here = False
        self._sec_calculated_here = False

    # ------------------------------------------------------------- lifecycle

    def init_workload_monitoring(self, num_warmup_iters: int | None = None) -> None:
        """Connect to the monitor named by ``$NVRX_FT_MONITOR_SOCKET`` and start monitoring.

        ``num_warmup_iters`` (as Megatron-LM passes it) overrides the config's
        ``num_warmup_iterations``: the first N ``step`` sections are checked against the
        ``warmup`` section timeout, or not at all when there is none.
        """
        if self.is_initialized:
            raise RankMonitorClientError("init_workload_monitoring() was already called")
        if num_warmup_iters is not None and (
            isinstance(num_warmup_iters, bool)
            or not isinstance(num_warmup_iters, int)
            or not 0 <= num_warmup_iters <= 1_000_000_000
        ):
            raise RankMonitorClientError(
                f"num_warmup_iters={num_warmup_iters!r}: expected an integer >= 0"
            )
        # NVRx's variable name, for code that sets it by hand next to run_in_subprocess.
        path = monitor_socket_from_env(os.environ)
        if not path:
            raise RankMonitorClientError(
                f"${MONITOR_SOCKET_ENV} is not set: run the rank under ft_launcher "
                "(or set it to a RankMonitorServer socket)"
            )
        rank = _current_rank()
        local_rank = _env_int("LOCAL_RANK", -1)
        dump_stream = _dump_stream()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(_CONTROL_TIMEOUT_S)
        try:
            _connect(sock, path)
            _check_peer_is_us(sock, path)
            sock.sendall(
                encode_frame(
                    {
                        "type": "init",
                        "v": PROTOCOL_VERSION,
                        "rank": rank,
                        "local_rank": local_rank,
                        "host": socket.gethostname(),
                        "stack_dump": dump_stream is not None,
                    }
                )
            )
            reply, fds = recv_frame(sock, max_fds=1)
        except (OSError, ProtocolError) as exc:
            sock.close()
            raise RankMonitorClientError(f"cannot reach the rank monitor at {path}: {exc}") from exc
        try:
            if not reply.get("ok"):
                raise RankMonitorClientError(f"rank monitor refused init: {reply.get('error')}")
            if len(fds) != 1:
                raise RankMonitorClientError("rank monitor sent no shared memory block")
            cfg = FaultToleranceConfig._from_peer(reply["config"])
            sections = list(reply["sections"])
            block = SharedBlock(fds[0], len(sections))
        except (KeyError, TypeError, ValueError, OSError) as exc:
            sock.close()
            raise RankMonitorClientError(f"bad init reply from the rank monitor: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        if reply.get("slots") != SLOT_LAYOUT:
            sock.close()
            block.close()
            raise RankMonitorClientError("the rank monitor uses another shared memory layout")
        floor = cfg.min_calculated_timeout
        if floor is None:
            floor = automatic_floor(cfg.workload_check_interval)
        calc = TimeoutsCalc(sections=sections, safety_factor=cfg.safety_factor, min_timeout=floor)
        self._floor_s = floor
        calc.start_ns = calc.last_section_close_ns = int(reply["init_ns"])  # the monitor's clock
        self._sock = sock
        self._block = block
        self._slots = block.slots
        self._calc = calc
        self._section_entries = {
            name: (calc.sections[name], SECTION_BASE + i) for i, name in enumerate(sections)
        }
        self._sections_used = False
        self._monitor_lost = False
        self._next_probe_ns = self._probe_due_ns = time.monotonic_ns() + _PROBE_PERIOD_NS
        warmup = cfg.num_warmup_iterations if num_warmup_iters is None else num_warmup_iters
        block.slots[WARMUP_STEPS] = warmup
        step = self._section_entries.get(STEP_SECTION)
        # Count step openings up to warmup + 2: at warmup + 1 the monitor knows warmup is
        # over; from 1 (and the step closed) or 2 that the first step ended (its
        # rank_first_step event). Only the first warmup + 2 steps take this branch.
        self._warmup_left = warmup + 2 if step is not None else 0
        self._step_slot = -1 if step is None else step[1]
        self.cfg = cfg
        self.rank = rank
        self.rank_monitor_socket = path
        self.timeouts_calc = calc
        self.hb_timeouts = HeartbeatTimeouts(
            cfg.initial_rank_heartbeat_timeout, cfg.rank_heartbeat_timeout, were_calculated=False
        )
        self.section_timeouts = SectionTimeouts(
            section=dict(cfg.rank_section_timeouts),
            out_of_section=cfg.rank_out_of_section_timeout,
        )
        if dump_stream is not None and cfg.stack_dump_signal is not None:
            try:
                faulthandler.register(cfg.stack_dump_signal, file=dump_stream, all_threads=True)
                self._dump_signal = int(cfg.stack_dump_signal)
            except (OSError, RuntimeError, ValueError) as exc:
                self.logger.warning("no stack dump on termination: %s", exc)
        if cfg.install_exception_hook:
            self._install_exception_hook()
        fr = start_trace_server()  # the monitor reads the flight recorder on a hang
        if fr is not None and fr.startswith("!"):
            self.logger.debug("no flight-recorder server: %s", fr[1:])
        self._base_hb, self._base_sec = self.hb_timeouts, self.section_timeouts
        self._warmup_steps = warmup
        self.is_initialized = True
        if self.loaded_hb_timeouts is not None or self.loaded_section_timeouts is not None:
            self._apply_loaded()
        if cfg.learn_timeouts or self._learn_requested is not None:
            self.enable_learned_timeouts(
                self._learn_requested or (), self._learn_requested_sections
            )

    def _install_exception_hook(self) -> None:
        """NVRx's install_exception_hook: log an uncaught exception, then exit at once.

        ``os._exit`` skips interpreter teardown, which can hang in a rank whose
        collective peers are gone; the launcher sees exit status 1.
        """
        logger = self.logger
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
            try:
                logger.critical("uncaught exception; exiting", exc_info=(kind, value, tb))
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
            finally:
                os._exit(1)

        self._previous_excepthook = previous
        sys.excepthook = hook

    def shutdown_workload_monitoring(self) -> None:
        """Stop monitoring this rank (the monitor stops checking it) and disconnect."""
        if not self.is_initialized:
            return
        self.is_initialized = False
        sock = self._sock
        self._sock = None
        if sock is not None:
            with contextlib.suppress(OSError, ProtocolError):
                sock.settimeout(2.0)
                sock.sendall(encode_frame({"type": "shutdown"}))
                recv_frame(sock)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        stop_trace_server()
        if self._dump_signal is not None:
            faulthandler.unregister(self._dump_signal)
            self._dump_signal = None
        if self._previous_excepthook is not None:
            sys.excepthook = self._previous_excepthook
            self._previous_excepthook = None
        self._warmup_left = 0
        self._reset_learning()
        self._slots = None
        self._section_entries = {}
        self._unmonitored_seen.clear()
        self._misuse_logged.clear()
        if self._block is not None:
            self._block.close()
            self._block = None

    # -------------------------------------------------------------- hot path
    # A few plain stores and integer operations each; see the module docstring.

    def send_heartbeat(self) -> None:
        """Tell the monitor this rank is alive. Never blocks; costs well under a microsecond."""
        slots = self._slots
        if slots is None:
            raise RankMonitorClientError("send_heartbeat() before init_workload_monitoring()")
        t = _monotonic_ns()
        slots[LAST_HB_NS] = t
        calc = self._calc  # inline copy of TimeoutsCalc._heartbeat_ns: a call costs ~30%
        prev = calc.prev_hb_ns
        if prev:
            interval = t - prev
            if interval > calc.subsequent_max_ns:
                calc.subsequent_max_ns = interval
                if self._learning:  # a new longest interval: learning looks at once
                    self._next_probe_ns = 0
        else:
            interval = t - calc.start_ns
            if interval > calc.initial_max_ns:
                calc.initial_max_ns = interval
        calc.prev_hb_ns = t
        if t >= self._next_probe_ns:
            self._slow_path(t, True)

    def start_section(self, section: str) -> None:
        """Open a configured section; sections may nest or overlap.

        As in NVRx 0.7, a name without a configured timeout is not monitored and costs
        next to nothing (logged once per name), and reopening an open section is logged
        once and ignored: monitoring never breaks training.
        """
        entry = self._section_entries.get(section)
        if entry is None:
            if section not in self._unmonitored_seen:
                self._unmonitored("start_section", section)
            return
        stat, slot = entry
        if stat.opened_ns:
            self._misuse("start_section", section, "is already open; ignored")
            return
        slots = self._slots
        if self._warmup_left and slot == self._step_slot:
            self._warmup_left -= 1
            slots[STEPS_STARTED] += 1  # before the open time: see nvrx.ft._shm
        t = _monotonic_ns()
        slots[slot] = t  # the open time first, then out-of-section cleared (see nvrx.ft._shm)
        calc = self._calc  # inline copy of TimeoutsCalc._open_ns
        if not calc.open_count:
            slots[OOS_SINCE_NS] = 0
            interval = t - calc.last_section_close_ns
            if interval > calc.oos_max_ns:
                calc.oos_max_ns = interval
                if self._learning:
                    self._next_probe_ns = 0
            if not self._sections_used:
                self._sections_used = True
                slots[SECTIONS_USED] = 1
        calc.open_count += 1
        stat.opened_ns = t
        if t >= self._next_probe_ns:
            self._slow_path(t, slot == self._step_slot or self._step_slot < 0)

    def end_section(self, section: str) -> None:
        """Close a section opened with :meth:`start_section`."""
        entry = self._section_entries.get(section)
        if entry is None:
            if section not in self._unmonitored_seen:
                self._unmonitored("end_section", section)
            return
        stat, slot = entry
        if not stat.opened_ns:
            self._misuse("end_section", section, "is not open; ignored")
            return
        t = _monotonic_ns()
        interval = t - stat.opened_ns  # inline copy of TimeoutsCalc._close_ns
        if interval > stat.max_ns:
            stat.max_ns = interval
            if self._learning:
                self._next_probe_ns = 0
        stat.opened_ns = 0
        calc = self._calc
        calc.open_count -= 1
        slots = self._slots
        if not calc.open_count:
            calc.last_section_close_ns = t
            slots[OOS_SINCE_NS] = t  # out-of-section start first, then the section cleared
        slots[slot] = 0

    def end_all_sections(self) -> None:
        """Close every open section (a no-op when none is open)."""
        if self._slots is None:
            raise RankMonitorClientError("end_all_sections() before init_workload_monitoring()")
        calc = self._calc
        if not calc.open_count:
            return
        t = _monotonic_ns()
        self._slots[OOS_SINCE_NS] = t
        for stat, slot in self._section_entries.values():
            if stat.opened_ns:
                calc._close_ns(stat, t)
                self._slots[slot] = 0

    def _unmonitored(self, what: str, section: object) -> None:
        """A section name without a configured timeout (the slow path of the hot path)."""
        if self._slots is None:
            raise RankMonitorClientError(f"{what}() before init_workload_monitoring()")
        if not isinstance(section, str):
            raise RankMonitorClientError(f"{what}(): section name {section!r} is not a string")
        if self._first_time("unmonitored", section):
            configured = sorted(self._section_entries)
            self.logger.warning(
                "unmonitored: section %r has no configured timeout (configured: %s); "
                "it is not monitored (logged once)",
                section,
                configured,
            )
        if len(self._unmonitored_seen) < 4096:
            self._unmonitored_seen.add(section)

    def _first_time(self, what: str, section: str) -> bool:
        """True the first time (up to a bound) this kind of misuse is seen for a name."""
        key = (what, section)
        if key in self._misuse_logged or len(self._misuse_logged) >= 1024:
            return False
        self._misuse_logged.add(key)
        return True

    def _misuse(self, what: str, section: str, why: str) -> None:
        if self._first_time(what, section):
            self.logger.warning("%s: section %r %s (logged once)", what, section, why)

    def _slow_path(self, now_ns: int, step: bool) -> None:
        """What the hot path does when due: learning, then the monitor probe (about 1/s).

        While learning counts its first steps every heartbeat (or ``step`` section)
        comes here; afterwards only about once a second and at a new longest interval.
        """
        if self._learning:
            try:
                self._learn_tick(now_ns, step)
            except Exception:  # never break training: learning stops, monitoring goes on
                self._stop_learning("internal error while learning timeouts")
        if now_ns >= self._probe_due_ns:
            self._probe_monitor(now_ns)
        counting = self._learn is not None and not self._learn_active
        self._next_probe_ns = 0 if counting and self._counting_steps() else self._probe_due_ns

    def _probe_monitor(self, now_ns: int) -> None:
        """About once a second: notice (and log once) that the monitor went away."""
        self._probe_due_ns = now_ns + _PROBE_PERIOD_NS
        sock = self._sock
        if sock is None or self._monitor_lost:
            return
        try:
            # select first: a socket with a timeout would wait in recv despite MSG_DONTWAIT.
            readable, _, _ = select.select([sock], [], [], 0)
            gone = bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            gone = False
        except (OSError, ValueError):
            gone = True
        if gone:
            self._monitor_lost = True
            self.logger.warning(
                "rank monitor at %s is gone: hang detection is off for this rank; "
                "training continues and the launcher handles the monitor",
                self.rank_monitor_socket,
            )

    # ------------------------------------------------------- learned timeouts

    def enable_learned_timeouts(
        self, expect: Iterable[str] = (), sections: Iterable[str] | None = None
    ) -> None:
        """Tighten this rank's timeouts during the job, from what it observes.

        Once the rank has run its warmup iterations plus ``learn_min_steps`` steps
        (heartbeats, or ``step`` sections), and has been seen through a first event of
        each kind in ``expect`` (``"checkpoint"``, ``"validation"``: the slow events the
        loop has, noted with :meth:`note_checkpoint_save` and :meth:`note_validation`),
        every heartbeat, section and out-of-section timeout becomes ``safety_factor x``
        the longest interval seen so far, raised to the floor and never above the
        configured value; it loosens whenever a longer interval is seen. The first event
        of a kind not seen before (an epoch boundary: :meth:`note_epoch_boundary`) runs
        under the timeouts in force without learning. Becoming active is logged once.
        The learned timeouts are what :meth:`state_dict` returns, so the next job
        starts from them. ``sections`` limits learning to those sections (None: every
        configured one); leave out a section that runs once per job (a set-up), whose
        next run may be longer (a checkpoint load).

        Turned on by ``learn_timeouts: true``, by the Lightning callbacks with
        ``calculate_timeouts=True`` and by the first ``calculate_and_set_*`` call while
        ``learn_timeouts`` is None; ``learn_timeouts: false`` turns it off everywhere
        (NVRx's behaviour). Callable before init (it then starts at init). Never raises
        for training: a bad ``expect`` kind is a ValueError at the call.
        """
        kinds = tuple(expect)
        unknown = sorted(set(kinds) - {CHECKPOINT, VALIDATION})
        if unknown:
            raise ValueError(
                f"enable_learned_timeouts: unknown kinds {unknown}; "
                f"expected some of {[CHECKPOINT, VALIDATION]}"
            )
        cfg = self.cfg
        if not self.is_initialized or cfg is None:
            self._learn_requested = kinds
            self._learn_requested_sections = None if sections is None else tuple(sections)
            return
        if cfg.learn_timeouts is False:
            if self._first_time("learning", "off"):
                self.logger.info("learned timeouts are off (learn_timeouts: false)")
            return
        expected = frozenset(kinds)
        if sections is not None:
            self._learn_sections = frozenset(sections)
        if self._learn is not None:
            if expected <= self._learn.expected:
                return
            expected |= self._learn.expected
        self._learn = LearnSettings(
            safety_factor=cfg.safety_factor,
            floor=self._floor_s,
            warmup_steps=self._warmup_steps,
            min_steps=cfg.learn_min_steps,
            expected=expected,
        )
        self._learning = True
        self._next_probe_ns = 0
        if self._first_time("learning", "enabled"):
            after = "".join(f" and a first {k}" for k in sorted(expected))
            self.logger.info(
                "learning timeouts: active after %d steps%s",
                self._learn.steps_needed,
                after,
            )

    @property
    def learned_timeouts_active(self) -> bool:
        """True once learned timeouts are in force (see :meth:`enable_learned_timeouts`)."""
        return self._learn_active

    def note_checkpoint_save(self) -> None:
        """Say a checkpoint save is starting (or just ended); see enable_learned_timeouts."""
        self._note(CHECKPOINT)

    def note_validation(self) -> None:
        """Say a validation pass is starting (or just ended)."""
        self._note(VALIDATION)

    def note_epoch_boundary(self) -> None:
        """Say an epoch boundary is starting (before the next epoch's data loader)."""
        self._note(EPOCH)

    def _note(self, kind: str) -> None:
        assert kind in EVENT_KINDS
        if not self._learning or kind in self._learn_seen or kind in self._learn_noted:
            return
        self._learn_noted.add(kind)
        self._next_probe_ns = 0  # the next heartbeat or section measures the event
        if self._learn_active and not self._learn_suspended:
            # A slow event never measured: run it under the timeouts in force without
            # learning until the interval holding it has been seen.
            self._learn_suspended = True
            self.logger.info("first %s since learning: learned timeouts paused until it ends", kind)
            self._send_timeouts(self._base_hb, self._base_sec)

    def _counting_steps(self) -> bool:
        learn = self._learn
        return learn is not None and self._learn_steps < learn.steps_needed

    def _stop_learning(self, why: str) -> None:
        self._learning = False
        self._learn = None
        if not self._learn_error_logged:
            self._learn_error_logged = True
            self.logger.warning("%s; learned timeouts are off for this rank", why, exc_info=True)

    def _learn_tick(self, now_ns: int, step: bool) -> None:
        """Count a step, take in noted events, then become active or loosen."""
        learn = self._learn
        assert learn is not None
        resumed = False
        if self._learn_noted:
            self._learn_seen |= self._learn_noted
            self._learn_noted.clear()
            resumed, self._learn_suspended = self._learn_suspended, False
        if not self._learn_active:
            if step and self._learn_steps < learn.steps_needed:
                self._learn_steps += 1
            if pending_reason(self._learn_steps, self._learn_seen, learn) is not None:
                return
            self._learn_active = True
            hb, sec = self._learned_timeouts(learn)
            self._apply_learned(hb, sec, force=True)
            seen = "".join(f", a {k}" for k in sorted(self._learn_seen))
            self.logger.info(
                "learned timeouts active after %d steps%s: %s",
                self._learn_steps,
                seen,
                self._describe_learned(hb, sec),
            )
            return
        if self._learn_suspended:
            return
        hb, sec = self._learned_timeouts(learn)
        changed = self._apply_learned(hb, sec, force=resumed)
        if changed and not resumed:
            self.logger.info("learned timeouts loosened: %s", self._describe_learned(hb, sec))

    def _learned_timeouts(
        self, learn: LearnSettings
    ) -> tuple[HeartbeatTimeouts | None, SectionTimeouts | None]:
        """The timeouts learning would put in force now (None: that kind untouched)."""
        cfg, calc = self.cfg, self._calc
        assert cfg is not None
        sf, floor = learn.safety_factor, learn.floor
        hb: HeartbeatTimeouts | None = None
        base_hb = self._base_hb
        if calc.prev_hb_ns and base_hb is not None:
            initial = learned_timeout(
                calc.initial_max_ns / _NS, cfg.initial_rank_heartbeat_timeout, sf, floor
            )
            subsequent = learned_timeout(
                calc.subsequent_max_ns / _NS, cfg.rank_heartbeat_timeout, sf, floor
            )
            if self._hb_calculated_here:
                initial = _at_least(initial, base_hb.initial)
                subsequent = _at_least(subsequent, base_hb.subsequent)
            hb = HeartbeatTimeouts(initial, subsequent, were_calculated=True)
        sec: SectionTimeouts | None = None
        base_sec = self._base_sec
        if self._sections_used and base_sec is not None:
            values = dict(base_sec.section)
            calculated = set(base_sec.calculated_sections)
            only = self._learn_sections
            for name, stat in calc.sections.items():
                if stat.max_ns <= 0 or (only is not None and name not in only):
                    continue
                value = learned_timeout(
                    stat.max_ns / _NS, cfg.rank_section_timeouts.get(name), sf, floor
                )
                if self._sec_calculated_here and name in base_sec.calculated_sections:
                    value = _at_least(value, base_sec.section.get(name))
                values[name] = value
                calculated.add(name)
            oos = base_sec.out_of_section
            oos_calculated = base_sec.is_out_of_section_calculated
            if calc.oos_max_ns > 0:
                oos = learned_timeout(
                    calc.oos_max_ns / _NS, cfg.rank_out_of_section_timeout, sf, floor
                )
                if self._sec_calculated_here and base_sec.is_out_of_section_calculated:
                    oos = _at_least(oos, base_sec.out_of_section)
                oos_calculated = True
            sec = SectionTimeouts(
                section=values,
                out_of_section=oos,
                calculated_sections=calculated,
                is_out_of_section_calculated=oos_calculated,
            )
        return hb, sec

    def _apply_learned(
        self, hb: HeartbeatTimeouts | None, sec: SectionTimeouts | None, *, force: bool
    ) -> bool:
        """Put learned timeouts in force (sent to the monitor when they changed)."""
        if hb is not None and (force or _hb_key(hb) != _hb_key(self.hb_timeouts)):
            self.hb_timeouts = hb
        else:
            hb = None
        if sec is not None and (force or _sec_key(sec) != _sec_key(self.section_timeouts)):
            self.section_timeouts = sec
        else:
            sec = None
        if hb is None and sec is None:
            return False
        self._send_timeouts(hb, sec)
        return True

    @staticmethod
    def _describe_learned(hb: HeartbeatTimeouts | None, sec: SectionTimeouts | None) -> str:
        parts = []
        if hb is not None:
            parts.append(f"heartbeat {_fmt(hb.subsequent)}")
        if sec is not None:
            inner = ", ".join(f"{n} {_fmt(v)}" for n, v in sorted(sec.section.items()))
            parts.append(f"sections {{{inner}}}, out-of-section {_fmt(sec.out_of_section)}")
        return "; ".join(parts) or "nothing to learn yet"

    def _cap_hb(self, hb: HeartbeatTimeouts) -> HeartbeatTimeouts:
        """A calculated value never above the configured one nor below the floor."""
        cfg = self.cfg
        assert cfg is not None
        return HeartbeatTimeouts(
            initial=_cap(hb.initial, cfg.initial_rank_heartbeat_timeout, self._floor_s),
            subsequent=_cap(hb.subsequent, cfg.rank_heartbeat_timeout, self._floor_s),
            were_calculated=hb.were_calculated,
        )

    def _cap_sec(self, sec: SectionTimeouts) -> SectionTimeouts:
        cfg = self.cfg
        assert cfg is not None
        floor = self._floor_s
        values = {
            name: (
                _cap(value, cfg.rank_section_timeouts.get(name), floor)
                if name in sec.calculated_sections
                else value
            )
            for name, value in sec.section.items()
        }
        oos = sec.out_of_section
        if sec.is_out_of_section_calculated:
            oos = _cap(oos, cfg.rank_out_of_section_timeout, floor)
        return dataclasses.replace(sec, section=values, out_of_section=oos)

    # ---------------------------------------------------------- control path

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        sock = self._sock
        if sock is None:
            raise RankMonitorClientError("not connected to a rank monitor")
        with self._lock:
            try:
                sock.sendall(encode_frame(message))
                reply, _ = recv_frame(sock)
            except (OSError, ProtocolError) as exc:
                raise RankMonitorClientError(f"rank monitor did not answer: {exc}") from exc
        if not reply.get("ok"):
            raise RankMonitorClientError(
                f"rank monitor refused {message['type']}: {reply.get('error')}"
            )
        return reply

    def _send_timeouts(self, hb: HeartbeatTimeouts | None, section: SectionTimeouts | None) -> None:
        message: dict[str, Any] = {"type": "set_timeouts", "heartbeat": None, "section": None}
        if hb is not None:
            message["heartbeat"] = {"initial": hb.initial, "subsequent": hb.subsequent}
        if section is not None:
            message["section"] = {
                "section": dict(section.section),
                "out_of_section": section.out_of_section,
            }
        try:
            self._request(message)
        except RankMonitorClientError as exc:
            # Training goes on with the timeouts computed here; the monitor keeps its own.
            self.logger.warning("could not send timeouts to the rank monitor: %s", exc)

    def _require_init(self, what: str) -> TimeoutsCalc:
        if not self.is_initialized or self.timeouts_calc is None:
            raise RankMonitorClientError(f"{what}() before init_workload_monitoring()")
        return self.timeouts_calc

    def _after_collective(self) -> None:
        """Count the finished collective as liveness for a rank that sends heartbeats.

        Waiting in the reduce for slower ranks is not an observed interval, so without
        this the new, tighter timeout could elapse before the rank's next heartbeat.
        The calculation's statistics are not touched.
        """
        if self._slots is not None and self._calc.prev_hb_ns:
            self._slots[LAST_HB_NS] = _monotonic_ns()

    def calculate_and_set_hb_timeouts(self, skip_if_not_ready: bool = False) -> bool:
        """Collective: calculate heartbeat timeouts from all ranks' data and apply them.

        Returns False (with ``skip_if_not_ready``) or raises when no rank has two heartbeats.
        """
        calc = self._require_init("calculate_and_set_hb_timeouts")
        if _dist_ready():
            calc.synchronize_all()
            self._after_collective()
        if not calc.can_get_hb_timeouts():
            if skip_if_not_ready:
                return False
            raise RankMonitorClientError("Not enough data to compute heartbeat timeouts.")
        self.hb_timeouts = self._cap_hb(calc.get_hb_timeouts(current=self.hb_timeouts))
        self._base_hb, self._hb_calculated_here = self.hb_timeouts, True
        self._send_timeouts(self.hb_timeouts, None)
        self.logger.info("calculated %s", self.hb_timeouts)
        self._learn_after_calculation()
        return True

    def _learn_after_calculation(self) -> None:
        """Megatron's calculate_and_set_* flow turns learning on (learn_timeouts: None)."""
        cfg = self.cfg
        if cfg is not None and cfg.learn_timeouts is None and self._learn is None:
            self.enable_learned_timeouts()

    def calculate_and_set_section_timeouts(
        self,
        selected_sections: Iterable[str] | None = None,
        calc_out_of_section: bool = True,
        skip_if_not_ready: bool = False,
    ) -> bool:
        """Collective: calculate section (and out-of-section) timeouts and apply them."""
        calc = self._require_init("calculate_and_set_section_timeouts")
        selected = None if selected_sections is None else list(selected_sections)
        try:
            calc.maybe_bump_oos_time()
            if _dist_ready():
                calc.synchronize_all()
                self._after_collective()
            ready = calc.can_get_section_timeouts(selected, calc_out_of_section)
            if not ready:
                if skip_if_not_ready:
                    return False
                raise RankMonitorClientError("Not enough data to compute section timeouts.")
            self.section_timeouts = self._cap_sec(
                calc.get_section_timeouts(
                    selected, calc_out_of_section, current=self.section_timeouts
                )
            )
        except TimeoutsCalcError as exc:
            raise RankMonitorClientError(str(exc)) from exc
        self._base_sec, self._sec_calculated_here = self.section_timeouts, True
        self._send_timeouts(None, self.section_timeouts)
        self.logger.info("calculated %s", self.section_timeouts)
        self._learn_after_calculation()
        return True

    def send_workload_control_request(self, req: WorkloadControlRequest) -> None:
        """Ask the launcher (through the monitor) to exclude this node or stop the workload."""
        self._require_init("send_workload_control_request")
        if not isinstance(req, WorkloadControlRequest):
            raise RankMonitorClientError(f"{req!r} is not a WorkloadControlRequest")
        self._request(
            {"type": "workload_control", "action": req.action.name, "description": req.description}
        )

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """The calculated timeouts, JSON-serialisable and identical on all ranks."""
        current: dict[str, Any] = {}
        hb = self.hb_timeouts
        if hb is not None and hb.were_calculated and hb.are_valid:
            current["heartbeat"] = dataclasses.asdict(hb)
        sec = self.section_timeouts
        if sec is not None and (sec.calculated_sections or sec.is_out_of_section_calculated):
            data = dataclasses.asdict(sec)
            data["calculated_sections"] = sorted(sec.calculated_sections)
            current["section"] = data
        return {self.CURRENT_TIMEOUTS_STATE_KEY: current}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore calculated timeouts; before init they are applied at init.

        Accepts what :meth:`state_dict` and NVRx write (see :mod:`nvrx.ft._state`). State
        that cannot be used (wrong shape, NaN, a timeout over 30 days...) never raises:
        it is logged at WARNING, saying why, and the configured timeouts stay.
        """
        try:
            loaded = parse_timeouts_state(state)
        except FtStateError as exc:
            self.logger.warning("ignoring saved FT state, using the configured timeouts: %s", exc)
            return
        if loaded.is_empty:
            return
        self.loaded_hb_timeouts = loaded.heartbeat
        self.loaded_section_timeouts = loaded.section
        if self.is_initialized:
            self._apply_loaded()

    def _apply_loaded(self) -> None:
        """Apply the calculated parts of a loaded state (raised to the floor, if any).

        Configured values stay for everything the state did not calculate.
        """
        hb, sec = self.loaded_hb_timeouts, self.loaded_section_timeouts
        floor = self._calc._floor
        if hb is not None and not hb.were_calculated:
            hb = None
        if hb is not None:
            hb = self._cap_hb(
                HeartbeatTimeouts(
                    initial=None if hb.initial is None else floor(hb.initial),
                    subsequent=None if hb.subsequent is None else floor(hb.subsequent),
                    were_calculated=True,
                )
            )
            self.hb_timeouts = self._base_hb = hb
        current = self.section_timeouts
        if sec is not None and current is not None:
            calculated = {n for n in sec.calculated_sections if n in current.section}
            dropped = sorted(set(sec.calculated_sections) - calculated)
            if dropped:
                self.logger.warning("ignoring loaded timeouts of unconfigured sections %s", dropped)
            merged = dict(current.section)
            for name in calculated:
                value = sec.section.get(name)
                merged[name] = None if value is None else floor(value)
            oos_calculated = sec.is_out_of_section_calculated
            oos = sec.out_of_section if oos_calculated else current.out_of_section
            if oos_calculated and oos is not None:
                oos = floor(oos)
            sec = self._cap_sec(
                SectionTimeouts(
                    section=merged,
                    out_of_section=oos,
                    calculated_sections=calculated,
                    is_out_of_section_calculated=oos_calculated,
                )
            )
            self.section_timeouts = self._base_sec = sec
        if hb is not None or sec is not None:
            self._send_timeouts(hb, sec)
