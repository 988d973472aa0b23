"""`reconstudio gui`: open the desktop application; options make a full GUI run scriptable.

    reconstudio gui --input VIDEO --autostart --screenshot shot.png --exit-when-done

Module level imports nothing heavy (no Qt): the CLI builds its parser without loading Qt.
"""
from __future__ import annotations

import argparse
import sys

from engine.api import setting_fields

_SAVED = [f.name for f, _ in setting_fields()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", metavar="PATH", help="video file, image folder, or webcam as N / webcam:N")
    p.add_argument("--autostart", action="store_true", help="start reconstructing at once")
    p.add_argument("--speed", type=float, metavar="X",
                   help="replay speed for files: 0 = as fast as possible (default), 1 = real time, N = N×")
    p.add_argument("--max-frames", type=int, metavar="N", help="stop after N input frames")
    p.add_argument("--loop", action="store_true",
                   help="files: start again at the end (a soak test; stop with --max-frames or the window)")
    p.add_argument("--stop-after", type=float, metavar="SECONDS",
                   help="stop the run after this many seconds (with --loop: a timed soak test)")
    p.add_argument("--stats-csv", metavar="FILE",
                   help="write one row of run statistics per second: frames, engine_fps, viewer_fps, rss_mb, "
                        "gpu_allocated_mb, viewer_points, viewer_buffer_bytes, loop_gap_p99_ms, dropped")
    p.add_argument("--session-dir", metavar="DIR",
                   help="save runs in new sub-folders of DIR (default: $RECONSTUDIO_SESSIONS or "
                        "~/.local/share/reconstudio/sessions)")
    p.add_argument("--open-session", metavar="DIR", help="show a saved session folder at start")
    p.add_argument("--ground-truth", metavar="TUM_FILE",
                   help="with --open-session: show this reference trajectory beside the run, aligned by Sim(3)")
    p.add_argument("--screenshot", metavar="FILE", help="when the run ends, save the 3D view as PNG")
    p.add_argument("--window-screenshot", metavar="FILE", help="when the run ends, save the whole window as PNG")
    p.add_argument("--exit-when-done", action="store_true",
                   help="quit when the run ends (exit status 1 if it failed)")
    p.add_argument("--settings", metavar="INI", help="settings file to use instead of the user's")
    p.add_argument("--size", metavar="WxH", default=None, help="window size, e.g. 1600x1000")
    # every engine setting from the SessionConfig metadata; given ones override the saved settings
    from app.config_flags import add_session_flags
    add_session_flags(p, defaults={f: "the saved settings" for f in _SAVED})


def main(args: argparse.Namespace) -> int:
    import logging
    import os

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _crash_tracebacks()
    from engine.memory import bound_heap
    bound_heap()                    # long runs: RSS follows what is held (engine/memory.py)
    from PySide6 import QtCore, QtWidgets

    from app.settings import AppSettings

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv[:1])
    app.setApplicationName("ReconStudio")
    app.setOrganizationName("ReconStudio")
    from ui.main_window import MainWindow
    from ui.style import apply_style
    from ui.window_fit import keep_on_screen, place_first_window

    apply_style(app)
    settings = AppSettings(args.settings)
    win = MainWindow(settings=settings, session_root=args.session_dir)
    from ui.signals import quit_on_signals
    watcher = quit_on_signals(app, win)     # SIGINT / SIGTERM: as `run` does (ui/signals.py)
    from app.config_flags import config_from_args, given_settings
    if given_settings(args):
        try:
            win.settings_panel.set_config(config_from_args(args, win.settings_panel.config()))
        except Exception as exc:       # malformed saved intrinsics etc.: say so, keep the GUI up
            win.show_message(f"Settings from the command line not applied: {exc}")
        if args.engine and win.settings_panel.engine_name() != args.engine:
            win.show_message(f"Engine {args.engine!r} is not available; using {win.settings_panel.engine_name()}")
    if args.input is not None:
        win.set_input(args.input)
    if args.speed is not None:
        win.set_speed(args.speed)
    if args.max_frames is not None:
        win.max_frames.setValue(max(0, args.max_frames))
    if args.loop:
        win.loop.setChecked(True)
    stats_csv = _start_stats_csv(win, args.stats_csv) if args.stats_csv else None
    if args.stop_after:              # a timed soak: the run (started at once) stops, then the app exits
        QtCore.QTimer.singleShot(int(args.stop_after * 1000), win.stop_run)
    if args.size:
        try:
            w, h = (int(v) for v in args.size.lower().split("x"))
            win.resize(w, h)
        except ValueError:
            print(f"--size: expected WxH, got {args.size!r}", file=sys.stderr)
            return 2
    elif not settings.get_bytes("window/geometry"):
        place_first_window(win)          # at most 90 % of the screen (ui/window_fit.py)
    else:
        keep_on_screen(win)              # a geometry saved on a larger screen
    win.show()

    status = {"code": 0}

    def finish(summary=None):
        # let the last batch reach the GL canvas before grabbing it
        for _ in range(5):
            app.processEvents()
        if summary and summary.get("error"):
            status["code"] = 1
        if args.screenshot:
            win.follow.setChecked(False)           # the whole reconstruction, not the chase view
            win.viewer.reset_view()
            for _ in range(3):
                app.processEvents()
            win.save_screenshot(args.screenshot)
        if args.window_screenshot:
            win.grab().save(args.window_screenshot)
        if args.exit_when_done:
            win.close()
            app.quit()

    if args.open_session:
        def open_session():
            if win.open_session_folder(args.open_session) and args.ground_truth:
                win.review.edit_tools.show_ground_truth(args.ground_truth)
        QtCore.QTimer.singleShot(0, open_session)
    if args.autostart:
        win.runFinished.connect(finish)

        def go():
            if not win.start_run():
                status["code"] = 1
                finish({"error": "not started"})
        QtCore.QTimer.singleShot(0, go)
    elif args.exit_when_done or args.screenshot or args.window_screenshot:
        QtCore.QTimer.singleShot(300 if args.open_session else 0, finish)
    code = app.exec()
    watcher.close()
    if stats_csv is not None:
        stats_csv.close()
    if watcher.exit_code:
        # Ended by a signal: the session is closed and the settings saved (ui/signals.py). Leave
        # without Qt's and the interpreter's teardown -- a crash there would turn the documented
        # 130 / 143 into -11 with nothing left to save.
        import logging
        import os
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(watcher.exit_code)
    # No explicit teardown: the bool_dealloc abort at exit came from PySide6 6.12.0's refcount
    # bug (excluded in pyproject.toml; tests/ui/test_ui_refcount.py catches a relapse).
    return status["code"] or int(code)


def _crash_tracebacks() -> None:
    """A hard crash (a segfault in Qt, OpenGL or a driver) prints every thread's Python stack to
    stderr instead of dying silently (a scripted GUI run in CI once exited -11 with no output)."""
    import faulthandler
    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable(all_threads=True)
    except (AttributeError, ValueError, OSError):      # stderr without a file descriptor (captured)
        pass


def _start_stats_csv(win, path: str):
    """A row per second from a thread of its own (engine.stats_csv.StatsRecorder): the run's
    stats and the window's viewer / event-loop figures, read as snapshots (ui/stats_feed.py), so
    a busy GUI thread leaves no hole in the record; a last row with the final counts."""
    from engine.stats_csv import StatsRecorder
    from ui.stats_feed import StatsFeed

    feed = StatsFeed(win)
    out = StatsRecorder(path, feed.snapshot)
    win.runFinished.connect(lambda _summary: out.row_now())     # the final counts
    return out
