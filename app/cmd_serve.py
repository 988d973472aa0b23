"""`reconstudio serve SESSION|--live`: a browser view (viser) of a saved session or of a run still
writing its session, for a headless GPU machine watched from a laptop (engine/share.py).

    reconstudio serve ~/.local/share/reconstudio/sessions/20261203-101500_clip    # review
    reconstudio serve --live                  # the newest session, following it as it grows
    reconstudio serve SESSION --live --host 0.0.0.0 --port 8080

Open http://HOST:PORT in a browser (or forward the port over SSH: `ssh -L 8080:localhost:8080`).
Ctrl-C or SIGTERM stops it. Module level imports nothing heavy.
"""
from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", nargs="?", metavar="SESSION",
                   help="session folder (default with --live: the newest one in the sessions folder)")
    p.add_argument("--live", action="store_true", help="keep adding the frames the run stores (every second)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default %(default)s: this machine only; 0.0.0.0 lets other "
                        "machines connect -- or use an SSH tunnel)")
    p.add_argument("--port", type=int, default=8080, help="port (default %(default)s)")
    p.add_argument("--stride", type=int, default=4, metavar="N", help="every N-th pixel of each depth map (default 4)")
    p.add_argument("--conf-threshold", type=float, default=0.0, metavar="X",
                   help="points at least this confident, in the engine's absolute units (default 0)")
    p.add_argument("--max-points-per-frame", type=int, default=20_000, metavar="N",
                   help="thin each frame's points to at most N (default %(default)s)")
    p.add_argument("--poll", type=float, default=1.0, metavar="S", help=argparse.SUPPRESS)
    p.add_argument("--run-for", type=float, default=None, metavar="S", help=argparse.SUPPRESS)   # tests


def main(args) -> int:
    import signal
    import time

    from engine.api import EngineError, missing_dependency
    try:
        import viser
    except ImportError as exc:
        if missing_dependency(exc) is None:
            raise
        print("reconstudio serve: needs viser (pip install 'reconstudio[share]' or pip install viser)",
              file=sys.stderr)
        return 2
    from engine.share import SessionView, newest_session

    folder = args.session
    if folder is None:
        if not args.live:
            print("reconstudio serve: give a SESSION folder, or --live for the newest session", file=sys.stderr)
            return 2
        folder = newest_session()
        if folder is None:
            print("reconstudio serve: no session in the sessions folder yet; start `reconstudio run` first",
                  file=sys.stderr)
            return 2
    if args.stride < 1 or args.max_points_per_frame < 1:
        print("reconstudio serve: --stride and --max-points-per-frame must be at least 1", file=sys.stderr)
        return 2
    try:
        server = viser.ViserServer(host=args.host, port=args.port, verbose=False)
    except OSError as exc:
        print(f"reconstudio serve: cannot listen on {args.host}:{args.port} ({exc.strerror or exc})", file=sys.stderr)
        return 2
    view = None
    stop = {"now": False}

    def handler(signum, frame):
        stop["now"] = True
    import threading
    main_thread = threading.current_thread() is threading.main_thread()     # (signals: main thread only)
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    try:
        view = SessionView(server, folder, stride=args.stride, conf_threshold=args.conf_threshold,
                           max_points_per_frame=args.max_points_per_frame)
        n = view.update()
        for p in view.problems:
            print(f"warning: {p}", file=sys.stderr)
        print(f"serving {view.folder} ({n} frames) at http://{args.host}:{server.get_port()}"
              + (" -- following the run" if args.live else "") + "; Ctrl-C stops", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        next_poll, seen = 0.0, len(view.problems)
        while not stop["now"] and (args.run_for is None or time.monotonic() - t0 < args.run_for):
            time.sleep(0.2)
            if args.live and time.monotonic() >= next_poll:
                t = time.monotonic()
                view.update()
                # a long session takes a while to rescan: never spend more than half the time on it
                next_poll = time.monotonic() + max(args.poll, 2.0 * (time.monotonic() - t))
                for p in view.problems[seen:]:
                    print(f"warning: {p}", file=sys.stderr)
                seen = len(view.problems)
    except EngineError as exc:
        print(f"reconstudio serve: {exc}", file=sys.stderr)
        return 2
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if view is not None:
            view.close()
        server.stop()
    return 0
