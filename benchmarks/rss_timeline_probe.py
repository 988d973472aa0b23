"""What makes a GUI run's RSS swing: RSS and glibc's heap sampled at 20 Hz inside a real
`reconstudio gui` run, beside the viewer's events (thinning pass planned / applied, draw, upload
chunks, heap trims). Issue #7, docs/benchmarks_gui.md ("The RSS swing").

    xvfb-run -a -s "-screen 0 1600x1000x24" python benchmarks/rss_timeline_probe.py OUT.tsv -- \
        gui --input video.mp4 --loop --engine synthetic --synthetic-fps 25 --max-frames 1500 \
        --autostart --exit-when-done --size 1600x1000 --session-dir DIR --settings tmp.ini
    python benchmarks/rss_timeline_probe.py --report OUT.tsv [--after 30]

OUT.tsv rows: `t  S  rss_mb  mmapped_mb arena_in_use_mb arena_mb mmapped_blocks` (a sample) or
`t  E  event  detail`. The report prints, per draw and per thinning pass, the RSS before it and
the highest RSS while it ran, and the RSS quantiles of the samples after --after seconds.
Linux/glibc only (mallinfo2). Wraps methods in place: a measuring tool, not for normal runs.
"""
from __future__ import annotations

import bisect
import ctypes
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


def record(out_path: str, gui_argv: list) -> int:
    sys.path.insert(0, str(ROOT))
    t0 = time.perf_counter()
    log: list = []

    def ev(name, detail=""):
        log.append((round(time.perf_counter() - t0, 3), "E", name, detail))

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    page = os.sysconf("SC_PAGE_SIZE")

    def sampler():
        while True:
            rss = int(open("/proc/self/statm").read().split()[1]) * page / 1e6
            m = libc.mallinfo2()
            log.append((round(time.perf_counter() - t0, 3), "S", f"{rss:.1f}",
                        f"{m.hblkhd / 1e6:.1f} {m.uordblks / 1e6:.1f} {m.arena / 1e6:.1f} {m.hblks}"))
            time.sleep(0.05)
    threading.Thread(target=sampler, daemon=True).start()

    import engine.memory as memory
    import engine.scene as scene
    import ui.run_controller as run_controller
    import ui.viewer as viewer

    def wrap(owner, name, tag, detail=None):
        f = getattr(owner, name)

        def g(*a, **k):
            ev(tag + ">", detail(*a) if detail else "")
            try:
                return f(*a, **k)
            finally:
                ev(tag + "<")
        setattr(owner, name, g)
    wrap(scene.SceneModel, "_apply", "apply")
    wrap(scene, "_plan", "plan", lambda *a: len(a[0]))
    wrap(viewer.ViewerCanvas, "on_draw", "draw")
    wrap(viewer.SegmentCloudVisual, "write_rows", "upload", lambda self, off, pos, *r: f"{off} {len(pos)}")
    wrap(memory, "trim_heap", "trim")
    run_controller.trim_heap = memory.trim_heap
    from app.cli import main
    try:
        return main(gui_argv)
    finally:
        with open(out_path, "w") as f:
            for r in list(log):
                f.write("\t".join(str(x) for x in r) + "\n")


def report(path: str, after: float = 30.0) -> None:
    rows = [ln.rstrip("\n").split("\t") for ln in open(path)]
    S = [(float(r[0]), float(r[2])) for r in rows if r[1] == "S"]
    E = [(float(r[0]), r[2], r[3] if len(r) > 3 else "") for r in rows if r[1] == "E"]
    ts = [s[0] for s in S]

    def before(t):
        return S[max(0, bisect.bisect_left(ts, t) - 1)][1]

    def peak(a, b):
        seg = [s[1] for s in S[bisect.bisect_left(ts, a):bisect.bisect_right(ts, b)]]
        return max(seg) if seg else before(a)
    open_at: dict = {}
    uploaded = 0
    for t, name, detail in E:
        if name.endswith(">"):
            open_at[name[:-1]] = (t, detail)
            if name == "draw>":
                uploaded = 0
            if name == "upload>":
                uploaded += int(detail.split()[1])
        elif name[:-1] in open_at and t >= after:
            t1, d = open_at.pop(name[:-1])
            if name in ("draw<", "plan<"):
                what = f"{uploaded:,} rows uploaded" if name == "draw<" else f"{int(d):,} aged rows"
                print(f"{name[:-1]:5s} {t1:7.1f} s  {t - t1:4.1f} s  {what:>24s}  RSS before {before(t1):.0f} MB, "
                      f"peak +{peak(t1, t) - before(t1):.0f} MB")
    late = sorted(s[1] for s in S if s[0] >= after)
    if late:
        q = lambda p: late[min(len(late) - 1, int(round(p * (len(late) - 1))))]
        print(f"RSS after {after:g} s ({len(late)} samples): p10 {q(0.1):.0f}, median {late[len(late) // 2]:.0f}, "
              f"p90 {q(0.9):.0f}, min {late[0]:.0f}, max {late[-1]:.0f} MB")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--report":
        report(sys.argv[2], float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--after" else 30.0)
    elif len(sys.argv) > 3 and sys.argv[2] == "--":
        sys.exit(record(sys.argv[1], sys.argv[3:]))
    else:
        print(__doc__)
        sys.exit(2)
