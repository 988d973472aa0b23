"""Find what blocks the GUI thread (figures, not a test): runs `python -m app <args>` in this
process with a heartbeat timer on the GUI thread and a watchdog thread that samples the GUI
thread's Python stack every 50 ms while the heartbeat is late by more than --threshold. At
the end it prints every stall (start, length) and the stacks most often seen during stalls
(a poor man's py-spy for machines where py-spy is not installed).

    xvfb-run -a -s "-screen 0 1600x1000x24" python -m benchmarks.gui_stall_probe \
        [--threshold 0.2] -- gui --input VIDEO --loop --autostart --stop-after 300 --exit-when-done
"""
from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
import traceback


def _stack(frame, depth: int = 14) -> str:
    items = traceback.extract_stack(frame)[-depth:]
    return " <- ".join(f"{f.filename.rsplit('/', 2)[-2:][-1]}:{f.lineno}:{f.name}" for f in reversed(items))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threshold", type=float, default=0.2, help="a heartbeat later than this (s) is a stall")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("app_args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    args = [x for x in a.app_args if x != "--"]
    from PySide6 import QtCore, QtWidgets
    main_ident = threading.get_ident()
    beat = [time.perf_counter()]
    stalls, samples, done = [], collections.Counter(), threading.Event()

    def watchdog() -> None:
        in_stall, t_start, stacks = False, 0.0, collections.Counter()
        while not done.wait(0.05):
            late = time.perf_counter() - beat[0]
            if late > a.threshold:
                if not in_stall:
                    in_stall, t_start, stacks = True, beat[0], collections.Counter()
                f = sys._current_frames().get(main_ident)
                if f is not None:
                    s = _stack(f)
                    stacks[s] += 1
                    samples[s] += 1
            elif in_stall:
                in_stall = False
                stalls.append((t_start - t0, beat[0] - t_start, stacks.most_common(1)))
    original_exec = QtWidgets.QApplication.exec

    def exec_with_heartbeat(*_):      # QApplication.exec is static in PySide6
        timer = QtCore.QTimer(interval=20)
        timer.timeout.connect(lambda: beat.__setitem__(0, time.perf_counter()))
        timer.start()
        beat[0] = time.perf_counter()
        return original_exec()
    QtWidgets.QApplication.exec = exec_with_heartbeat
    t0 = time.perf_counter()
    threading.Thread(target=watchdog, daemon=True).start()
    from app.cli import main as app_main
    try:
        rc = app_main(args)
    finally:
        done.set()
        wall = time.perf_counter() - t0
        gaps = sorted(s[1] for s in stalls)
        print(f"\n== GUI stalls over {a.threshold:.2f} s in {wall:.0f} s: {len(stalls)}, "
              f"total {sum(gaps):.1f} s, longest {max(gaps, default=0):.2f} s")
        for start, length, top in sorted(stalls, key=lambda s: -s[1])[:a.top]:
            print(f"  at {start:7.1f} s: {length:5.2f} s  {top[0][0][:400] if top else ''}")
        print("== stacks most often sampled during stalls (50 ms samples):")
        for s, n in samples.most_common(a.top):
            print(f"  {n:5d}  {s[:600]}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
