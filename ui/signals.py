"""SIGINT (Ctrl-C) and SIGTERM in the GUI, handled as `reconstudio run` handles them: the run
stops after the current frame, its session is flushed, marked cut short ("interrupted (SIGTERM)")
and closed (lock released), the settings are saved, and the process exits 130 / 143.

Why a wake-up socket: Python runs a signal handler only when the main thread executes Python
bytecode. A Qt event loop waits in C++, so a handler would wait for the next Python slot (forever
on an idle window), and Python's default SIGINT handler raises KeyboardInterrupt inside whatever
Python code happens to run next (a paint event), which Qt swallows and the app goes on. Here the
C-level handler writes the signal number to a socket (`signal.set_wakeup_fd`), a QSocketNotifier
wakes the event loop, and the slot reads which signals arrived; the Python-level handler does
nothing, so no exception is ever raised in drawing code.

While the shutdown waits for the engine thread (the current push), the GUI thread is blocked: a
second signal is read when that wait returns, and is ignored then (the shutdown is already under way).
"""
from __future__ import annotations

import logging
import signal
import socket
from typing import Callable, Optional

from PySide6 import QtCore

log = logging.getLogger(__name__)

NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}     # 128 + the signal number, as a shell reports


class SignalWatcher(QtCore.QObject):
    """Turns SIGINT / SIGTERM into the Qt signal `received(signum)` on the GUI thread. Create it
    on the main thread; `close()` restores the previous handlers."""

    received = QtCore.Signal(int)

    def __init__(self, parent: Optional[QtCore.QObject] = None, signals=tuple(NAMES)):
        super().__init__(parent)
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        self._notifier = QtCore.QSocketNotifier(self._r.fileno(), QtCore.QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self._drain)
        self._old = {s: signal.signal(s, self._python_handler) for s in signals}

    @staticmethod
    def _python_handler(signum, frame) -> None:
        """Nothing to do here: the wake-up byte carries the signal to `_drain` (never raise:
        this runs inside whatever Python code the GUI thread happens to run)."""

    def _drain(self, *_) -> None:
        try:
            data = self._r.recv(256)
        except (BlockingIOError, InterruptedError):
            return
        for signum in data:
            if signum in self._old:
                self.received.emit(int(signum))

    def close(self) -> None:
        if self._old is None:
            return
        for s, h in self._old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(self._old_fd)
        self._notifier.setEnabled(False)
        self._r.close()
        self._w.close()
        self._old = None


def quit_on_signals(app, win, before_exit: Optional[Callable[[int], None]] = None) -> SignalWatcher:
    """SIGINT / SIGTERM end the GUI cleanly (see the module docstring): `win.stop_run` with the
    signal as the reason (the session is marked "interrupted"), the window closed (its closeEvent
    saves the settings and ends second views), then `app.exit(130 | 143)`. The code is also kept
    in `watcher.exit_code` for the caller's return value."""
    watcher = SignalWatcher(app)
    watcher.exit_code = 0

    def on_signal(signum: int) -> None:
        if watcher.exit_code:                  # a second signal while shutting down: already going
            return
        watcher.exit_code = EXIT_CODES.get(signum, 128 + signum)
        name = NAMES.get(signum, f"signal {signum}")
        log.warning("%s: stopping the run, closing its session and saving the settings", name)
        win.stop_run(wait=True, reason=name)
        if before_exit is not None:
            before_exit(signum)
        win.close()
        app.exit(watcher.exit_code)

    watcher.received.connect(on_signal)
    return watcher
