"""Host memory held by the 3D view's OpenGL driver per point drawn (issue #7, docs/benchmarks_gui.md).

    xvfb-run -a -s "-screen 0 1600x1000x24" python benchmarks/gl_memory_probe.py --points 2000000 \
        [--lp-threads N] [--redraws 10]

A bare `PointCloudViewer` (1600x1000) is fed frames of 50k random points until --points are
drawn (a redraw after every frame, as a run does), then the same cloud is redrawn --redraws
times. Prints process RSS and glibc's live mmapped blocks (mallinfo2; `engine.memory.bound_heap`
makes every block of 32 KiB or more one) at each million points and after the redraws.
--lp-threads sets Mesa llvmpipe's LP_NUM_THREADS before the first GL context (default: what
ui.viewer sets, 0). Linux/glibc only.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=2_000_000)
    ap.add_argument("--redraws", type=int, default=10)
    ap.add_argument("--lp-threads", default=None, help="LP_NUM_THREADS for llvmpipe (default: ui.viewer's)")
    a = ap.parse_args()
    if a.lp_threads is not None:
        os.environ["LP_NUM_THREADS"] = str(a.lp_threads)
    import numpy as np
    from PySide6 import QtWidgets
    from vispy.gloo import gl

    from engine.memory import bound_heap, trim_heap
    bound_heap()
    from ui.viewer import PointCloudViewer
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2

    def report(tag: str) -> None:
        trim_heap()
        m = libc.mallinfo2()
        rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20
        print(f"{tag}: RSS {rss} MB, mmapped blocks {m.hblks} ({m.hblkhd >> 20} MB), "
              f"arena in use {m.uordblks >> 20} MB", flush=True)

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    v = PointCloudViewer(point_budget=max(a.points, 100_000))
    v.resize(1600, 1000)
    v.show()
    for _ in range(20):
        app.processEvents()
    v.canvas.set_current()
    print(f"renderer: {gl.glGetParameter(gl.GL_RENDERER)}, LP_NUM_THREADS={os.environ.get('LP_NUM_THREADS')}")
    report("empty view")
    rng = np.random.default_rng(0)
    per, n, i = 50_000, 0, 0
    while n < a.points:
        u = rng.random((per, 3)).astype(np.float32)
        v.add_frames([SimpleNamespace(
            index=i, segment=0, is_keyframe=i % 5 == 0, points=u * [4, 3, 1] + [0, 0, 3],
            colors=rng.integers(0, 255, (per, 3), dtype=np.uint8), conf=rng.random(per).astype(np.float32),
            depth=np.full(per, 3.0, np.float32), c2w=np.eye(4), frustum=np.zeros((5, 3), np.float32),
            look_at=np.array([2, 1.5, 3.5], np.float32), median_depth=3.0, width=640)])
        v.canvas.native.repaint()
        app.processEvents()
        n, i = n + per, i + 1
        if n % 1_000_000 == 0:
            v.scene.wait()
            report(f"{n / 1e6:g} M points drawn ({v.canvas.draws} draws)")
    times = []
    for _ in range(a.redraws):
        t0 = time.perf_counter()
        v.canvas.native.repaint()
        app.processEvents()
        times.append(1e3 * (time.perf_counter() - t0))
    report(f"after {a.redraws} more redraws of the same {v.scene.count / 1e6:.2f} M points "
           f"(median {np.median(times):.0f} ms each)")


if __name__ == "__main__":
    main()
