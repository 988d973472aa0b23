"""GUI benchmarks (figures, not tests):

1. viewer append cost: time to append 10k new points (host mirror write + sub-data upload,
   GL commands flushed) when 100k and when 3M points are already drawn;
2. GUI overhead: throughput of a headless run (source + engine only) vs the same run in the GUI
   (worker thread, session store, display conversion, viewer).

    xvfb-run -a -s "-screen 0 1600x1000x24" python -m ui.bench_viewer [--input VIDEO] [--frames N]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time

import numpy as np


def bench_append(repeats: int = 30) -> dict:
    from PySide6 import QtWidgets
    from vispy import gloo

    from .viewer import PointCloudViewer, pack_rgb
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    v = PointCloudViewer(capacity=1 << 22)          # 4M: no regrowth inside the measurement
    v.resize(640, 480)
    v.show()
    app.processEvents()
    v.canvas.render()                               # make the context and the buffers real
    rng = np.random.default_rng(0)
    n = 10_000
    pts = rng.normal(size=(n, 3)).astype(np.float32)
    col = pack_rgb(rng.integers(0, 255, (n, 3), dtype=np.uint8))
    conf = np.ones(n, np.float32)
    depth = np.ones(n, np.float32)
    out = {}
    for target in (100_000, 3_000_000):
        while v.cloud.count < target:
            k = min(200_000, target - v.cloud.count)
            v.cloud.append(np.resize(pts, (k, 3)), np.resize(col, k), np.ones(k, np.float32), np.ones(k, np.float32), 0)
        v.canvas.set_current()
        v.canvas.context.flush_commands()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            v.cloud.append(pts, col, conf, depth, 0)
            v.canvas.context.flush_commands()       # executes the glBufferSubData calls
            gloo.gl.glFinish()
            times.append(time.perf_counter() - t0)
        out[target] = statistics.median(times) * 1e3
        v.cloud.count = target                      # drop the repeats again
    v.close()
    return out


def bench_overhead(video: str, frames: int) -> dict:
    from PySide6 import QtWidgets

    from engine import SessionConfig, open_session
    from engine.io.sources import open_source
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication([])

    # headless: the same decode + engine the worker does, nothing else
    src = open_source(video, max_side=960)
    sess = open_session(SessionConfig(engine="geometric"))
    t0 = time.perf_counter()
    n_in = n_out = 0
    while n_in < frames:
        f = src.read()
        if f is None:
            break
        n_out += len(sess.push(f.image, f.timestamp))
        n_in += 1
    n_out += len(sess.flush())
    headless_s = time.perf_counter() - t0
    headless_fps = sess.stats().get("fps")
    sess.close()
    src.close()

    # worker only: the GUI run's engine thread (decode, push, store, display packets) with a
    # consumer that acknowledges at once — what the GUI costs the engine side, minus drawing
    from PySide6 import QtCore

    from .worker import RunOptions, WorkerHandle
    with tempfile.TemporaryDirectory() as tmp:
        h = WorkerHandle(RunOptions(source=video, config=SessionConfig(engine="geometric"), session_root=tmp,
                                    max_frames=frames))
        fin = []
        h.worker.finished.connect(fin.append, QtCore.Qt.ConnectionType.DirectConnection)
        h.worker.frameResult.connect(lambda b: h.worker.ack(), QtCore.Qt.ConnectionType.DirectConnection)
        t0 = time.perf_counter()
        h.start()
        while not fin:
            time.sleep(0.005)
        worker_s = time.perf_counter() - t0
        h.stop_and_wait()

    from app.settings import AppSettings

    from .main_window import MainWindow
    with tempfile.TemporaryDirectory() as tmp:
        w = MainWindow(settings=AppSettings(f"{tmp}/s.ini"), session_root=f"{tmp}/sessions")
        w.resize(1600, 1000)
        w.show()
        cfg = w.settings_panel.config()
        cfg.engine = "geometric"
        w.settings_panel.set_config(cfg)
        w.set_input(video)
        w.max_frames.setValue(frames)
        done = []
        w.runFinished.connect(done.append)
        t0 = time.perf_counter()
        w.start_run()
        while not done:
            app.processEvents()
            time.sleep(0.002)
        gui_s = time.perf_counter() - t0
        gui_fps = w.last_stats.get("fps")
        res = done[0]["results"]
        w.close()
    return {"frames": n_in, "headless_results": n_out, "gui_results": res,
            "headless_wall_fps": n_in / headless_s, "gui_wall_fps": frames / gui_s,
            "worker_wall_fps": frames / worker_s,
            "headless_engine_fps": headless_fps, "gui_engine_fps": gui_fps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", default="../shared/data/icl_livingroom_kt3/video.mp4")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--skip-overhead", action="store_true")
    a = ap.parse_args()
    print(f"machine: {platform.machine()} {platform.processor() or ''}, python {platform.python_version()}")
    app_ms = bench_append()
    print(f"append 10k points: {app_ms[100_000]:.2f} ms at 100k drawn, {app_ms[3_000_000]:.2f} ms at 3M drawn "
          f"(ratio {app_ms[3_000_000] / app_ms[100_000]:.2f})")
    if not a.skip_overhead:
        o = bench_overhead(a.input, a.frames)
        print(f"overhead ({o['frames']} frames, geometric engine): headless {o['headless_wall_fps']:.1f} fps wall "
              f"/ engine {o['headless_engine_fps']:.1f} fps; worker thread only {o['worker_wall_fps']:.1f} fps wall "
              f"({o['worker_wall_fps'] / o['headless_wall_fps']:.0%}); GUI {o['gui_wall_fps']:.1f} fps wall / engine "
              f"{o['gui_engine_fps']:.1f} fps; wall ratio {o['gui_wall_fps'] / o['headless_wall_fps']:.0%}; "
              f"results {o['headless_results']} vs {o['gui_results']}")


if __name__ == "__main__":
    main()
