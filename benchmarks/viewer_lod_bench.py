"""Live-view benchmark (figures, not a test): draw rate, points drawn and event-loop gaps of the
3D viewer at 1, 2 and 4 M points while frames keep arriving, then the time to full detail once
the view stands still.

For each size (point budget = size / 0.75, so live frames bring thinning passes at the high-water
mark, as in a long run) the scene is filled with synthetic frames (a wavy terrain seen strip by strip,
20k points a frame, colours from the height), then for --live seconds a timer adds a frame every
100 ms on the GUI thread (as the run's batches arrive) while a background thread does numpy
work (an engine's CPU load, --no-engine-load to drop it) and a 5 ms heartbeat timer records the
event loop's gaps. Then frames stop and the view is left alone: "full detail after" is the time
from the last frame until a draw has shown every point (the refinement chunks added up).
"per draw" is the median of the points each draw drew; "GUI cpu ms/redraw" is the CPU time
the GUI thread spent during the live part per redraw (frames added, uploads, draws, paints: a
figure the machine's load changes little, unlike the rates). `--phases` also prints, per size, how long
the GUI thread's calls took during the live part (frames added, uploads, draws, thinning passes
applied). One command, one table:

    xvfb-run -a -s "-screen 0 1600x1000x24" python -m benchmarks.viewer_lod_bench [--sizes 1,2,4]
        [--live 15] [--target-ms 50] [--phases]
    # a GPU machine without a display (hardware GL through EGL):
    QT_QPA_PLATFORM=offscreen python -m benchmarks.viewer_lod_bench
"""
from __future__ import annotations

import argparse
import os
import platform
import threading
import time
from types import SimpleNamespace

import numpy as np

FRAME_POINTS = 20_000


class PhaseTimer:
    """--phases: time what the GUI thread does per call during the live part (frames added
    with the scene's thinning; uploads before a draw; the whole draw), so a long event-loop gap
    can be told apart. Wraps methods of the classes for the run; `restore` undoes it."""

    def __init__(self):
        from engine.scene import SceneModel
        from ui.viewer import PointCloudViewer, ViewerCanvas
        self.on = False
        self.times: dict = {}
        self._saved = []
        for cls, name, tag in ((PointCloudViewer, "add_frames", "add frames"),
                               (PointCloudViewer, "_sync_data", "uploads before a draw"),
                               (ViewerCanvas, "on_draw", "draw (uploads included)"),
                               (SceneModel, "_apply", "thinning pass applied")):
            self._wrap(cls, name, tag)

    def _wrap(self, cls, name, tag):
        f = getattr(cls, name)
        self._saved.append((cls, name, f))

        def timed(obj, *a, **kw):
            t0 = time.perf_counter()
            try:
                return f(obj, *a, **kw)
            finally:
                if self.on:
                    self.times.setdefault(tag, []).append(1e3 * (time.perf_counter() - t0))
        setattr(cls, name, timed)

    def restore(self):
        for cls, name, f in self._saved:
            setattr(cls, name, f)

    def report(self, size: int) -> None:
        for tag, t in self.times.items():
            a = np.asarray(t)
            print(f"    {size / 1e6:.1f} M, {tag}: {len(a)} calls, p50 {np.median(a):.1f} ms, "
                  f"p99 {np.percentile(a, 99):.1f} ms, max {a.max():.1f} ms", flush=True)
        self.times = {}


def _terrain_frame(i: int, rng) -> SimpleNamespace:
    u = rng.random((FRAME_POINTS, 2))
    x = 0.02 * i + 0.6 * u[:, 0]
    z = 4.0 * u[:, 1]
    y = 0.3 * np.sin(3 * x) * np.cos(2 * z)
    pts = np.stack([x, y, z], 1).astype(np.float32)
    h = ((y + 0.3) / 0.6 * 255).clip(0, 255).astype(np.uint8)
    colors = np.stack([h, 255 - h, np.full_like(h, 120)], 1)
    c2w = np.eye(4)
    c2w[:3, 3] = (x.mean(), -1.0, -1.0)
    fr = np.zeros((5, 3), np.float32)
    fr[:, :] = c2w[:3, 3]
    return SimpleNamespace(index=i, segment=0, is_keyframe=i % 5 == 0, points=pts, colors=colors,
                           conf=np.ones(FRAME_POINTS, np.float32), depth=np.full(FRAME_POINTS, 2.0, np.float32),
                           c2w=c2w, frustum=fr, width=640, look_at=pts.mean(0), median_depth=2.0)


def _engine_load(stop: threading.Event) -> None:
    """One core's worth of numpy work (element-wise: releases the GIL, no BLAS threads)."""
    a = np.random.default_rng(0).random(1 << 20)
    while not stop.is_set():
        np.sqrt(a, out=a)
        a += 1.0


def _thread_cpu() -> float:
    """CPU seconds of the calling (GUI) thread: what a redraw cycle costs it, whatever share of
    the cores the machine's load leaves it (llvmpipe rasterises on this thread, LP_NUM_THREADS=0)."""
    try:
        import resource
        r = resource.getrusage(resource.RUSAGE_THREAD)
        return r.ru_utime + r.ru_stime
    except (ImportError, AttributeError, ValueError):
        return time.thread_time()


def run_size(app, n_points: int, live_s: float, target_ms: float, still_max_s: float, phases=None,
             feed_ms: int = 100) -> dict:
    from PySide6 import QtCore

    from ui.viewer import PointCloudViewer
    rng = np.random.default_rng(0)
    # budget over the size so the fill reaches it; live frames then push it into thinning passes
    v = PointCloudViewer(capacity=1 << 20, point_budget=int(n_points / 0.75))
    v.frame_time_target_ms = target_ms
    v.resize(1280, 800)
    v.show()
    app.processEvents()
    i = 0
    while v.point_count < n_points:                 # fill (not measured)
        v.add_frames([_terrain_frame(i, rng)])
        i += 1
        if i % 25 == 0:
            v.canvas.render()                       # uploads in pieces, measures the cost per point
    v.scene.wait()
    v.canvas.render()
    app.processEvents()
    gaps, last = [], [time.perf_counter()]

    def beat():
        t = time.perf_counter()
        gaps.append(t - last[0])
        last[0] = t
    hb = QtCore.QTimer(interval=5)
    hb.timeout.connect(beat)
    drawn = []
    v.canvas.events.draw.connect(lambda e: drawn.append(v.paint_points), position="last")

    added = [0]

    def add():
        nonlocal i
        v.add_frames([_terrain_frame(i, rng)])
        i += 1
        added[0] += 1
    feed = QtCore.QTimer(interval=int(feed_ms))
    feed.timeout.connect(add)
    d0 = v.canvas.draws
    cpu0 = _thread_cpu()
    last[0] = time.perf_counter()
    if phases is not None:
        phases.on = True
    hb.start()
    feed.start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < live_s:
        app.processEvents(QtCore.QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.001)
    feed.stop()
    if phases is not None:
        phases.on = False
    live_wall = time.perf_counter() - t0
    live_cpu = _thread_cpu() - cpu0
    live_draws = v.canvas.draws - d0
    live_gaps = np.asarray(gaps + [time.perf_counter() - last[0]]) * 1e3   # the gap still open counts
    live_drawn = list(drawn)
    t_still = time.perf_counter()
    full_after = refine_from = None
    chunks0, unseen0 = v.refine_chunks, v.unshown_chunks
    while time.perf_counter() - t_still < still_max_s:
        app.processEvents(QtCore.QEventLoop.ProcessEventsFlag.AllEvents, 50)
        if refine_from is None and v.refine_chunks > chunks0:
            refine_from = time.perf_counter() - t_still
        if v.drawn_points == v.point_count and v.canvas.draws > d0 + live_draws:
            full_after = time.perf_counter() - t_still
            break
        time.sleep(0.001)
    still_gaps = np.asarray(gaps[len(live_gaps) - 1:]) * 1e3
    hb.stop()
    out = dict(points=v.point_count, draws_per_s=live_draws / live_wall, frames_per_s=added[0] / live_wall,
               cpu_per_draw=1e3 * live_cpu / max(1, live_draws),
               drawn_median=float(np.median(live_drawn)) if live_drawn else 0.0,
               gap_p50=float(np.percentile(live_gaps, 50)), gap_p99=float(np.percentile(live_gaps, 99)),
               gap_max=float(live_gaps.max()), cost_ns=1e6 * (v.cost_per_point_ms or 0.0),
               full_after=full_after, still_gap_max=float(still_gaps.max()) if len(still_gaps) else 0.0,
               refine_from=refine_from, chunks=v.refine_chunks - chunks0, unseen=v.unshown_chunks - unseen0)
    v.close()
    v.deleteLater()
    app.processEvents()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="live 3D view: draw rate, points drawn, event-loop gaps")
    ap.add_argument("--sizes", default="1,2,4", help="scene sizes in millions of points")
    ap.add_argument("--live", type=float, default=15.0, help="seconds of live frames per size")
    ap.add_argument("--target-ms", type=float, default=50.0, help="the viewer's frame-time target")
    ap.add_argument("--still-max", type=float, default=20.0, help="give up waiting for full detail after this")
    ap.add_argument("--no-engine-load", action="store_true", help="no background numpy thread")
    ap.add_argument("--phases", action="store_true", help="also time the GUI thread's calls by phase (live part)")
    ap.add_argument("--feed-ms", type=int, default=100,
                    help="a frame arrives every this many ms (the app's worker sends batches at display_hz, 30 Hz: 33)")
    a = ap.parse_args(argv)
    from PySide6 import QtWidgets
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    stop = threading.Event()
    if not a.no_engine_load:
        threading.Thread(target=_engine_load, args=(stop,), daemon=True).start()
    renderer, empty = "?", ""
    try:
        from vispy import gloo

        from ui.viewer import PointCloudViewer
        v = PointCloudViewer()
        v.show()
        app.processEvents()
        v.canvas.set_current()
        renderer = gloo.gl.glGetParameter(gloo.gl.GL_RENDERER)
        v.resize(1280, 800)
        app.processEvents()
        paints = []
        for _ in range(10):                   # a paint's fixed cost: nothing to draw
            t0 = time.perf_counter()
            v.canvas.native.repaint()
            app.processEvents()
            paints.append(1e3 * (time.perf_counter() - t0))
        empty = f"; an empty paint {np.median(paints):.0f} ms (our draw {v.canvas.draw_ms:.0f} ms)"
        v.close()
    except Exception as e:  # the figures stand without the renderer's name
        renderer = f"unknown ({e})"
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; "
          f"GL renderer: {renderer}; QT_QPA_PLATFORM={os.environ.get('QT_QPA_PLATFORM', '')}; "
          f"LP_NUM_THREADS={os.environ.get('LP_NUM_THREADS', '')}{empty}")
    print(f"frame-time target {a.target_ms:g} ms, frames of {FRAME_POINTS:,} points every {a.feed_ms} ms for "
          f"{a.live:g} s, engine load thread {'off' if a.no_engine_load else 'on'}, window 1280x800")
    print(f"{'points':>10} {'redraws/s':>9} {'per draw (med.)':>15} {'ns/point':>9} {'gap p50 ms':>10} "
          f"{'gap p99 ms':>10} {'gap max ms':>10} {'full detail after s':>19} {'max gap still ms':>16} "
          f"{'frames/s':>10} {'GUI cpu ms/redraw':>17}",
          flush=True)
    for s in a.sizes.split(","):
        phases = PhaseTimer() if a.phases else None
        r = run_size(app, int(float(s) * 1e6), a.live, a.target_ms, a.still_max, phases, a.feed_ms)
        fa = f"{r['full_after']:.2f}" if r["full_after"] is not None else f"> {a.still_max:g}"
        print(f"{r['points']:>10,} {r['draws_per_s']:>9.1f} {r['drawn_median']:>15,.0f} {r['cost_ns']:>9.0f} "
              f"{r['gap_p50']:>10.0f} {r['gap_p99']:>10.0f} {r['gap_max']:>10.0f} {fa:>19} "
              f"{r['still_gap_max']:>16.0f} {r['frames_per_s']:>10.1f} {r['cpu_per_draw']:>17.1f}", flush=True)
        if phases is not None:
            phases.restore()
            phases.report(r["points"])
            rf = f"{r['refine_from']:.2f} s" if r["refine_from"] is not None else "never"
            print(f"    {r['points'] / 1e6:.1f} M, still: first refinement chunk after {rf}, {r['chunks']} chunks "
                  f"({r['unseen']} drawn unseen)", flush=True)
    stop.set()
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
