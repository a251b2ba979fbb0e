"""The rank monitor: one process per local rank that terminates the rank when it hangs.

It listens on a Unix socket in a private runtime directory for the rank's control
channel, hands each rank a shared memory block for heartbeats and sections, and checks
that block whenever a timeout falls due (and at least every ``workload_check_interval``).
It serves successive ranks of its local slot across restarts; each new rank starts from
the configured timeouts (calculated ones come back through the rank's state_dict).
It exits when its parent dies and removes its socket when it exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import pathlib
import select
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from typing import Any

from nvrx.ft._detection import (
    STEP_SECTION,
    ActiveTimeouts,
    Violation,
    find_violation,
    next_deadline_ns,
)
from nvrx.ft._events import (
    EventSender,
    RankConnected,
    RankDisconnected,
    RankFirstStep,
    RankTerminated,
    WorkloadRequest,
    encode_event,
)
from nvrx.ft._flight import TraceFetch
from nvrx.ft._health import HealthChecks, HealthError
from nvrx.ft._liveness import BeatWriter, beat_age, beat_path
from nvrx.ft._logs import log_formatter
from nvrx.ft._protocol import (
    MAX_MESSAGE_BYTES,
    FrameReader,
    ProtocolError,
    decode_payload,
    encode_frame,
    validate_request,
)
from nvrx.ft._runtime import check_private_dir, check_socket_path_length
from nvrx.ft._shm import SLOT_LAYOUT, RankSnapshot, SharedBlock
from nvrx.ft._stacks import dump_offset, read_appended, summarize_dump
from nvrx.ft._termination import RankProcess, Terminator
from nvrx.ft.config import FaultToleranceConfig
from nvrx.ft.data import workload_action_from_name

__all__ = ["RANK_MONITOR_INIT_TIMEOUT", "MonitorProcess", "RankMonitorServer"]

#: Default seconds :meth:`MonitorProcess.wait_ready` waits for a monitor to come up.
RANK_MONITOR_INIT_TIMEOUT = 30.0
#: Seconds a hung rank's flight recorder is read for, from the hang's detection.
FLIGHT_FETCH_TIMEOUT_S = 1.0
_NS = 1_000_000_000
_PARENT_CHECK_NS = _NS // 4
_UCRED = struct.Struct("3i")
#: Most control connections a monitor keeps; a new one beyond it evicts the oldest
#: connection that is not the watched rank's, so idle clients cannot lock the rank out.
MAX_CONNECTIONS = 16
#: Most reply bytes queued for a client that does not read them; beyond it, it is dropped.
MAX_PENDING_REPLY_BYTES = 256 * 1024
#: Pause before accepting again after the process or system ran out of file descriptors.
_ACCEPT_PAUSE_NS = _NS // 2
#: How often the monitor looks for a rank's first step until it has seen it: the error
#: of rank_first_step's time (the rank's hot path does nothing for it).
_FIRST_STEP_POLL_NS = _NS // 20
_OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class _RankFilter(logging.Filter):
    def __init__(self, server: RankMonitorServer) -> None:
        super().__init__()
        self._server = server

    def filter(self, record: logging.LogRecord) -> bool:
        watched = self._server._watched
        record.ftrank = "<none>" if watched is None else str(watched.rank)
        record.local_rank = self._server.local_rank
        return True


def _make_logger(server: RankMonitorServer, level: int) -> logging.Logger:
    logger = logging.getLogger(f"nvrx.ft.monitor.{server.local_rank}")
    logger.setLevel(level)
    logger.propagate = False
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            log_formatter("RankMonitor %(process)d local_rank %(local_rank)s rank %(ftrank)s")
        )
        logger.addHandler(handler)
    logger.addFilter(_RankFilter(server))
    return logger


@dataclasses.dataclass
class _Conn:
    sock: socket.socket
    pid: int
    uid: int
    reader: FrameReader = dataclasses.field(default_factory=FrameReader)
    outbuf: bytearray = dataclasses.field(default_factory=bytearray)
    writing: bool = False


@dataclasses.dataclass
class _Watched:
    conn: _Conn
    proc: RankProcess
    rank: int
    local_rank: int
    init_ns: int
    block: SharedBlock
    sections: tuple[str, ...]
    timeouts: ActiveTimeouts
    stack_dump: bool
    #: True once its rank_first_step event went out (or nobody listens for events).
    first_step_sent: bool = False


def _hang_evidence(event: RankTerminated, snap: RankSnapshot, init_ns: int) -> RankTerminated:
    """The event with the rank's last activity: heartbeat, section open or close."""
    now_ns, now_wall = time.monotonic_ns(), time.time()  # wall clock: label
    opened = [t for _, t in snap.open_sections]
    last = max([snap.last_hb_ns, snap.oos_since_ns, *opened, init_ns])
    age_s = max(now_ns - last, 0) / _NS
    return dataclasses.replace(
        event,
        last_activity_s=round(age_s, 6),
        last_activity_wall=round(now_wall - age_s, 6),
        last_heartbeat_s=(
            round(max(now_ns - snap.last_hb_ns, 0) / _NS, 6) if snap.last_hb_ns else None
        ),
        open_sections=tuple(name for name, _ in snap.open_sections),
    )


def _first_step(snap: RankSnapshot, init_ns: int, now_ns: int) -> tuple[int, str] | None:
    """When (monotonic ns) and how the rank finished its first iteration, if it has.

    The first heartbeat after init, or the first end of a ``step`` section (the rank
    counts its first two ``step`` openings in ``STEPS_STARTED``), whichever came first.
    The heartbeat slot holds the latest beat, so a rank beating faster than the poll is
    reported up to one poll late; otherwise the earliest moment the block proves (never
    later than ``now_ns``).
    """
    if snap.last_hb_ns > init_ns:
        return snap.last_hb_ns, "heartbeat"
    step_open = next((t for name, t in snap.open_sections if name == STEP_SECTION), 0)
    if snap.steps_started >= 2 and step_open:
        return min(step_open, now_ns), "section"  # the second step opened after the first ended
    if snap.steps_started >= 1 and not step_open and init_ns < snap.oos_since_ns <= now_ns:
        # The count is bumped before the open time is stored: a step counted but not
        # open yet has no close time after init, and is looked at again next poll.
        return snap.oos_since_ns, "section"
    return None


def _peer_credentials(sock: socket.socket) -> tuple[int, int]:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, _gid = _UCRED.unpack(raw)
    return pid, uid


class RankMonitorServer:
    """The monitor of one local rank slot. Run it with :meth:`run_in_subprocess`."""

    def __init__(
        self,
        cfg: FaultToleranceConfig,
        socket_path: str | os.PathLike[str],
        *,
        local_rank: int = 0,
        events_socket: str | os.PathLike[str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.socket_path = pathlib.Path(socket_path)
        self.local_rank = local_rank
        self._watched: _Watched | None = None
        self.logger = _make_logger(self, cfg.log_level)
        self._events = EventSender(events_socket, self.logger)
        self._health: HealthChecks | None = None  # created at the first check: fast start-up
        self._conns: dict[socket.socket, _Conn] = {}
        self._terminations: list[Terminator] = []
        self._sel = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._socket_ino: int | None = None
        self._stopping = False
        self._ppid = os.getppid()
        self._next_health_ns = 0
        self._accept_paused_until = 0
        self._logged_once: set[str] = set()
        self._beat: BeatWriter | None = None

    # ----------------------------------------------------------------- lifecycle

    def _bind(self) -> socket.socket:
        path = self.socket_path
        check_private_dir(path.parent)
        if path.exists() or path.is_symlink():
            mode = path.lstat().st_mode
            if not stat.S_ISSOCK(mode):
                raise FileExistsError(f"{path} exists and is not a socket; not removing it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(os.fspath(path))
            except (ConnectionRefusedError, FileNotFoundError):
                self.logger.warning("removing stale socket %s", path)
                path.unlink(missing_ok=True)
            else:
                raise RuntimeError(f"another monitor is already listening on {path}")
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(os.fspath(path))
        os.chmod(path, 0o600)
        self._socket_ino = path.stat().st_ino
        listener.listen(MAX_CONNECTIONS)
        listener.setblocking(False)
        self._beat = BeatWriter(beat_path(path))
        return listener

    def serve(self, ready_fd: int | None = None) -> int:
        """Bind, report readiness on ``ready_fd``, and serve until stopped or orphaned.

        Runs in the main thread of a process of its own (it installs SIGTERM/SIGINT
        handlers); :meth:`run_in_subprocess` is the way to start one.
        """
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        old_wakeup = signal.set_wakeup_fd(wake_w.fileno())
        handlers = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            self._listener = self._bind()
            self._sel.register(self._listener, selectors.EVENT_READ, "accept")
            self._sel.register(wake_r, selectors.EVENT_READ, "wake")
            self.logger.info("listening on %s (pid %d)", self.socket_path, os.getpid())
            if ready_fd is not None:
                os.write(ready_fd, b"ready\n")
                os.close(ready_fd)
            self._loop(wake_r)
            return 0
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            self._cleanup()
            wake_r.close()
            wake_w.close()

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stopping = True

    def _cleanup(self) -> None:
        if self._watched is not None:
            self._forget("monitor stopping")
        for conn in list(self._conns.values()):
            self._close_conn(conn)
        for term in self._terminations:
            term.proc.close()
        self._terminations.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            try:
                if self.socket_path.stat().st_ino == self._socket_ino:
                    self.socket_path.unlink()
            except FileNotFoundError:
                pass
        if self._beat is not None:
            self._beat.close(remove=True)
            self._beat = None
        if self._health is not None:
            self._health.close()
        self._events.close()
        self._sel.close()
        self.logger.info("stopped")

    # ---------------------------------------------------------------- main loop

    def _loop(self, wake: socket.socket) -> None:
        check_ns = int(self.cfg.workload_check_interval * _NS)
        next_parent_check = 0
        while not self._stopping:
            now = time.monotonic_ns()
            if self._beat is not None:
                self._beat.beat(now)
            if now >= next_parent_check:
                next_parent_check = now + _PARENT_CHECK_NS
                if os.getppid() != self._ppid:
                    self.logger.warning("parent process %d is gone; exiting", self._ppid)
                    return
            try:
                wake_at = self._tick(now)
            except Exception:
                # A bug here must never end hang detection: log it and keep checking.
                self._log_once("tick", "internal error while checking the rank")
                wake_at = now + check_ns
            wake_at = min(wake_at, now + check_ns, next_parent_check)
            timeout = max(0.001, (wake_at - time.monotonic_ns()) / _NS)
            if self._accept_paused_until:
                wake_at = min(wake_at, self._accept_paused_until)
                timeout = max(0.001, (wake_at - time.monotonic_ns()) / _NS)
            for key, mask in self._sel.select(timeout):
                try:
                    self._dispatch(key.data, wake, mask)
                except Exception:
                    self._log_once("dispatch", "internal error while serving a connection")

    def _log_once(self, key: str, message: str) -> None:
        """Log an unexpected exception with its traceback the first time only."""
        if key in self._logged_once:
            self.logger.debug(message, exc_info=True)
        else:
            self._logged_once.add(key)
            self.logger.exception("%s (further ones at DEBUG)", message)

    def _dispatch(self, data: object, wake: socket.socket, mask: int) -> None:
        if data == "accept":
            self._accept()
        elif data == "wake":
            with contextlib.suppress(BlockingIOError):
                wake.recv(4096)
        elif isinstance(data, _Conn):
            if mask & selectors.EVENT_WRITE:
                self._flush(data)
            if mask & selectors.EVENT_READ and data.sock in self._conns:
                self._on_readable(data)
        # "pidfd": the next tick notices the exit

    def _tick(self, now: int) -> int:
        """Check the watched rank and advance terminations; return the next wake-up time."""
        wake_at = now + 3600 * _NS
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0
            if self._listener is not None:
                self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        watched = self._watched
        if watched is not None:
            if watched.proc.has_exited():
                self.logger.info("rank pid %d exited", watched.proc.pid)
                self._forget("rank exited")
            else:
                snap = watched.block.snapshot(watched.sections)
                violation = find_violation(snap, watched.timeouts, watched.init_ns, now)
                if violation is not None:
                    self._terminate(violation)
                else:
                    deadline = next_deadline_ns(snap, watched.timeouts, watched.init_ns)
                    if deadline is not None:
                        wake_at = min(wake_at, deadline + 1)
                    if not watched.first_step_sent:
                        wake_at = min(wake_at, self._check_first_step(watched, snap, now))
        if self._watched is not None:
            if now >= self._next_health_ns:
                self._next_health_ns = now + int(self.cfg.node_health_check_interval * _NS)
                self._check_health()
            wake_at = min(wake_at, self._next_health_ns)
        for term in list(self._terminations):
            due = term.advance(now)
            if due is None:
                self._terminations.remove(term)
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(term.proc.pidfd)
                term.proc.close()
            else:
                wake_at = min(wake_at, due)
        return wake_at

    def _check_first_step(self, watched: _Watched, snap: RankSnapshot, now: int) -> int:
        """Send rank_first_step once the block shows it; return when to look again."""
        if not self._events.enabled:
            watched.first_step_sent = True
            return now + 3600 * _NS
        seen = _first_step(snap, watched.init_ns, now)
        if seen is None:
            return now + _FIRST_STEP_POLL_NS
        at_ns, via = seen
        watched.first_step_sent = True
        age_s = max(now - at_ns, 0) / _NS
        self._events.send(
            RankFirstStep(
                local_rank=self.local_rank,
                rank=watched.rank,
                pid=watched.proc.pid,
                step_wall=round(time.time() - age_s, 6),  # wall clock: label
                since_init_s=round(max(at_ns - watched.init_ns, 0) / _NS, 6),
                via=via,
            )
        )
        self.logger.debug("rank %d finished its first step (%s)", watched.rank, via)
        return now + 3600 * _NS

    def _check_health(self) -> None:
        if self._health is None:
            self._health = HealthChecks(self.cfg, self.local_rank, self.logger)
        try:
            self._health.check()
        except HealthError as exc:
            self._terminate(Violation(exc.cause, 0.0, 0.0), detail=str(exc))

    # -------------------------------------------------------------- termination

    def _terminate(self, violation: Violation, detail: str | None = None) -> None:
        watched = self._watched
        assert watched is not None
        message = detail or violation.message
        proc_state = watched.proc.state()  # before any signal: SIGCONT turns a 'T' into 'R'
        self.logger.error(
            "terminating rank %d (pid %d): %s", watched.rank, watched.proc.pid, message
        )
        event = _hang_evidence(
            RankTerminated(
                local_rank=self.local_rank,
                rank=watched.rank,
                pid=watched.proc.pid,
                cause=violation.cause,
                section=violation.section,
                observed_s=None if detail else round(violation.observed_s, 6),
                limit_s=None if detail else round(violation.limit_s, 6),
                message=message,
                proc_state=proc_state,
            ),
            watched.block.snapshot(watched.sections),
            watched.init_ns,
        )
        dump_signal = self.cfg.stack_dump_signal if watched.stack_dump else None
        offset = None if dump_signal is None else dump_offset(watched.proc.pid)
        after_dump = None
        if offset is None:
            self._events.send(event)
        else:
            # The event waits for the dump (at most STACK_DUMP_PAUSE_S) to carry its summary
            # and the rank's flight recorder, read meanwhile (before the rank is signalled;
            # a slow answer is waited for until the fetch's own timeout).
            pid = watched.proc.pid
            flight = TraceFetch(pid, FLIGHT_FETCH_TIMEOUT_S)

            def after_dump() -> None:
                try:
                    stack = summarize_dump(read_appended(pid, offset))
                except Exception:  # the evidence is optional; the event is not
                    self.logger.exception("could not summarise rank %d's stack dump", pid)
                    stack = None
                collective = flight.result()
                self._events.send(dataclasses.replace(event, stack=stack, collective=collective))

        term = Terminator(
            watched.proc,
            term_signal=self.cfg.rank_termination_signal,
            grace_period_s=self.cfg.rank_termination_grace_period,
            dump_signal=dump_signal,
            logger=self.logger,
            after_dump=after_dump,
        )
        self._terminations.append(term)
        self._sel.unregister(watched.proc.pidfd)
        self._sel.register(watched.proc.pidfd, selectors.EVENT_READ, "pidfd")
        self._release_watched(keep_proc=True)
        term.advance(time.monotonic_ns())

    # ------------------------------------------------------------- connections

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno not in _OUT_OF_FDS:
                raise
            # The connection stays queued; accepting again at once would spin.
            if "out_of_fds" not in self._logged_once:
                self._logged_once.add("out_of_fds")
                self.logger.error(
                    "cannot accept connections: %s; retrying every %.1f s (logged once)",
                    exc,
                    _ACCEPT_PAUSE_NS / _NS,
                )
            self._sel.unregister(self._listener)
            self._accept_paused_until = time.monotonic_ns() + _ACCEPT_PAUSE_NS
            return
        try:
            pid, uid = _peer_credentials(sock)
        except OSError:
            sock.close()
            return
        if uid != os.getuid():
            self.logger.warning(
                "rejected connection from pid %d: uid %d is not ours (%d)", pid, uid, os.getuid()
            )
            sock.close()
            return
        if len(self._conns) >= MAX_CONNECTIONS:
            watched = None if self._watched is None else self._watched.conn
            oldest = next((c for c in self._conns.values() if c is not watched), None)
            if oldest is not None:
                self.logger.warning(
                    "%d connections open: dropping the oldest (pid %d) for pid %d",
                    len(self._conns),
                    oldest.pid,
                    pid,
                )
                self._close_conn(oldest)
        sock.setblocking(False)
        conn = _Conn(sock, pid, uid)
        self._conns[sock] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)
        self.logger.debug("connection from pid %d", pid)

    def _close_conn(self, conn: _Conn) -> None:
        if self._watched is not None and self._watched.conn is conn:
            self._forget("control connection closed")
        self._conns.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(MAX_MESSAGE_BYTES)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return
        except OSError as exc:
            self.logger.info("connection from pid %d failed: %s", conn.pid, exc)
            self._close_conn(conn)
            return
        if not data:
            if conn.reader.pending:
                self.logger.warning(
                    "pid %d closed its connection in the middle of a message "
                    "(%d bytes pending); dropped",
                    conn.pid,
                    conn.reader.pending,
                )
            self._close_conn(conn)
            return
        try:
            payloads = conn.reader.feed(data)
        except ProtocolError as exc:
            self.logger.warning("closing connection from pid %d: %s", conn.pid, exc)
            self._reply(conn, {"ok": False, "error": str(exc)})
            self._close_conn(conn)
            return
        for payload in payloads:
            if conn.sock not in self._conns:
                return
            self._handle(conn, payload)

    def _reply(self, conn: _Conn, message: dict[str, Any], fds: list[int] | None = None) -> bool:
        """Queue a reply and send what the socket takes now; never blocks.

        A client whose unread replies pass MAX_PENDING_REPLY_BYTES is dropped. Returns
        False when the reply cannot be delivered (then the connection may be closed).
        """
        if conn.sock not in self._conns:
            return False
        frame = encode_frame(message)
        if fds:
            if conn.outbuf:
                self.logger.warning(
                    "pid %d has unread replies; cannot hand over its block", conn.pid
                )
                return False
            try:
                sent = socket.send_fds(conn.sock, [frame], fds)
            except (BlockingIOError, InterruptedError):
                self.logger.warning("pid %d does not read its replies; init not answered", conn.pid)
                return False
            except OSError as exc:
                self.logger.warning("could not reply to pid %d: %s", conn.pid, exc)
                return False
            frame = frame[sent:]
            if not frame:
                return True
        if len(conn.outbuf) + len(frame) > MAX_PENDING_REPLY_BYTES:
            self.logger.warning(
                "pid %d does not read its replies (%d bytes pending); dropping its connection",
                conn.pid,
                len(conn.outbuf),
            )
            self._close_conn(conn)
            return False
        conn.outbuf += frame
        return self._flush(conn)

    def _flush(self, conn: _Conn) -> bool:
        """Send queued reply bytes the socket takes now; watch for writability if any remain."""
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self.logger.info("could not reply to pid %d: %s", conn.pid, exc)
                self._close_conn(conn)
                return False
            del conn.outbuf[:sent]
        writing = bool(conn.outbuf)
        if writing != conn.writing and conn.sock in self._conns:
            conn.writing = writing
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
            self._sel.modify(conn.sock, events, conn)
        return True

    def _handle(self, conn: _Conn, payload: bytes) -> None:
        try:
            message = validate_request(decode_payload(payload))
        except ProtocolError as exc:
            self.logger.warning("rejected malformed message from pid %d: %s", conn.pid, exc)
            self._reply(conn, {"ok": False, "error": f"malformed message: {exc}"})
            return
        kind = message["type"]
        try:
            if kind == "init":
                self._on_init(conn, message)
            elif kind == "set_timeouts":
                self._on_set_timeouts(conn, message)
            elif kind == "workload_control":
                self._on_workload_control(conn, message)
            else:
                self._on_shutdown(conn)
        except ProtocolError as exc:
            self.logger.warning("rejected %s from pid %d: %s", kind, conn.pid, exc)
            self._reply(conn, {"ok": False, "error": str(exc)})
        except Exception:
            self._log_once(f"handle:{kind}", f"internal error while handling {kind}")
            self._reply(conn, {"ok": False, "error": f"internal error while handling {kind}"})

    # ---------------------------------------------------------------- requests

    def _on_init(self, conn: _Conn, message: dict[str, Any]) -> None:
        watched_now = self._watched
        if watched_now is not None:
            if watched_now.conn is conn:
                raise ProtocolError("this connection already initialised monitoring")
            if not watched_now.proc.has_exited():
                # A DataLoader worker or other child running the rank's code: taking over
                # would silently end hang detection for the real rank.
                raise ProtocolError(
                    f"this monitor watches rank {watched_now.rank} (pid {watched_now.proc.pid}) "
                    f"until it exits; a second init_workload_monitoring from pid {conn.pid} is "
                    "refused (call it once, in the training process, not in its workers)"
                )
            self._forget("rank exited")
        try:
            proc = RankProcess(conn.pid)
        except OSError as exc:
            raise ProtocolError(f"cannot watch pid {conn.pid}: {exc}") from None
        cfg = self.cfg
        sections = tuple(sorted(cfg.rank_section_timeouts))
        init_ns = time.monotonic_ns()
        try:
            block, fd = SharedBlock.create(len(sections), init_ns, cfg.num_warmup_iterations)
        except OSError as exc:
            proc.close()
            raise ProtocolError(f"cannot create the shared memory block: {exc}") from None
        watched = _Watched(
            conn=conn,
            proc=proc,
            rank=message["rank"],
            local_rank=message["local_rank"],
            init_ns=init_ns,
            block=block,
            sections=sections,
            timeouts=ActiveTimeouts(
                initial_heartbeat=cfg.initial_rank_heartbeat_timeout,
                heartbeat=cfg.rank_heartbeat_timeout,
                sections=dict(cfg.rank_section_timeouts),
                out_of_section=cfg.rank_out_of_section_timeout,
            ),
            stack_dump=message["stack_dump"],
        )
        reply = {
            "ok": True,
            "config": cfg.to_dict(),
            "sections": list(sections),
            "init_ns": init_ns,
            "slots": dict(SLOT_LAYOUT),
        }
        try:
            sent = self._reply(conn, reply, [fd])
        finally:
            os.close(fd)
        if not sent:
            block.close()
            proc.close()
            return
        self._watched = watched
        self._sel.register(proc.pidfd, selectors.EVENT_READ, "pidfd")
        self._next_health_ns = 0
        self.logger.info(
            "monitoring rank %d (local rank %d, pid %d, host %s); timeouts: %s",
            watched.rank,
            watched.local_rank,
            proc.pid,
            message["host"],
            self._describe(watched.timeouts),
        )
        self._event(RankConnected, watched)

    def _on_set_timeouts(self, conn: _Conn, message: dict[str, Any]) -> None:
        watched = self._watched
        if watched is None or watched.conn is not conn:
            raise ProtocolError("set_timeouts before init")
        t = watched.timeouts
        initial, heartbeat, sections, oos = (
            t.initial_heartbeat,
            t.heartbeat,
            t.sections,
            t.out_of_section,
        )
        hb = message.get("heartbeat")
        if hb is not None:
            initial, heartbeat = hb.get("initial"), hb.get("subsequent")
        sec = message.get("section")
        if sec is not None:
            unknown = sorted(set(sec["section"]) - set(watched.sections))
            if unknown:
                raise ProtocolError(
                    f"unknown sections {unknown}; configured: {list(watched.sections)}"
                )
            sections = {**sections, **sec["section"]}
            oos = sec.get("out_of_section")
        watched.timeouts = ActiveTimeouts(initial, heartbeat, sections, oos)
        self.logger.info("timeouts updated: %s", self._describe(watched.timeouts))
        self._reply(conn, {"ok": True})

    def _on_workload_control(self, conn: _Conn, message: dict[str, Any]) -> None:
        try:
            action = workload_action_from_name(message["action"])
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        watched = self._watched
        rank = watched.rank if watched is not None and watched.conn is conn else -1
        self.logger.info(
            "rank %d (pid %d) requests %s: %s", rank, conn.pid, action.name, message["description"]
        )
        if not self._events.enabled:
            raise ProtocolError("no launcher is listening for workload control requests")
        event = WorkloadRequest(
            local_rank=self.local_rank,
            rank=rank,
            pid=conn.pid,
            action=action.name,
            description=message["description"],
        )
        try:
            encode_event(event)
        except ValueError as exc:
            raise ProtocolError(f"request too large for the launcher: {exc}") from None
        sent = self._events.send(event)
        if not sent:
            raise ProtocolError("the launcher could not be reached")
        self._reply(conn, {"ok": True})

    def _on_shutdown(self, conn: _Conn) -> None:
        if self._watched is not None and self._watched.conn is conn:
            self._forget("rank shut down monitoring")
        self._reply(conn, {"ok": True})

    # ------------------------------------------------------------------ helpers

    def _event(self, kind: type[RankConnected | RankDisconnected], watched: _Watched) -> None:
        self._events.send(kind(local_rank=self.local_rank, rank=watched.rank, pid=watched.proc.pid))

    def _forget(self, why: str) -> None:
        watched = self._watched
        assert watched is not None
        snap = watched.block.snapshot(watched.sections)
        if snap.open_sections:
            self.logger.warning(
                "stopped monitoring rank %d (%s) with sections still open: %s",
                watched.rank,
                why,
                [name for name, _ in snap.open_sections],
            )
        else:
            self.logger.info("stopped monitoring rank %d (%s)", watched.rank, why)
        self._event(RankDisconnected, watched)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(watched.proc.pidfd)
        self._release_watched(keep_proc=False)

    def _release_watched(self, *, keep_proc: bool) -> None:
        watched = self._watched
        assert watched is not None
        self._watched = None
        watched.block.close()
        if not keep_proc:
            watched.proc.close()

    @staticmethod
    def _describe(t: ActiveTimeouts) -> str:
        return json.dumps(dataclasses.asdict(t))

    # ------------------------------------------------------------- subprocess

    @staticmethod
    def run_in_subprocess(
        cfg: FaultToleranceConfig,
        ipc_socket_path: str | os.PathLike[str],
        is_restarter_logger: bool = False,
        mp_ctx: object = None,
        *,
        local_rank: int = 0,
        events_socket: str | os.PathLike[str] | None = None,
        stderr: int | None = None,
        env: dict[str, str] | None = None,
        ready_timeout: float = RANK_MONITOR_INIT_TIMEOUT,
    ) -> MonitorProcess:
        """Start a monitor process and return once it listens (NVRx's call shape).

        The handle has what NVRx's ``multiprocessing.Process`` has (``pid``,
        ``is_alive()``, ``terminate()``, ``kill()``, ``join(timeout)``, ``exitcode``).
        ``mp_ctx`` is accepted and not used: the monitor is a fresh interpreter, never
        a fork, whatever the context; ``is_restarter_logger`` (NVRx's layered-restart
        log) has no counterpart and is accepted. ValueError if the socket path is too
        long for Linux to bind. RuntimeError if the monitor dies or is
        not listening within ``ready_timeout``; it is then killed. To start several
        monitors and overlap their start-up, use :meth:`start_in_subprocess`.
        """
        del is_restarter_logger, mp_ctx
        check_private_dir(pathlib.Path(ipc_socket_path).parent)
        check_socket_path_length(ipc_socket_path)
        proc = RankMonitorServer.start_in_subprocess(
            cfg,
            ipc_socket_path,
            local_rank=local_rank,
            events_socket=events_socket,
            stderr=stderr,
            env=env,
        )
        try:
            proc.wait_ready(ready_timeout)
        except BaseException:
            proc.kill()
            raise
        return proc

    @staticmethod
    def start_in_subprocess(
        cfg: FaultToleranceConfig,
        socket_path: str | os.PathLike[str],
        *,
        local_rank: int = 0,
        events_socket: str | os.PathLike[str] | None = None,
        stderr: int | None = None,
        env: dict[str, str] | None = None,
    ) -> MonitorProcess:
        """Start a monitor process and return at once; see :class:`MonitorProcess`.

        The child is a fresh interpreter (not a fork) running
        ``python -m nvrx.ft._monitor_main --socket PATH ...``, which never imports torch.
        Call :meth:`MonitorProcess.wait_ready` before starting the rank; start several
        monitors first and wait for them afterwards to overlap their start-up. The
        monitor dies with this process (PDEATHSIG plus parent polling), so call this
        from a thread that lives as long as the caller. Its log goes to ``stderr``
        (a file descriptor; default: ours). The socket's directory must be private
        (see :func:`nvrx.ft._runtime.check_private_dir`); the monitor exits with an
        error otherwise (:meth:`run_in_subprocess` checks it before starting one).
        """
        read_fd, write_fd = os.pipe()
        try:
            cmd = [
                sys.executable,
                "-m",
                "nvrx.ft._monitor_main",
                "--socket",
                os.fspath(socket_path),
                "--local-rank",
                str(local_rank),
                "--ready-fd",
                str(write_fd),
                "--config-json",
                json.dumps(cfg.to_dict()),
                "--parent-pid",
                str(os.getpid()),
            ]
            if events_socket is not None:
                cmd += ["--events-socket", os.fspath(events_socket)]
            popen = subprocess.Popen(
                cmd, pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stderr=stderr, env=env
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        return MonitorProcess(popen, read_fd, pathlib.Path(socket_path))


class MonitorProcess:
    """Handle on a monitor started by :meth:`RankMonitorServer.start_in_subprocess`."""

    def __init__(
        self, popen: subprocess.Popen[bytes], ready_fd: int, socket_path: pathlib.Path
    ) -> None:
        self._popen = popen
        self._ready_fd: int | None = ready_fd
        self._ready = False
        self.socket_path = socket_path

    @property
    def pid(self) -> int:
        """The monitor's process id."""
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """Exit status once it has exited, else None."""
        return self._popen.poll()

    @property
    def exitcode(self) -> int | None:
        """As ``multiprocessing.Process.exitcode``: the status, ``-N`` for signal N, or None."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        """True while the monitor process runs."""
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        """Wait for the monitor to exit, at most ``timeout`` seconds (as Process.join)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=timeout)
        if self._popen.poll() is not None:
            self._close_ready_fd()

    def beat_age(self) -> float | None:
        """Seconds since the monitor's loop last turned (see :func:`nvrx.ft.monitor_beat_age`).

        None before it listens. A running monitor stays below about
        :data:`nvrx.ft._liveness.BEAT_PERIOD_S`; a stopped (SIGSTOP) one keeps growing.
        """
        return beat_age(self.socket_path)

    def wait_ready(self, timeout: float = RANK_MONITOR_INIT_TIMEOUT) -> None:
        """Block until the monitor listens; RuntimeError if it died or did not come up in time."""
        if self._ready:
            return
        fd = self._ready_fd
        if fd is None:
            raise RuntimeError(f"rank monitor (pid {self.pid}) never became ready")
        deadline = time.monotonic() + timeout
        data = b""
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"rank monitor (pid {self.pid}) not ready after {timeout:.1f} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 64)
                if not chunk:
                    self._close_ready_fd()
                    code = self._popen.wait(timeout=5.0)
                    raise RuntimeError(
                        f"rank monitor (pid {self.pid}) exited with code {code} before it was ready"
                    )
                data += chunk
        self._close_ready_fd()
        self._ready = True

    def _close_ready_fd(self) -> None:
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None

    def terminate(self) -> None:
        """Send SIGTERM without waiting (stop many monitors in parallel, then ``stop``)."""
        if self._popen.poll() is None:
            self._popen.terminate()

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; return the exit status."""
        self._close_ready_fd()
        if self._popen.poll() is None:
            self._popen.terminate()
            try:
                return self._popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._popen.kill()
        return self._popen.wait()

    def kill(self) -> None:
        """SIGKILL the monitor (tests, and a launcher that gave up on it)."""
        if self._popen.poll() is None:
            self._popen.kill()
        self._popen.wait()
        self._close_ready_fd()
