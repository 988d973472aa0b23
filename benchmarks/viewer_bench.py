"""GUI benchmarks (figures, not tests):

1. viewer append cost: time to append 10k new points (host mirror write + sub-data upload,
   GL commands flushed) when 100k and when 3M points are already drawn;
2. GUI overhead: throughput of a headless run (source + engine only, and + session store) vs the
   same run in the GUI (worker thread, session store, display conversion, viewer); every variant
   goes through the one run driver (engine.run_driver). `--engine synthetic` drives the GUI with
   dense 518x392 depth per frame, as the neural engine does.

    xvfb-run -a -s "-screen 0 1600x1000x24" python -m benchmarks.viewer_bench [--input VIDEO] [--frames N]
        [--engine geometric|synthetic] [--skip-append]
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

    from ui.viewer import PointCloudViewer, pack_rgb
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


def _config(engine: str):
    from engine import SessionConfig
    return SessionConfig(engine=engine)


def _headless(video: str, frames: int, with_store: bool, engine: str = "geometric") -> float:
    """Frames per wall second of source + engine (+ the session store's bounded background
    writer, like `run`), through the one run driver."""
    from engine import open_session
    from engine.io.sources import open_source
    from engine.io.store import SessionStore
    from engine.run_driver import RunDriver, StoreSink
    src = open_source(video, max_side=960, loop=True)
    sess = open_session(_config(engine))
    with tempfile.TemporaryDirectory() as tmp:
        sinks = [StoreSink(SessionStore(f"{tmp}/s", sess.config, video, background=True, queue_size=4))] \
            if with_store else []
        summary = RunDriver(src, sess, sinks, max_frames=frames, stats_hz=0).run()
    sess.close()
    src.close()
    return summary.frames_in / summary.wall_s


def _worker_only(video: str, frames: int, engine: str = "geometric") -> float:
    """The GUI run's engine thread (decode, push, store writer, display packets) with a consumer
    that acknowledges at once: what the GUI costs the engine side, minus drawing."""
    from PySide6 import QtCore

    from ui.worker import RunOptions, WorkerHandle
    with tempfile.TemporaryDirectory() as tmp:
        h = WorkerHandle(RunOptions(source=video, config=_config(engine), session_root=tmp,
                                    max_frames=frames, loop=True))
        fin = []
        h.worker.finished.connect(fin.append, QtCore.Qt.ConnectionType.DirectConnection)
        h.worker.frameResult.connect(lambda b: h.worker.ack(), QtCore.Qt.ConnectionType.DirectConnection)
        t0 = time.perf_counter()
        h.start()
        while not fin:
            time.sleep(0.005)
        dt = time.perf_counter() - t0
        h.stop_and_wait()
    return frames / dt


def _gui(video: str, frames: int, engine: str = "geometric") -> tuple[float, np.ndarray]:
    """Frames per wall second of the full GUI run, and the GUI event loop's timer gaps (ms)."""
    from PySide6 import QtCore

    from app.settings import AppSettings

    from ui.main_window import MainWindow
    with tempfile.TemporaryDirectory() as tmp:
        w = MainWindow(settings=AppSettings(f"{tmp}/s.ini"), session_root=f"{tmp}/sessions")
        w.resize(1600, 1000)
        w.show()
        cfg = w.settings_panel.config()
        cfg.engine = engine
        w.settings_panel.set_config(cfg)
        w.set_input(video)
        w.loop.setChecked(True)
        w.max_frames.setValue(frames)
        loop = QtCore.QEventLoop()
        w.runFinished.connect(loop.quit)
        ticks = []                               # event-loop responsiveness: a 10 ms timer's gaps
        timer = QtCore.QTimer(interval=10, timeout=lambda: ticks.append(time.perf_counter()))
        t0 = time.perf_counter()
        w.start_run()
        timer.start()
        loop.exec()
        timer.stop()
        dt = time.perf_counter() - t0
        w.close()
    return frames / dt, np.diff(ticks) * 1e3


def bench_overhead(video: str, frames: int, repeats: int, engine: str = "geometric") -> dict:
    """The four runs interleaved `repeats` times (the machine's load drifts); medians."""
    from PySide6 import QtWidgets
    QtWidgets.QApplication.instance() or QtWidgets.QApplication([])
    runs = {"headless": [], "headless+store": [], "worker": [], "gui": []}
    gaps = []
    for _ in range(repeats):
        runs["headless"].append(_headless(video, frames, False, engine))
        runs["headless+store"].append(_headless(video, frames, True, engine))
        runs["worker"].append(_worker_only(video, frames, engine))
        fps, g = _gui(video, frames, engine)
        runs["gui"].append(fps)
        gaps.append(g)
    g = np.concatenate(gaps)
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["all"] = runs
    out["gap_p50_ms"], out["gap_p99_ms"], out["gap_max_ms"] = (float(np.median(g)), float(np.percentile(g, 99)),
                                                               float(g.max()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", default="../shared/data/icl_livingroom_kt3/video.mp4")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-append", action="store_true")
    ap.add_argument("--engine", default="geometric",
                    help="geometric, or synthetic (dense 518x392 depth per frame at the neural engine's rate)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval for the run (seconds; the GUI sets its own)")
    a = ap.parse_args()
    if a.switch_interval:
        import sys
        sys.setswitchinterval(a.switch_interval)
    print(f"machine: {platform.machine()} {platform.processor() or ''}, python {platform.python_version()}")
    if not a.skip_append:
        app_ms = bench_append()
        print(f"append 10k points: {app_ms[100_000]:.2f} ms at 100k drawn, {app_ms[3_000_000]:.2f} ms at 3M drawn "
              f"(ratio {app_ms[3_000_000] / app_ms[100_000]:.2f})")
    if not a.skip_overhead:
        o = bench_overhead(a.input, a.frames, a.repeats, a.engine)
        print(f"overhead, {a.frames} frames, {a.engine} engine, median of {a.repeats} interleaved runs "
              f"(frames per wall second):")
        for k in ("headless", "headless+store", "worker", "gui"):
            print(f"  {k:15s} {o[k]:6.1f}   runs: {', '.join(f'{v:.1f}' for v in o['all'][k])}")
        print(f"  GUI / headless {o['gui'] / o['headless']:.0%}, GUI / headless+store "
              f"{o['gui'] / o['headless+store']:.0%}, worker / headless {o['worker'] / o['headless']:.0%}")
        print(f"GUI event loop during the runs (10 ms timer gaps): p50 {o['gap_p50_ms']:.0f} ms, "
              f"p99 {o['gap_p99_ms']:.0f} ms, max {o['gap_max_ms']:.0f} ms")


if __name__ == "__main__":
    main()
